"""The content-key format: the keys the server derives, rederived here.

Key derivation (docs/KEYS_AND_PREPROCESSING.md, version 2) is reimplemented
with hashlib rather than bound from C++ (include/epd/media/content_key.h), so the
client needs only python3-grpcio and python3-protobuf: SHA-256 over fields
written as ``tag (1 byte) || length (uint64 LE) || value``, in this order:

  0x00 domain   b"epd/key/encoded" (b"epd/key/caller" for caller keys,
                b"epd/key/video" for videos)
  0x01 version  uint32 LE, 2 (KEY_VERSION)
  0x02 model id UTF-8 bytes
  0x10..0x14    patch_size, merge_size, temporal_patch_size, min_pixels,
                max_pixels, int64 LE each
  0x15, 0x16    mean, std: 3 x float32 LE (IEEE-754 bit patterns)
  0x17          resample, int64 LE
  0x18          apply_exif_orientation, int64 LE (0 or 1)
  0x19          alpha policy, 4 bytes: composite (0 or 1), background R, G, B
                (all 0 when composite is 0)
  0x30          the encoded image bytes (0x32: the caller key; a video:
                0x40..0x48 its sampling, then 0x33 the container or 0x34 per
                frame)

The model id and preprocessing come from the server's Health answer. Only
SHA-256 keys are derived here; a server in xxh3-fast mode is routed by the
SHA-256 key of the same fields, which is still consistent per image.

Every function here is pure and thread-safe; each key is 32 bytes.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Optional, Sequence, Union

KEY_VERSION = 2


@dataclass(frozen=True)
class PreprocessConfig:
    """The preprocessing fields hashed into a key (epd::PreprocessConfig)."""

    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    min_pixels: int = 3136
    max_pixels: int = 1003520
    mean: Sequence[float] = (0.48145466, 0.4578275, 0.40821073)
    std: Sequence[float] = (0.26862954, 0.26130258, 0.27577711)
    resample: int = 0
    # epd::DecodeOptions: EXIF orientation applied; RGBA composited onto
    # rgba_background, or alpha dropped when rgba_composite is False.
    apply_exif_orientation: bool = True
    rgba_composite: bool = True
    rgba_background: Sequence[int] = (255, 255, 255)


@dataclass
class VideoSampling:
    """epd::VideoSampling (qwen-vl-utils' defaults for patch 14). In a request,
    a field set to 0 / None takes the server's default (its --video-* flags)."""

    fps: float = 2.0
    nframes: Optional[int] = None
    min_frames: int = 4
    max_frames: int = 768
    min_pixels: int = 128 * 28 * 28
    max_pixels: int = 768 * 28 * 28
    total_pixels: int = 90316800
    resized_height: Optional[int] = None
    resized_width: Optional[int] = None


def _field(tag: int, value: bytes) -> bytes:
    return bytes([tag]) + struct.pack("<Q", len(value)) + value


def _key_prefix(domain: bytes, model_id: str, cfg: PreprocessConfig) -> bytes:
    parts = [
        _field(0x00, domain),
        _field(0x01, struct.pack("<I", KEY_VERSION)),
        _field(0x02, model_id.encode("utf-8")),
        _field(0x10, struct.pack("<q", cfg.patch_size)),
        _field(0x11, struct.pack("<q", cfg.merge_size)),
        _field(0x12, struct.pack("<q", cfg.temporal_patch_size)),
        _field(0x13, struct.pack("<q", cfg.min_pixels)),
        _field(0x14, struct.pack("<q", cfg.max_pixels)),
        # "<3f" rounds each Python float to float32, as the C++ config holds them.
        _field(0x15, struct.pack("<3f", *cfg.mean)),
        _field(0x16, struct.pack("<3f", *cfg.std)),
        _field(0x17, struct.pack("<q", cfg.resample)),
        _field(0x18, struct.pack("<q", 1 if cfg.apply_exif_orientation else 0)),
        _field(0x19, bytes([1, *cfg.rgba_background]) if cfg.rgba_composite else bytes(4)),
    ]
    return b"".join(parts)


def content_key(model_id: str, cfg: PreprocessConfig, image: bytes) -> bytes:
    """epd::ComputeContentKey (SHA-256 mode): the 32-byte key of encoded media."""
    h = hashlib.sha256(_key_prefix(b"epd/key/encoded", model_id, cfg))
    h.update(_field(0x30, bytes(image)))
    return h.digest()


def caller_content_key(model_id: str, cfg: PreprocessConfig, caller_key: Union[str, bytes]) -> bytes:
    """epd::CallerContentKey: the key for a caller-supplied identifier.
    Raises ValueError for an empty caller key."""
    if isinstance(caller_key, str):
        caller_key = caller_key.encode("utf-8")
    if not caller_key:
        raise ValueError("caller key is empty")
    h = hashlib.sha256(_key_prefix(b"epd/key/caller", model_id, cfg))
    h.update(_field(0x32, caller_key))
    return h.digest()


def video_key(model_id: str, cfg: PreprocessConfig, sampling: VideoSampling, video: bytes = b"",
              frames: Sequence[bytes] = ()) -> bytes:
    """epd::ComputeVideoKey (SHA-256 mode): the key of a whole video, over the
    container bytes (or the frame images, in order) and the sampling."""
    s = sampling
    h = hashlib.sha256(_key_prefix(b"epd/key/video", model_id, cfg))
    ints = [(0x41, -1 if s.nframes is None else s.nframes), (0x42, s.min_frames), (0x43, s.max_frames),
            (0x44, s.min_pixels), (0x45, s.max_pixels), (0x46, s.total_pixels),
            (0x47, -1 if s.resized_height is None else s.resized_height),
            (0x48, -1 if s.resized_width is None else s.resized_width)]
    h.update(_field(0x40, struct.pack("<d", s.fps)))  # the double's bits, as the int64 the C++ writes
    for tag, v in ints:
        h.update(_field(tag, struct.pack("<q", v)))
    if video:
        h.update(_field(0x33, bytes(video)))
    else:
        for f in frames:
            h.update(_field(0x34, bytes(f)))
    return h.digest()

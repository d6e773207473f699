"""Conversion between the client's Python types and epd.v1 messages.

Item (one input) and ``_as_item`` (what encode() accepts), the EncodeRequest
and ReleaseRequest builders, ``_from_proto`` (an EncodedItem as an
ItemResult, inline rows), the Health and Stats answers as ServerInfo and a
dict, and ``unary``, which turns a failed unary call into EncodeError. The
enum tables map proto/epd/v1/encoder.proto's values to the client's names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple, Union

import grpc

from epd.client._keys import PreprocessConfig, VideoSampling
from epd.client._results import EncodeError, ItemResult, ProbeResult, ServerInfo
from epd.v1 import encoder_pb2

_SOURCES = {
    encoder_pb2.SOURCE_L1: "l1",
    encoder_pb2.SOURCE_L2: "l2",
    encoder_pb2.SOURCE_MISS: "miss",
    encoder_pb2.SOURCE_JOINED: "joined",
    encoder_pb2.SOURCE_L3: "l3",
}
_DTYPES = {
    encoder_pb2.DTYPE_FLOAT32: "float32",
    encoder_pb2.DTYPE_BFLOAT16: "bfloat16",
    encoder_pb2.DTYPE_FLOAT16: "float16",
}
# EncodedItem.error_code (a grpc status code number) -> grpc.StatusCode.
_CODES = {c.value[0]: c for c in grpc.StatusCode}


@dataclass
class Item:
    """One image to encode: bytes, or a caller key (+ bytes for a miss)."""

    image: bytes = b""
    caller_key: Optional[Union[str, bytes]] = None
    expected_tokens: int = 0
    # A video instead of an image (docs/VIDEO.md): container bytes (MP4,
    # WebM, ...) or its frames as encoded images; sampling None = the
    # server's defaults.
    video: bytes = b""
    video_frames: Sequence[bytes] = ()
    sampling: Optional[VideoSampling] = None
    # Opt-in sharing across tenants (docs/SECURITY.md): keyed in the shared
    # "public" namespace when the server lists this tenant in
    # --public-readers; ignored otherwise.
    public: bool = False

    @property
    def is_video(self) -> bool:
        return bool(self.video) or bool(self.video_frames)


def _as_item(item, index: int) -> Item:
    """An encode() input as an Item; TypeError for what is not an image."""
    if isinstance(item, Item):
        if not isinstance(item.image, (bytes, bytearray, memoryview)):
            raise TypeError(f"item {index}: Item.image must be bytes-like, got {type(item.image).__name__}")
        return item
    if isinstance(item, (bytes, bytearray, memoryview)):
        return Item(image=bytes(item))
    raise TypeError(f"item {index}: expected the encoded image as bytes-like (bytes, bytearray, memoryview) "
                    f"or an Item, got {type(item).__name__}")


def _set_sampling(m, s: VideoSampling) -> None:
    """EncodeItem.sampling from ``s``; None fields go as 0 (server default)."""
    m.fps = s.fps
    m.nframes = s.nframes or 0
    m.min_frames = s.min_frames
    m.max_frames = s.max_frames
    m.min_pixels = s.min_pixels
    m.max_pixels = s.max_pixels
    m.total_pixels = s.total_pixels
    m.resized_height = s.resized_height or 0
    m.resized_width = s.resized_width or 0
    m.rotation = encoder_pb2.VIDEO_ROTATION_ON if s.apply_rotation else encoder_pb2.VIDEO_ROTATION_OFF


def encode_request(rid: str, items: Sequence[Item], use_shm: bool, use_ipc: bool) -> encoder_pb2.EncodeRequest:
    """One Encode call's request: ``items`` in order, delivery by shared
    memory and/or CUDA IPC (CUDA IPC falling back to shared memory when both)."""
    req = encoder_pb2.EncodeRequest(id=rid)
    if use_shm:
        req.delivery = encoder_pb2.DELIVERY_SHM
    if use_ipc:
        req.delivery = encoder_pb2.DELIVERY_CUDA_IPC
        req.ipc_fallback_shm = use_shm
    for it in items:
        m = req.items.add()
        m.image = bytes(it.image)
        if it.caller_key is not None:
            m.caller_key = it.caller_key.encode("utf-8") if isinstance(it.caller_key, str) else it.caller_key
        m.expected_tokens = it.expected_tokens
        m.public = bool(it.public)
        if it.video:
            m.video = bytes(it.video)
        for f in it.video_frames:
            m.video_frames.frames.append(bytes(f))
        if it.sampling is not None:
            _set_sampling(m.sampling, it.sampling)
    return req


def release_request(spans: List[Tuple[int, ...]]) -> encoder_pb2.ReleaseRequest:
    """(offset, generation) or (offset, generation, kind) per lease; kind
    defaults to LEASE_KIND_SHM."""
    req = encoder_pb2.ReleaseRequest()
    for span in spans:
        offset, generation = span[0], span[1]
        kind = span[2] if len(span) > 2 else encoder_pb2.LEASE_KIND_SHM
        req.leases.add(offset=offset, generation=generation, kind=kind)
    return req


def _from_proto(m, index: int) -> ItemResult:
    """EncodedItem ``m`` as the result of request item ``index``, rows inline
    (as bytes). An item error, or a grid_thw that is not 3 positive values
    (INTERNAL), makes a failed result."""
    common = dict(index=index, key=m.key, source=_SOURCES.get(m.source, "miss"), queue_ms=m.queue_ms,
                  tower_ms=m.tower_ms, total_ms=m.total_ms, server_id=m.server_id)
    if m.error_code != 0:
        return ItemResult(ok=False, code=_CODES.get(m.error_code, grpc.StatusCode.UNKNOWN),
                          message=f"item {index}: {m.error_message}", **common)
    grid = tuple(m.grid_thw)
    if grid and (len(grid) != 3 or min(grid) <= 0):
        return ItemResult(ok=False, code=grpc.StatusCode.INTERNAL,
                          message=f"server sent item {index} with grid_thw {list(grid)}; expected 3 positive values",
                          **common)
    return ItemResult(ok=True, tokens=m.tokens, hidden=m.hidden, deepstack_layers=m.deepstack_layers,
                      dtype=_DTYPES.get(m.dtype, "unknown"), main=m.main, deepstack=m.deepstack,
                      grid_thw=grid or None, timestamps_s=list(m.timestamps_s) or None,
                      sample_fps=m.sample_fps, seconds_per_grid_t=m.seconds_per_grid_t, **common)


def probe_from_proto(m, index: int) -> ProbeResult:
    """ProbedItem ``m`` as request item ``index``'s ProbeResult; an item
    error, or a grid_thw that is not empty or 3 positive values (INTERNAL),
    makes a failed one."""
    if m.error_code != 0:
        return ProbeResult(index=index, ok=False, code=_CODES.get(m.error_code, grpc.StatusCode.UNKNOWN),
                           message=f"item {index}: {m.error_message}")
    grid = tuple(m.grid_thw)
    if grid and (len(grid) != 3 or min(grid) <= 0):
        return ProbeResult(index=index, ok=False, code=grpc.StatusCode.INTERNAL,
                           message=f"server sent probed item {index} with grid_thw {list(grid)}")
    return ProbeResult(index=index, ok=True, key=m.key, route_key=m.route_key, grid_thw=grid or None,
                       tokens=m.tokens)


def server_info(r) -> ServerInfo:
    """A HealthResponse as ServerInfo (an unknown dtype as "unknown")."""
    p = r.preprocess
    cfg = PreprocessConfig(p.patch_size, p.merge_size, p.temporal_patch_size, p.min_pixels, p.max_pixels,
                           tuple(p.mean), tuple(p.std), p.resample, p.apply_exif_orientation,
                           p.rgba_composite, tuple(p.rgba_background))
    return ServerInfo(r.serving, r.server_id, r.model_id, cfg, r.key_mode, r.tower, r.hidden,
                      r.deepstack_layers, _DTYPES.get(r.dtype, "unknown"), r.version, r.l3)


def stats_dict(r) -> Dict[str, object]:
    """A StatsResponse as a dict by field name (map fields and messages,
    such as tenant_stats, as dicts)."""
    out: Dict[str, object] = {}
    for f in r.DESCRIPTOR.fields:
        v = getattr(r, f.name)
        if f.message_type is not None and f.message_type.GetOptions().map_entry:
            v = dict(v)
        elif f.message_type is not None:
            v = stats_dict(v)
        out[f.name] = v
    return out


def unary(method, req, timeout: float, metadata):
    """``method(req)``'s answer; a failed call raises EncodeError with its
    status code and details."""
    try:
        return method(req, timeout=timeout, metadata=metadata)
    except grpc.RpcError as e:
        raise EncodeError(e.code(), e.details()) from None

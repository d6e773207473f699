"""A Python client of the epd-encode gRPC server (proto/epd/v1/encoder.proto).

It mirrors the C++ EncodeClient (include/epd/client/client.h): it derives each
image's content key exactly as the server does, groups the images of a request
by key, sends one call per distinct key with the key's hex in the
``x-epd-route`` metadata header (so a hash-affinity proxy such as
deploy/nginx sends each key to the same server), runs the calls concurrently
and reassembles the results by index.

Key derivation (docs/KEYS_AND_PREPROCESSING.md, version 2) is reimplemented
here with hashlib rather than bound from C++, so this module needs only
python3-grpcio and python3-protobuf: SHA-256 over fields written as
``tag (1 byte) || length (uint64 LE) || value``, in this order:

  0x00 domain   b"epd/key/encoded" (or b"epd/key/caller" for caller keys)
  0x01 version  uint32 LE, 2
  0x02 model id UTF-8 bytes
  0x10..0x14    patch_size, merge_size, temporal_patch_size, min_pixels,
                max_pixels, int64 LE each
  0x15, 0x16    mean, std: 3 x float32 LE (IEEE-754 bit patterns)
  0x17          resample, int64 LE
  0x18          apply_exif_orientation, int64 LE (0 or 1)
  0x19          alpha policy, 4 bytes: composite (0 or 1), background R, G, B
                (all 0 when composite is 0)
  0x30          the encoded image bytes (0x32: the caller key)

The model id and preprocessing come from the server's Health answer. Only
SHA-256 keys are derived here; a server in xxh3-fast mode is routed by the
SHA-256 key of the same fields, which is still consistent per image.

Example::

    from epd.client import EncodeClient
    with EncodeClient("127.0.0.1:50051") as c:
        [r] = c.encode([open("cat.jpg", "rb").read()])
        print(r.key.hex(), r.tokens, r.grid_thw, r.source, r.main_array().shape)
        mm = r.to_vllm()  # {"image_embeds": ..., "image_grid_thw": ...} for vLLM

Prefill: each result carries its image's patch grid ``grid_thw`` = (t, h, w)
(EncodedItem.grid_thw), which Qwen-VL prefill needs for its M-RoPE positions.
``EncodeResult.to_vllm()`` and ``to_vllm_batch(results)`` turn results into
the dict vLLM takes as precomputed image embeddings (docs/PREFILL.md).

Input: each image is bytes-like (bytes, bytearray, memoryview) or an Item;
anything else (an int, a str, a PIL image) is a TypeError naming its index,
never converted. A request longer than the server's item limit
(``max_items_per_call``, 256 by default, the server's
``--max-items-per-request`` default) is split into several calls
transparently: results keep the request's order and indices, and identical
images are still encoded once (the server joins them across calls). Set
``max_items_per_call`` to the server's limit when it differs.

Shared memory (docs/SHM.md): with ``EncodeClient(..., shm=True)`` (or
``encode(..., shm=True)``) a server on the same host, run by the same user
with ``--shm-arena-mb``, places each item's rows in its memfd arena instead of
the reply. ``main`` and ``deepstack`` are then read-only memoryviews on this
process's mapping of that arena and ``main_array()`` (float32) is a numpy view
on them, with no copy. The rows are leased: call ``r.release()`` (or
``client.release(results)``, or use the result as a context manager) when done
with them; an unreleased lease expires after the server's ``--shm-lease-ms``,
and after that the span may be overwritten. ``r.lease`` is None for items
that came inline (no arena, the arena full, or not asked for)::

    with EncodeClient("unix:/run/epd.sock", shm=True) as c:
        [r] = c.encode([jpeg])
        with r:
            x = r.main_array()   # np.ndarray view on the shared rows
            prefill(x)           # use before release (or copy)

CUDA IPC (docs/SHM.md, "CUDA IPC"): with ``EncodeClient(..., cuda_ipc=True)``
(or ``encode(..., cuda_ipc=True)``) a server on the same GPU node with a GPU
tier and ``--ipc-export-mb`` answers items whose rows are in its GPU memory
with a CUDA IPC reference instead of bytes: ``r.cuda_ipc`` (a CudaIpcRef)
carries the 64-byte ``cudaIpcMemHandle_t`` and ``cudaIpcEventHandle_t``, the
length, the deepstack offset, the server's device, a generation and the lease
time, and ``main``/``deepstack`` are empty. This module does not import the
memory: Debian's python3-torch is built without CUDA, and mapping a handle
takes the CUDA runtime (``cudaIpcOpenMemHandle``, e.g. through cupy's
``cupy.cuda.runtime.ipcOpenMemHandle``) in the consuming process. The lease
works as for shared memory: ``r.release()``, ``client.release(results)`` or
the result as a context manager end it; otherwise it expires after the
server's lease time, and the server frees the rows. Items that cannot come by
CUDA IPC come by shared memory when ``shm=True`` as well, else inline::

    with EncodeClient("unix:/run/epd.sock", cuda_ipc=True, shm=True) as c:
        [r] = c.encode([jpeg])
        with r:
            if r.cuda_ipc is not None:
                rows = open_with_cuda(r.cuda_ipc.memory_handle, r.cuda_ipc.length)
Lease session (docs/SHM.md, "Crashed clients"): before its first
shared-memory or CUDA IPC call the client opens a Session stream and names it on every
such call (the ``x-epd-session`` header), so if this process dies the server
releases its leases at once instead of at their expiry. ``close()`` (or
leaving the ``with`` block) ends the session, and the server then releases
every lease the client still holds: views from it must not be used after
``close()``. When the server refuses a session (no arena, its
``--shm-max-sessions`` cap, an older server), calls still work, their leases
ending by release or expiry only, and the client tries again a second later.

Targets: ``host:port`` or ``unix:/path`` (a Unix domain socket).

Thread safety: an EncodeClient may be shared by threads (grpc channels are).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import itertools
import mmap
import os
import struct
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple, Union

import grpc

from epd._service_config import ENCODER_SERVICE_CONFIG, RETRY_BUFFER_BYTES
from epd.v1 import encoder_pb2, encoder_pb2_grpc

ROUTE_HEADER = "x-epd-route"
SESSION_HEADER = "x-epd-session"
# After the server refuses a lease session (no arena, its cap, an older
# server), shared-memory calls go without one; the next try waits this long.
SESSION_RETRY_S = 1.0
KEY_VERSION = 2

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
_DTYPE_SIZES = {"float32": 4, "bfloat16": 2, "float16": 2}


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
    """epd::CallerContentKey: the key for a caller-supplied identifier."""
    if isinstance(caller_key, str):
        caller_key = caller_key.encode("utf-8")
    if not caller_key:
        raise ValueError("caller key is empty")
    h = hashlib.sha256(_key_prefix(b"epd/key/caller", model_id, cfg))
    h.update(_field(0x32, caller_key))
    return h.digest()


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


@dataclass
class ServerInfo:
    serving: bool
    server_id: str
    model_id: str
    preprocess: PreprocessConfig
    key_mode: str
    tower: str
    hidden: int
    deepstack_layers: int
    dtype: str
    version: str = ""  # the server's epd-encode version ("" if it reports none)
    l3: str = ""       # the shared tier: "off", "ok" or "degraded" ("" from an older server)


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

    @property
    def is_video(self) -> bool:
        return bool(self.video) or bool(self.video_frames)


@dataclass
class ItemResult:
    """One image's result (also exported as ``EncodeResult``)."""

    index: int
    ok: bool
    code: grpc.StatusCode = grpc.StatusCode.OK
    message: str = ""
    key: bytes = b""
    tokens: int = 0
    hidden: int = 0
    deepstack_layers: int = 0
    dtype: str = ""
    main: bytes = b""        # [tokens, hidden] row-major little-endian
    deepstack: bytes = b""   # [tokens, hidden * deepstack_layers]
    source: str = ""         # "l1", "l2", "l3", "miss", "joined"
    queue_ms: float = 0.0
    tower_ms: float = 0.0
    total_ms: float = 0.0
    server_id: str = ""
    # The image's patch grid (t, h, w) before the merger: t temporal patches
    # (1 for a still image), h x w patches of patch_size pixels; tokens ==
    # t * h * w // merge_size**2. None when the item failed or the server
    # predates EncodedItem.grid_thw.
    grid_thw: Optional[Tuple[int, int, int]] = None
    # Videos only: the sampled frames' timestamps (s), the sample rate, and
    # seconds per temporal grid step (Qwen2.5-VL's second_per_grid_ts).
    timestamps_s: Optional[List[float]] = None
    sample_fps: float = 0.0
    seconds_per_grid_t: float = 0.0
    # Set when the rows came by shared memory: main/deepstack are then
    # read-only memoryviews on the arena, valid until release() or expiry.
    lease: Optional["ShmLease"] = field(default=None, repr=False, compare=False)
    # Set when the rows came by CUDA IPC (main/deepstack empty; see the
    # module docstring); `lease` is then a CudaIpcLease.
    cuda_ipc: Optional["CudaIpcRef"] = field(default=None, repr=False, compare=False)

    def release(self) -> None:
        """Ends this item's shared-memory lease now (a Release call); a no-op
        for an item that came inline. Raises EncodeError with
        FAILED_PRECONDITION when the server refuses it (released already, or
        expired). Views from main_array() must not be used afterwards."""
        if self.lease is not None:
            self.lease.release()

    def __enter__(self) -> "ItemResult":
        return self

    def __exit__(self, *exc) -> None:
        if self.lease is not None and not self.lease.released:
            self.lease.release()

    def main_array(self):
        """main as a float32 numpy array [tokens, hidden] (bf16/f16 widened)."""
        self._check_on_host()
        return _to_float32(self.main, self.dtype, (self.tokens, self.hidden))

    def deepstack_array(self):
        """deepstack as float32 [tokens, hidden * deepstack_layers]."""
        self._check_on_host()
        return _to_float32(self.deepstack, self.dtype, (self.tokens, self.hidden * self.deepstack_layers))

    def _check_on_host(self) -> None:
        if self.cuda_ipc is not None:
            raise ValueError(f"item {self.index}: the rows are in the server's GPU memory (CUDA IPC, "
                             f"{self.cuda_ipc.device}); map r.cuda_ipc.memory_handle with the CUDA runtime, "
                             "or ask for shared memory or inline bytes")

    def to_openai_part(self, uuid: Optional[str] = None, deepstack: bool = True) -> Dict[str, object]:
        """This result as an image_embeds (video_embeds) chat content part for
        vLLM's online server with --enable-mm-embeds: epd.openai_part."""
        from epd.openai_part import to_openai_part
        return to_openai_part(self, uuid=uuid, deepstack=deepstack)

    def to_vllm(self, deepstack: bool = True) -> Dict[str, object]:
        """This image as vLLM's precomputed image embeddings for Qwen-VL models:
        ``{"image_embeds": E, "image_grid_thw": G}``, to pass as
        ``multi_modal_data={"image": ...}`` to an ``LLM(..., enable_mm_embeds=True)``
        (vLLM docs/features/multimodal_inputs.md, "Embedding Inputs"; the
        shapes are those of vLLM's Qwen2VLImageEmbeddingInputs).

        E is [tokens, width] in the result's dtype (torch.float32, bfloat16 or
        float16): the main rows, followed on each row by the deepstack rows when
        the tower has deepstack layers and ``deepstack`` is true, so width =
        hidden * (1 + deepstack_layers). That concatenation is what vLLM's
        Qwen3-VL takes ("image_embeds should contain both the base image
        embedding and deepstack features"); Qwen2-VL and Qwen2.5-VL towers have
        no deepstack, so E is the main rows. G is int64 [1, 3] = [[t, h, w]].

        Both are torch tensors when torch is importable (a copy of the bytes;
        CPU), else numpy arrays, with bfloat16 widened to float32 (numpy has no
        bfloat16). Raises ValueError for a failed item or one without a grid.

        A video's result gives vLLM's video names instead:
        ``{"video_embeds": E, "video_grid_thw": G, "second_per_grid_ts": S}``
        with S float [1] = [seconds_per_grid_t] (docs/PREFILL.md), for
        ``multi_modal_data={"video": ...}``.
        """
        out = to_vllm_batch([self], deepstack=deepstack)
        if self.timestamps_s is None:
            return out
        seconds = [self.seconds_per_grid_t]
        try:
            import torch
            seconds = torch.tensor(seconds, dtype=torch.float64)
        except ImportError:
            import numpy as np
            seconds = np.array(seconds, dtype=np.float64)
        return {"video_embeds": out["image_embeds"], "video_grid_thw": out["image_grid_thw"],
                "second_per_grid_ts": seconds}


def _to_float32(data: bytes, dtype: str, shape):
    import numpy as np

    if dtype == "float32":
        return np.frombuffer(data, dtype="<f4").reshape(shape)
    if dtype == "float16":
        return np.frombuffer(data, dtype="<f2").astype(np.float32).reshape(shape)
    if dtype == "bfloat16":
        # bf16 is the high half of a float32.
        return (np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
    raise ValueError(f"unknown dtype {dtype!r}")


class ShmLease:
    """A lease on one span of a server's shared-memory arena."""

    def __init__(self, client: "EncodeClient", offset: int, generation: int, lease_ms: int):
        self._client = client
        self.offset = offset
        self.generation = generation
        self.lease_ms = lease_ms
        self.released = False

    def _release_tuple(self) -> Tuple[int, int, int]:
        return (self.offset, self.generation, encoder_pb2.LEASE_KIND_SHM)

    def release(self) -> None:
        self.released = True
        self._client._release([self._release_tuple()])


@dataclass(frozen=True)
class CudaIpcRef:
    """A CUDA IPC reference to an item's rows (EncodedItem.cuda_ipc):
    ``length`` bytes, main at byte 0 and deepstack at ``deepstack_offset``,
    in the item's dtype, in a copy the server made in its GPU memory."""

    memory_handle: bytes   # 64 bytes, cudaIpcMemHandle_t
    event_handle: bytes    # 64 bytes, cudaIpcEventHandle_t; all zero = nothing to wait on
    length: int
    deepstack_offset: int
    device: str            # the server's device, e.g. "cuda:0 (NVIDIA H200, ...)"
    device_index: int      # its CUDA ordinal; -1 for a non-CUDA stand-in
    pid: int               # the server's process id
    generation: int
    lease_ms: int


class CudaIpcLease:
    """A lease on one CUDA IPC export of a server (release kind CUDA IPC)."""

    def __init__(self, client: "EncodeClient", generation: int, lease_ms: int):
        self._client = client
        self.generation = generation
        self.lease_ms = lease_ms
        self.released = False

    def _release_tuple(self) -> Tuple[int, int, int]:
        return (0, self.generation, encoder_pb2.LEASE_KIND_CUDA_IPC)

    def release(self) -> None:
        self.released = True
        self._client._release([self._release_tuple()])
class _Session:
    """The client's end of a lease session: a Session stream kept open until
    close(). A daemon thread reads it to its end, so ``live`` turns False as
    soon as the server ends it (e.g. shuts down)."""

    def __init__(self, stub, metadata, timeout: float):
        self._stop = threading.Event()
        self._named = threading.Event()
        self._ended = threading.Event()
        self.id = ""
        self._error: Optional[grpc.RpcError] = None
        self._timeout = timeout

        def requests():
            # Nothing to send; returning half-closes the stream, which ends
            # the session on the server.
            self._stop.wait()
            return
            yield  # pragma: no cover (makes this a generator)

        self._responses = stub.Session(requests(), metadata=metadata)
        self._reader = threading.Thread(target=self._read, name="epd-session", daemon=True)
        self._reader.start()
        if not self._named.wait(timeout) and not self._ended.is_set():
            self._responses.cancel()
            self._stop.set()
            raise EncodeError(grpc.StatusCode.DEADLINE_EXCEEDED,
                              f"the server did not name a lease session within {timeout} s")
        if not self.id:
            self._stop.set()
            e = self._error
            if e is not None:
                raise EncodeError(e.code(), e.details())
            raise EncodeError(grpc.StatusCode.INTERNAL, "the server ended the lease session without naming it")

    def _read(self) -> None:
        try:
            for event in self._responses:
                if not self.id:
                    self.id = event.session_id
                    self._named.set()
        except grpc.RpcError as e:
            self._error = e
        finally:
            self._ended.set()
            self._named.set()

    @property
    def live(self) -> bool:
        return bool(self.id) and not self._ended.is_set()

    def close(self) -> None:
        """Half-closes the stream and waits (at most the client's timeout)
        for the server to finish it, having released the session's leases;
        then cancels, which ends the session all the same."""
        self._stop.set()
        if not self._ended.wait(self._timeout):
            self._responses.cancel()
        self._reader.join(self._timeout)


def _map_arena(ref) -> mmap.mmap:
    """The server's arena ``ref`` points into, mapped read-only. Raises
    EncodeError: PERMISSION_DENIED for another user's server,
    FAILED_PRECONDITION when /proc/<pid>/fd/<fd> is not that arena."""
    path = f"/proc/{ref.pid}/fd/{ref.fd}"
    name = f"epd-shm-{ref.segment:016x}"
    try:
        link = os.readlink(path)
        if name not in link:
            raise FileNotFoundError(path)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except PermissionError as e:
        raise EncodeError(grpc.StatusCode.PERMISSION_DENIED,
                          f"cannot open {path}: {e.strerror}; the shared-memory arena opens only for the "
                          "server's own user") from None
    except OSError:
        raise EncodeError(grpc.StatusCode.FAILED_PRECONDITION,
                          f"{path} is not the server's shared-memory arena {name} (a server on another host or "
                          "in another PID namespace?)") from None
    try:
        return mmap.mmap(fd, ref.segment_bytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    finally:
        os.close(fd)


# The name the prefill docs use for one image's result.
EncodeResult = ItemResult


def to_vllm_batch(results: Sequence[ItemResult], deepstack: bool = True) -> Dict[str, object]:
    """Several images' results as one vLLM precomputed-embeddings dict, in the
    order given (the order of the image placeholders in the prompt):
    ``image_embeds`` [sum of tokens, width] with each image's rows after the
    previous one's, and ``image_grid_thw`` int64 [len(results), 3], row i the
    grid of results[i]. Columns, dtype and the torch/numpy choice as in
    ItemResult.to_vllm. Raises ValueError for an empty list, a failed item, an
    item without a grid, or items of different hidden size, deepstack layers
    or dtype (they must come from one tower).
    """
    if not results:
        raise ValueError("to_vllm_batch needs at least one result")
    first = results[0]
    for r in results:
        if not r.ok:
            raise ValueError(f"item {r.index} failed ({r.code.name}: {r.message}); it has no embedding")
        if r.grid_thw is None:
            raise ValueError(f"item {r.index} has no grid_thw (a server older than EncodedItem.grid_thw); "
                             "Qwen-VL prefill cannot place it")
        if (r.hidden, r.deepstack_layers, r.dtype) != (first.hidden, first.deepstack_layers, first.dtype):
            raise ValueError(f"item {r.index} is {r.hidden} x (1 + {r.deepstack_layers}) {r.dtype}, item "
                             f"{first.index} is {first.hidden} x (1 + {first.deepstack_layers}) {first.dtype}; "
                             "a batch must come from one tower")
    with_deep = deepstack and first.deepstack_layers > 0
    grids = [list(r.grid_thw) for r in results]
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[first.dtype]
        rows = []
        for r in results:
            # bytearray: torch.frombuffer wants a writable buffer; the copy is
            # owned by the tensor.
            main = torch.frombuffer(bytearray(r.main), dtype=dtype).reshape(r.tokens, r.hidden)
            if with_deep:
                deep = torch.frombuffer(bytearray(r.deepstack), dtype=dtype).reshape(
                    r.tokens, r.hidden * r.deepstack_layers)
                main = torch.cat([main, deep], dim=1)
            rows.append(main)
        return {"image_embeds": torch.cat(rows, dim=0), "image_grid_thw": torch.tensor(grids, dtype=torch.int64)}
    import numpy as np

    rows = []
    for r in results:
        main = r.main_array()
        rows.append(np.concatenate([main, r.deepstack_array()], axis=1) if with_deep else main)
    return {"image_embeds": np.concatenate(rows, axis=0), "image_grid_thw": np.array(grids, dtype=np.int64)}


class EncodeError(Exception):
    """A call or an item failed. ``code`` is a grpc.StatusCode; ``results``
    holds every item's result (the successful ones included)."""

    def __init__(self, code: grpc.StatusCode, message: str, results: Optional[List[ItemResult]] = None):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.results = results or []


_CODES = {c.value[0]: c for c in grpc.StatusCode}


class EncodeClient:
    """See the module docstring. ``timeout`` is each call's deadline, seconds.

    Security (docs/SERVER.md, "Production setup"), all off by default:

    - ``tls=True``, or any of ``root_certificates`` / ``certificate_chain``:
      a TLS channel. ``root_certificates`` (PEM bytes) is the CA the server's
      certificate must chain to (None = the system trust store);
      ``certificate_chain`` and ``private_key`` (PEM bytes, both or neither)
      are this client's certificate for a server that requires mutual TLS.
      ``server_name`` checks the server's certificate against that name
      instead of the target's host (a certificate reached by IP).
    - ``auth_token``: sent on every call as ``authorization: Bearer <token>``.

    Raises ValueError for an empty target or half a client certificate.
    """

    def __init__(self, target: str, timeout: float = 30.0, route_by_key: bool = True,
                 max_response_bytes: int = 256 << 20, max_items_per_call: int = 256, *, tls: bool = False,
                 root_certificates: Optional[bytes] = None, certificate_chain: Optional[bytes] = None,
                 private_key: Optional[bytes] = None, server_name: Optional[str] = None,
                 auth_token: Optional[str] = None, shm: bool = False, cuda_ipc: bool = False):
        if not target:
            raise ValueError("target is empty; pass host:port or unix:/path")
        self.shm = shm
        self.cuda_ipc = cuda_ipc
        self._arenas: Dict[int, mmap.mmap] = {}  # segment -> mapping
        self._arenas_lock = threading.Lock()
        if isinstance(max_items_per_call, bool) or not isinstance(max_items_per_call, int) or max_items_per_call < 1:
            raise ValueError(f"max_items_per_call must be an int >= 1, got {max_items_per_call!r}")
        if (certificate_chain is None) != (private_key is None):
            raise ValueError("mutual TLS needs both certificate_chain and private_key; one is missing")
        self.target = target
        self.max_items_per_call = max_items_per_call
        self.timeout = timeout
        self.route_by_key = route_by_key
        options = [
            ("grpc.max_receive_message_length", max_response_bytes),
            ("grpc.max_send_message_length", -1),
            # Encode's retry policy (proto/epd/v1/encoder_service_config.json):
            # a call refused before any item came back (UNAVAILABLE, or
            # CANCELLED by a server whose shutdown began as it arrived) is
            # sent again. Requests up to RETRY_BUFFER_BYTES stay retryable
            # (both from cmake/epd_service_config.cmake).
            ("grpc.enable_retries", 1),
            ("grpc.service_config", ENCODER_SERVICE_CONFIG),
            ("grpc.per_rpc_retry_buffer_size", RETRY_BUFFER_BYTES),
        ]
        if tls or root_certificates is not None or certificate_chain is not None or server_name:
            if server_name:
                options.append(("grpc.ssl_target_name_override", server_name))
            creds = grpc.ssl_channel_credentials(root_certificates=root_certificates, private_key=private_key,
                                                 certificate_chain=certificate_chain)
            self._channel = grpc.secure_channel(target, creds, options=options)
        else:
            self._channel = grpc.insecure_channel(target, options=options)
        self._auth = [("authorization", f"Bearer {auth_token}")] if auth_token else []
        self._stub = encoder_pb2_grpc.EncoderStub(self._channel)
        self._info: Optional[ServerInfo] = None
        self._prefix = "py-" + uuid.uuid4().hex[:12] + "-"
        self._ids = itertools.count(1)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=8)
        self._session: Optional[_Session] = None
        self._session_retry_at = 0.0
        self._session_lock = threading.Lock()

    def close(self) -> None:
        """Ends the lease session, if any (the server releases every lease
        this client still holds: its shared-memory views must not be used
        afterwards), and the channel."""
        self._pool.shutdown(wait=True)
        with self._session_lock:
            if self._session is not None:
                self._session.close()
                self._session = None
        self._channel.close()

    def _session_id(self) -> str:
        """The lease session's id for ``x-epd-session``, opening (or
        reopening) the session first; "" when the server refused one."""
        with self._session_lock:
            if self._session is not None and self._session.live:
                return self._session.id
            if self._session is not None:  # ended, e.g. the server restarted
                self._session.close()
                self._session = None
            now = time.monotonic()
            if now < self._session_retry_at:
                return ""
            try:
                self._session = _Session(self._stub, self._auth, self.timeout)
            except EncodeError:
                self._session_retry_at = now + SESSION_RETRY_S
                return ""
            return self._session.id

    def __enter__(self) -> "EncodeClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- Health / Stats ---------------------------------------------------
    def health(self) -> ServerInfo:
        try:
            r = self._stub.Health(encoder_pb2.HealthRequest(), timeout=self.timeout, metadata=self._auth)
        except grpc.RpcError as e:
            raise EncodeError(e.code(), e.details()) from None
        p = r.preprocess
        cfg = PreprocessConfig(p.patch_size, p.merge_size, p.temporal_patch_size, p.min_pixels, p.max_pixels,
                               tuple(p.mean), tuple(p.std), p.resample, p.apply_exif_orientation,
                               p.rgba_composite, tuple(p.rgba_background))
        return ServerInfo(r.serving, r.server_id, r.model_id, cfg, r.key_mode, r.tower, r.hidden,
                          r.deepstack_layers, _DTYPES.get(r.dtype, "unknown"), r.version, r.l3)

    def stats(self) -> Dict[str, object]:
        """The Stats RPC as a dict (field names as in StatsResponse)."""
        try:
            r = self._stub.Stats(encoder_pb2.StatsRequest(), timeout=self.timeout, metadata=self._auth)
        except grpc.RpcError as e:
            raise EncodeError(e.code(), e.details()) from None
        out: Dict[str, object] = {}
        for f in r.DESCRIPTOR.fields:
            v = getattr(r, f.name)
            out[f.name] = dict(v) if f.message_type is not None and f.message_type.GetOptions().map_entry else v
        return out

    def key_for(self, item: Union[bytes, Item]) -> bytes:
        """The key the server will use for ``item`` (from Health's inputs)."""
        info = self._server_info()
        item = item if isinstance(item, Item) else Item(image=item)
        if item.is_video:
            # The route key; the server's content key when its default
            # sampling is VideoSampling() (see epd/client/client.h).
            return video_key(info.model_id, info.preprocess, item.sampling or VideoSampling(), item.video,
                             item.video_frames)
        if item.caller_key is not None:
            return caller_content_key(info.model_id, info.preprocess, item.caller_key)
        return content_key(info.model_id, info.preprocess, item.image)

    def _server_info(self) -> ServerInfo:
        if self._info is None:
            self._info = self.health()
        return self._info

    # --- Encode -------------------------------------------------------------
    def release(self, results: Sequence[ItemResult]) -> None:
        """Ends the shared-memory leases of ``results`` in one Release call
        (items that came inline, or are released already, are skipped).
        Raises EncodeError with FAILED_PRECONDITION when the server refused
        any (expired meanwhile); the others are released all the same."""
        leases = [r.lease for r in results if r.lease is not None and not r.lease.released]
        for lease in leases:
            lease.released = True
        if leases:
            self._release([lease._release_tuple() for lease in leases])

    def _release(self, spans: List[Tuple[int, ...]]) -> None:
        """(offset, generation) or (offset, generation, kind) per lease."""
        req = encoder_pb2.ReleaseRequest()
        for span in spans:
            offset, generation = span[0], span[1]
            kind = span[2] if len(span) > 2 else encoder_pb2.LEASE_KIND_SHM
            req.leases.add(offset=offset, generation=generation, kind=kind)
        try:
            self._stub.Release(req, timeout=self.timeout, metadata=self._auth)
        except grpc.RpcError as e:
            raise EncodeError(e.code(), e.details()) from None

    def _arena(self, ref) -> mmap.mmap:
        with self._arenas_lock:
            m = self._arenas.get(ref.segment)
            if m is None or len(m) < ref.segment_bytes:
                m = self._arenas[ref.segment] = _map_arena(ref)
            return m

    def encode(self, items: Sequence[Union[bytes, Item]], request_id: Optional[str] = None,
               check: bool = True, shm: Optional[bool] = None,
               cuda_ipc: Optional[bool] = None) -> List[ItemResult]:
        """Encodes ``items`` (bytes-like or Item). Returns results by index.
        With ``check`` (default), raises EncodeError carrying the lowest-index
        failure (and every result) when any item failed. Raises TypeError for
        an item of another type. More than ``max_items_per_call`` items (of
        one key, or of the request when not routing by key) go in several
        calls; see the module docstring. ``shm`` overrides the client's
        ``shm`` for this request (shared-memory delivery, see above), and
        ``cuda_ipc`` the client's ``cuda_ipc`` (CUDA IPC delivery)."""
        use_shm = self.shm if shm is None else shm
        use_ipc = self.cuda_ipc if cuda_ipc is None else cuda_ipc
        items = [_as_item(i, n) for n, i in enumerate(items)]
        if not items:
            raise EncodeError(grpc.StatusCode.INVALID_ARGUMENT, "the request has no items; send at least one image")
        if request_id is None:
            request_id = f"{self._prefix}{next(self._ids)}"
        groups: List[tuple] = []  # (route, [indices]) in order of first appearance
        if self.route_by_key:
            by_route: Dict[str, int] = {}
            for i, item in enumerate(items):
                try:
                    route = self.key_for(item).hex()
                except ValueError:
                    route = ""  # no key (empty caller key): unrouted, the server names the problem
                if route not in by_route:
                    by_route[route] = len(groups)
                    groups.append((route, []))
                groups[by_route[route]][1].append(i)
        else:
            groups.append(("", list(range(len(items)))))
        # The server refuses a call over its item limit: split, keeping each
        # group's order (results are placed by index, so order across calls
        # does not matter).
        groups = [(route, indices[i:i + self.max_items_per_call])
                  for route, indices in groups for i in range(0, len(indices), self.max_items_per_call)]

        results: List[Optional[ItemResult]] = [None] * len(items)

        def call(n: int) -> None:
            route, indices = groups[n]
            rid = request_id if len(groups) == 1 else f"{request_id}/{n}"
            self._call(rid, route, [items[i] for i in indices], indices, results, use_shm, use_ipc)

        futures = [self._pool.submit(call, n) for n in range(1, len(groups))]
        call(0)
        for f in futures:
            f.result()
        out = [r for r in results]  # every slot is filled by _call
        if check:
            for r in out:
                if not r.ok:
                    raise EncodeError(r.code, r.message, out)
        return out

    def _call(self, rid: str, route: str, items: List[Item], indices: List[int],
              results: List[Optional[ItemResult]], use_shm: bool = False, use_ipc: bool = False) -> None:
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
            if it.video:
                m.video = bytes(it.video)
            for f in it.video_frames:
                m.video_frames.frames.append(bytes(f))
            if it.sampling is not None:
                s = it.sampling
                m.sampling.fps = s.fps
                m.sampling.nframes = s.nframes or 0
                m.sampling.min_frames = s.min_frames
                m.sampling.max_frames = s.max_frames
                m.sampling.min_pixels = s.min_pixels
                m.sampling.max_pixels = s.max_pixels
                m.sampling.total_pixels = s.total_pixels
                m.sampling.resized_height = s.resized_height or 0
                m.sampling.resized_width = s.resized_width or 0
        metadata = ([(ROUTE_HEADER, route)] if route else []) + self._auth
        if use_shm or use_ipc:
            session_id = self._session_id()
            if session_id:
                metadata.append((SESSION_HEADER, session_id))
        got = set()
        code, message = grpc.StatusCode.OK, ""
        try:
            for m in self._stub.Encode(req, timeout=self.timeout, metadata=metadata):
                if m.index < 0 or m.index >= len(indices) or m.index in got:
                    continue
                got.add(m.index)
                if m.HasField("cuda_ipc"):
                    results[indices[m.index]] = self._from_ipc(m, indices[m.index])
                elif m.HasField("shm"):
                    results[indices[m.index]] = self._from_shm(m, indices[m.index])
                else:
                    results[indices[m.index]] = _from_proto(m, indices[m.index])
        except grpc.RpcError as e:
            code, message = e.code(), e.details()
        for local, index in enumerate(indices):
            if local not in got:
                if code == grpc.StatusCode.OK:
                    code, message = grpc.StatusCode.INTERNAL, f"the server ended the call without item {index}"
                results[index] = ItemResult(index=index, ok=False, code=code, message=message)


    def _from_ipc(self, m, index: int) -> ItemResult:
        """An item sent by CUDA IPC: the reference and its lease, no bytes."""
        r = _from_proto(m, index)
        if not r.ok:
            return r
        ref = m.cuda_ipc
        lease = CudaIpcLease(self, ref.generation, ref.lease_ms)
        main_bytes = r.tokens * r.hidden * _DTYPE_SIZES.get(r.dtype, 0)
        problem = ""
        if len(ref.memory_handle) != 64 or len(ref.event_handle) != 64:
            problem = (f"a {len(ref.memory_handle)}-byte memory handle and a {len(ref.event_handle)}-byte event "
                       "handle; both must be 64 bytes")
        elif ref.length == 0 or ref.length != main_bytes * (1 + r.deepstack_layers) \
                or ref.deepstack_offset != main_bytes:
            problem = (f"{ref.length} bytes, deepstack at byte {ref.deepstack_offset}, for shape "
                       f"[{r.tokens}, {r.hidden}] x {1 + r.deepstack_layers}")
        if problem:
            try:
                lease.release()  # the server holds the export until then
            except EncodeError:
                pass
            return ItemResult(index=index, ok=False, code=grpc.StatusCode.INTERNAL,
                              message=f"server sent item {index} by CUDA IPC with {problem}")
        r.cuda_ipc = CudaIpcRef(memory_handle=bytes(ref.memory_handle), event_handle=bytes(ref.event_handle),
                                length=ref.length, deepstack_offset=ref.deepstack_offset, device=ref.device,
                                device_index=ref.device_index, pid=ref.pid, generation=ref.generation,
                                lease_ms=ref.lease_ms)
        r.lease = lease
        return r

    def _from_shm(self, m, index: int) -> ItemResult:
        """An item sent by reference: main/deepstack are views on the arena."""
        r = _from_proto(m, index)
        if not r.ok:
            return r
        ref = m.shm
        main_bytes = r.tokens * r.hidden * _DTYPE_SIZES.get(r.dtype, 0)
        if (ref.length != main_bytes * (1 + r.deepstack_layers) or ref.offset > ref.segment_bytes
                or ref.length > ref.segment_bytes - ref.offset):
            return ItemResult(index=index, ok=False, code=grpc.StatusCode.INTERNAL,
                              message=f"server sent item {index} by reference with {ref.length} bytes at offset "
                                      f"{ref.offset} of a {ref.segment_bytes}-byte arena, for shape "
                                      f"[{r.tokens}, {r.hidden}] x {1 + r.deepstack_layers}")
        lease = ShmLease(self, ref.offset, ref.generation, ref.lease_ms)
        try:
            rows = memoryview(self._arena(ref))[ref.offset:ref.offset + ref.length]
        except EncodeError as e:
            try:
                lease.release()  # hand the span back now rather than at expiry
            except EncodeError:
                pass
            return ItemResult(index=index, ok=False, code=e.code, message=f"item {index}: {e.message}")
        r.main = rows[:main_bytes]
        r.deepstack = rows[main_bytes:]
        r.lease = lease
        return r


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


def _from_proto(m, index: int) -> ItemResult:
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

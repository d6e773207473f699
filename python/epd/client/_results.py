"""What the client's calls return, and the adaptors that hand it on.

ServerInfo (Health), ItemResult (one item of Encode, alias EncodeResult) and
EncodeError; ``ItemResult.main_array()`` / ``deepstack_array()`` give numpy
float32 views or copies of the rows, and ``ItemResult.to_vllm()`` /
``to_vllm_batch()`` vLLM's precomputed-embeddings dicts (docs/PREFILL.md).
numpy and torch are imported only when an adaptor runs. The leases an
ItemResult may carry are in _leases.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import grpc

from epd.client._keys import PreprocessConfig
from epd.client._lease_types import CudaIpcRef, ShmLease


# Bytes per element of each dtype the server sends (EncodedItem.dtype).
_DTYPE_SIZES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass
class ServerInfo:
    """The server's Health answer: its model and preprocessing (the inputs of
    every key, see _keys.py), tower shape and dtype, version and L3 state."""

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


class EncodeError(Exception):
    """A call or an item failed. ``code`` is a grpc.StatusCode; ``results``
    holds every item's result (the successful ones included)."""

    def __init__(self, code: grpc.StatusCode, message: str, results: Optional[List[ItemResult]] = None):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.results = results or []


@dataclass
class ProbeResult:
    """One item's Probe answer (EncodeClient.probe): what an encode of it
    would key and produce, read by the server from its headers without
    decoding (docs/SERVER.md, "Probe")."""

    index: int
    ok: bool
    code: grpc.StatusCode = grpc.StatusCode.OK
    message: str = ""
    key: bytes = b""        # the server's content key (tenant-namespaced), 32 bytes
    route_key: bytes = b""  # the unsalted key for x-epd-route; equals key_for(item)
    grid_thw: Optional[Tuple[int, int, int]] = None  # None: a caller_key alone (no header)
    tokens: int = 0         # post-merge tokens


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
    lease: Optional[ShmLease] = field(default=None, repr=False, compare=False)
    # Set when the rows came by CUDA IPC (main/deepstack empty; see the
    # epd.client docstring); `lease` is then a CudaIpcLease.
    cuda_ipc: Optional[CudaIpcRef] = field(default=None, repr=False, compare=False)

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


# The name the prefill docs use for one image's result.
EncodeResult = ItemResult


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

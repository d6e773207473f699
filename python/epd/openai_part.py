"""An epd-encode result as an OpenAI chat content part for vLLM's online
server started with ``--enable-mm-embeds`` (no EPD proxy needed).

``to_openai_part(result, uuid=None)`` returns::

    {"type": "image_embeds",
     "image_embeds": {"image_embeds": B64(E), "image_grid_thw": B64(G)},
     "uuid": uuid}            # only when given

(``video_embeds`` / ``video_grid_thw`` for a video's result), to put in a
message's ``content`` list next to its text. E is [tokens, width] in the
result's dtype: the main rows, each followed by its deepstack rows when the
tower has deepstack layers (Qwen3-VL; width = hidden * (1 + layers)), the
layout of ``ItemResult.to_vllm``. G is int64 [1, 3] = [[t, h, w]].

Encoding, as vLLM's embedding loader reads it (ImageEmbeddingMediaIO in
vllm/multimodal/media: bytes starting with the numpy magic ``\\x93NUMPY`` go
to ``np.load``, all others to ``torch.load(weights_only=True)``): float16 and
float32 as ``.npy`` (numpy.save), bfloat16, which numpy lacks, as
``torch.save`` bytes (needs torch); G always as ``.npy``. Each is base64
(standard alphabet). vLLM parses a dict-valued ``image_embeds`` part by
loading each value (chat_utils, parse_image_embeds), which Qwen-VL models
need for the grid.

Raises ValueError for a failed item, one without a grid, one whose rows are
not on the host (CUDA IPC), or bfloat16 rows without torch.
"""

import base64
import io
from typing import Dict, Optional

import numpy as np

__all__ = ["to_openai_part"]

_NUMPY = {"float32": np.dtype("<f4"), "float16": np.dtype("<f2")}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _npy(array) -> str:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return _b64(buf.getvalue())


def _rows(result, deepstack: bool):
    """[tokens, width] as numpy (f32/f16) or torch (bf16), in the result's dtype."""
    width = result.hidden * (1 + (result.deepstack_layers if deepstack else 0))
    if result.dtype in _NUMPY:
        dt = _NUMPY[result.dtype]
        main = np.frombuffer(bytes(result.main), dtype=dt).reshape(result.tokens, result.hidden)
        if deepstack and result.deepstack_layers > 0:
            deep = np.frombuffer(bytes(result.deepstack), dtype=dt).reshape(
                result.tokens, result.hidden * result.deepstack_layers)
            main = np.concatenate([main, deep], axis=1)
        return main.reshape(result.tokens, width)
    if result.dtype != "bfloat16":
        raise ValueError(f"item {result.index}: unknown dtype {result.dtype!r}")
    try:
        import torch
    except ImportError as e:
        raise ValueError(f"item {result.index}: bfloat16 rows go as torch.save bytes, which needs torch "
                         f"({e}); or run the server with --dtype float16") from e
    main = torch.frombuffer(bytearray(result.main), dtype=torch.bfloat16).reshape(result.tokens, result.hidden)
    if deepstack and result.deepstack_layers > 0:
        deep = torch.frombuffer(bytearray(result.deepstack), dtype=torch.bfloat16).reshape(
            result.tokens, result.hidden * result.deepstack_layers)
        main = torch.cat([main, deep], dim=1)
    return main


def _encode_rows(rows) -> str:
    if isinstance(rows, np.ndarray):
        return _npy(np.ascontiguousarray(rows))
    import torch
    buf = io.BytesIO()
    torch.save(rows.contiguous(), buf)
    return _b64(buf.getvalue())


def to_openai_part(result, uuid: Optional[str] = None, deepstack: bool = True) -> Dict[str, object]:
    """See the module docstring. ``result`` is an epd.client ItemResult."""
    if not result.ok:
        raise ValueError(f"item {result.index} failed ({result.message}); it has no embedding")
    if result.grid_thw is None:
        raise ValueError(f"item {result.index} has no grid_thw; Qwen-VL prefill cannot place it")
    if getattr(result, "cuda_ipc", None) is not None:
        raise ValueError(f"item {result.index}: the rows are in the server's GPU memory (CUDA IPC); "
                         "ask for shared memory or inline bytes")
    kind = "video" if result.timestamps_s is not None else "image"
    grid = np.array([list(result.grid_thw)], dtype=np.int64)
    part = {"type": f"{kind}_embeds",
            f"{kind}_embeds": {f"{kind}_embeds": _encode_rows(_rows(result, deepstack)),
                               f"{kind}_grid_thw": _npy(grid)}}
    if uuid is not None:
        part["uuid"] = uuid
    return part

"""ItemResult.to_openai_part (epd.openai_part) on results built by hand: the
part's shape, and its payloads decoded the way vLLM's embedding loader
decodes them (numpy magic -> np.load, else torch.load(weights_only=True)).
Expected values are written out here."""

import base64
import io
import struct

import numpy as np
import pytest

try:
    from epd import client as ec
except ImportError as e:
    pytest.skip(f"epd.client is not importable ({e}); build target epd_python_stubs", allow_module_level=True)


def load(b64):
    data = base64.b64decode(b64, validate=True)
    if data[:6] == b"\x93NUMPY":
        return np.load(io.BytesIO(data), allow_pickle=False)
    torch = pytest.importorskip("torch")
    return torch.load(io.BytesIO(data), weights_only=True)


def result(dtype, main, deep, layers, grid=(1, 2, 2), video=False):
    return ec.EncodeResult(index=0, ok=True, tokens=2, hidden=2, deepstack_layers=layers, dtype=dtype, main=main,
                           deepstack=deep, grid_thw=grid, timestamps_s=[0.0, 0.5] if video else None)


def test_float32_rows_go_as_npy_with_deepstack_columns_and_the_grid():
    r = result("float32", struct.pack("<4f", 1, 2, 3, 4), struct.pack("<4f", -1, -2, -3, -4), 1)
    part = r.to_openai_part(uuid="img-7")
    assert set(part) == {"type", "image_embeds", "uuid"}
    assert part["type"] == "image_embeds" and part["uuid"] == "img-7"
    rows = load(part["image_embeds"]["image_embeds"])
    assert rows.dtype == np.float32 and rows.tolist() == [[1, 2, -1, -2], [3, 4, -3, -4]]
    grid = load(part["image_embeds"]["image_grid_thw"])
    assert grid.dtype == np.int64 and grid.tolist() == [[1, 2, 2]]


def test_float16_stays_float16_and_a_video_uses_the_video_names():
    r = result("float16", struct.pack("<4e", 0.5, 1.5, 2.5, 3.5), b"", 0, grid=(2, 2, 2), video=True)
    part = r.to_openai_part()
    assert part["type"] == "video_embeds" and "uuid" not in part
    rows = load(part["video_embeds"]["video_embeds"])
    assert rows.dtype == np.float16 and rows.tolist() == [[0.5, 1.5], [2.5, 3.5]]
    assert load(part["video_embeds"]["video_grid_thw"]).tolist() == [[2, 2, 2]]


def test_bfloat16_goes_as_torch_save_bytes():
    torch = pytest.importorskip("torch")
    bf16 = lambda vs: b"".join(struct.pack("<f", v)[2:] for v in vs)  # noqa: E731
    r = result("bfloat16", bf16([1.0, 2.0, 3.0, 4.0]), bf16([5.0, 6.0, 7.0, 8.0]), 1)
    raw = base64.b64decode(r.to_openai_part()["image_embeds"]["image_embeds"])
    assert raw[:6] != b"\x93NUMPY"  # vLLM sends it to torch.load
    rows = torch.load(io.BytesIO(raw), weights_only=True)
    assert rows.dtype == torch.bfloat16
    assert rows.float().tolist() == [[1, 2, 5, 6], [3, 4, 7, 8]]


def test_a_failed_item_or_one_without_a_grid_is_refused():
    with pytest.raises(ValueError, match="item 0 failed"):
        ec.EncodeResult(index=0, ok=False, message="bad image").to_openai_part()
    with pytest.raises(ValueError, match="no grid_thw"):
        result("float32", struct.pack("<4f", 1, 2, 3, 4), b"", 0, grid=None).to_openai_part()

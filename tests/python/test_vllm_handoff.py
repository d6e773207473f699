"""EncodeResult.to_vllm / to_vllm_batch on results built by hand (no server):
dtypes, shapes and the errors. The expected values are written out here, not
taken from epd.client; the server-backed cases are in test_client.py."""

import struct

import pytest

try:
    from epd import client as ec
except ImportError as e:  # stubs not generated: EPD_WITH_PYTHON/EPD_WITH_GRPC off
    pytest.skip(f"epd.client is not importable ({e}); build target epd_python_stubs", allow_module_level=True)

torch = pytest.importorskip("torch")


def bf16(values):
    """bfloat16 bytes of values exact in bf16 (the high half of each float32)."""
    return b"".join(struct.pack("<f", v)[2:] for v in values)


def result(index, tokens, hidden, layers, dtype, main, deep, grid):
    return ec.EncodeResult(index=index, ok=True, tokens=tokens, hidden=hidden, deepstack_layers=layers,
                           dtype=dtype, main=main, deepstack=deep, grid_thw=grid)


def test_bfloat16_rows_stay_bfloat16_with_deepstack_columns_after_main():
    # 2 tokens, hidden 2, 1 deepstack layer; a 2-temporal-patch grid
    # (2, 2, 2): 8 patches, 2 tokens after the 2x2 merge.
    r = result(0, 2, 2, 1, "bfloat16", bf16([1.0, 2.0, 3.0, 4.0]), bf16([-1.0, -2.0, -3.0, -4.0]), (2, 2, 2))
    d = r.to_vllm()
    assert d["image_embeds"].dtype == torch.bfloat16
    assert d["image_embeds"].float().tolist() == [[1.0, 2.0, -1.0, -2.0], [3.0, 4.0, -3.0, -4.0]]
    assert d["image_grid_thw"].dtype == torch.int64 and d["image_grid_thw"].tolist() == [[2, 2, 2]]


def test_float16_batch_concatenates_rows_in_order():
    f16 = lambda vs: struct.pack(f"<{len(vs)}e", *vs)  # noqa: E731
    a = result(0, 1, 2, 0, "float16", f16([0.5, 1.5]), b"", (1, 2, 2))
    b = result(1, 2, 2, 0, "float16", f16([2.5, 3.5, 4.5, 5.5]), b"", (1, 2, 4))
    d = ec.to_vllm_batch([b, a])
    assert d["image_embeds"].dtype == torch.float16
    assert d["image_embeds"].tolist() == [[2.5, 3.5], [4.5, 5.5], [0.5, 1.5]]
    assert d["image_grid_thw"].tolist() == [[1, 2, 4], [1, 2, 2]]


def test_results_without_a_grid_or_of_two_towers_are_refused():
    no_grid = result(3, 1, 1, 0, "float32", struct.pack("<f", 1.0), b"", None)
    with pytest.raises(ValueError, match="item 3 has no grid_thw"):
        no_grid.to_vllm()
    one = result(0, 1, 1, 0, "float32", struct.pack("<f", 1.0), b"", (1, 2, 2))
    other = result(1, 1, 2, 0, "float32", struct.pack("<2f", 1.0, 2.0), b"", (1, 2, 2))
    with pytest.raises(ValueError, match="one tower"):
        ec.to_vllm_batch([one, other])
    with pytest.raises(ValueError, match="at least one"):
        ec.to_vllm_batch([])


def test_without_torch_the_dict_holds_numpy_arrays_with_bfloat16_widened(monkeypatch):
    np = pytest.importorskip("numpy")
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # `import torch` now raises ImportError
    r = result(0, 1, 2, 1, "bfloat16", bf16([1.5, -2.0]), bf16([0.25, 8.0]), (1, 2, 2))
    d = r.to_vllm()
    assert isinstance(d["image_embeds"], np.ndarray) and d["image_embeds"].dtype == np.float32
    assert d["image_embeds"].tolist() == [[1.5, -2.0, 0.25, 8.0]]
    assert d["image_grid_thw"].dtype == np.int64 and d["image_grid_thw"].tolist() == [[1, 2, 2]]

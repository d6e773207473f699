"""The Python client (epd.client) and the `epd-encode client` CLI against a
real `epd-encode serve` process running the tiny tower.

Independent checks: keys the server returns are computed by the C++
ComputeContentKey, so equality with the Python derivation cross-checks the
two implementations; token counts follow from Qwen2-VL's smart_resize by hand
(56x56 -> 4x4 patches -> 2x2 merged = 4 tokens; 84x56 -> 6 tokens); safetensors
output is parsed here with struct/json, not with epd."""

import json
import os
import struct
import subprocess
import tempfile

import pytest

import server_harness as h
from project_info import project_version

reason = h.missing_reason()
if reason:
    pytest.skip(reason, allow_module_level=True)
try:
    import grpc
    from epd import client as ec
except ImportError as e:  # stubs not generated: EPD_WITH_PYTHON/EPD_WITH_GRPC off
    pytest.skip(f"epd.client is not importable ({e}); build target epd_python_stubs", allow_module_level=True)

# The tiny tower (src/server/CMakeLists.txt): hidden 64, 1 deepstack layer, float32.
HIDDEN = 64
DEEPSTACK = 1


@pytest.fixture(scope="module")
def server():
    proc, port, _ = h.start_server(h.tiny_serve_args() + ["--server-id", "py-test", "--cache-mb", "16",
                                                          "--host-cache-mb", "16"])
    yield f"127.0.0.1:{port}"
    # Graceful shutdown on SIGTERM exits 0.
    assert h.stop_server(proc) == 0


@pytest.fixture
def client(server):
    with ec.EncodeClient(server, timeout=30) as c:
        yield c


def test_encode_streams_every_item_by_index(client):
    imgs = [h.png(56, 56, 1), h.png(84, 56, 2), h.png(56, 56, 3)]
    results = client.encode(imgs)
    assert [r.index for r in results] == [0, 1, 2]
    assert [r.tokens for r in results] == [4, 6, 4]
    for r in results:
        assert r.ok and r.hidden == HIDDEN and r.deepstack_layers == DEEPSTACK and r.dtype == "float32"
        assert len(r.main) == r.tokens * HIDDEN * 4
        assert len(r.deepstack) == r.tokens * HIDDEN * DEEPSTACK * 4
        assert r.source == "miss"
        assert r.server_id == "py-test"
    assert results[0].main != results[2].main  # different images, different embeddings


def test_second_encode_is_an_l1_hit_with_the_same_bytes(client):
    img = h.png(56, 56, 10)
    [first] = client.encode([img])
    [again] = client.encode([img])
    assert again.source == "l1" and again.tower_ms == 0
    assert again.main == first.main and again.deepstack == first.deepstack


def test_python_key_equals_the_servers_cpp_key(client):
    img = h.png(56, 56, 11)
    [r] = client.encode([img])
    info = client.health()
    assert r.key == ec.content_key(info.model_id, info.preprocess, img)
    assert r.key == client.key_for(img)
    # Every preprocessing field is in the key: a changed one gives another key.
    other = ec.PreprocessConfig(max_pixels=info.preprocess.max_pixels + 1)
    assert ec.content_key(info.model_id, other, img) != r.key


def test_caller_key_matches_and_serves_a_hit_without_bytes(client):
    img = h.png(56, 56, 12)
    [first] = client.encode([ec.Item(image=img, caller_key="gateway-12")])
    info = client.health()
    assert first.key == ec.caller_content_key(info.model_id, info.preprocess, "gateway-12")
    [hit] = client.encode([ec.Item(caller_key="gateway-12", expected_tokens=4)])
    assert hit.source == "l1" and hit.main == first.main


def test_health_reports_the_key_inputs(client):
    info = client.health()
    assert info.serving and info.server_id == "py-test"
    assert info.model_id == "tiny_tower.pt"
    assert info.preprocess == ec.PreprocessConfig(mean=info.preprocess.mean, std=info.preprocess.std)
    assert [round(m, 6) for m in info.preprocess.mean] == [0.481455, 0.457828, 0.408211]
    assert info.hidden == HIDDEN and info.deepstack_layers == DEEPSTACK and info.dtype == "float32"
    assert info.version == project_version()


def test_main_array_has_the_embedding_shape(client):
    [r] = client.encode([h.png(84, 56, 13)])
    a = r.main_array()
    assert a.shape == (6, HIDDEN) and str(a.dtype) == "float32"
    assert r.deepstack_array().shape == (6, HIDDEN * DEEPSTACK)


def test_undecodable_image_raises_invalid_argument_and_keeps_the_good_item(client):
    good = h.png(56, 56, 14)
    with pytest.raises(ec.EncodeError) as e:
        client.encode([good, b"not an image at all"])
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    # Per-key calls: the bad image is item 0 of its own call, and the client
    # names it by its place in the request.
    assert e.value.message.startswith("item 1: "), e.value.message
    assert e.value.results[0].ok and e.value.results[0].tokens == 4
    assert not e.value.results[1].ok
    assert client.encode([good])[0].ok  # the server keeps serving


def test_expected_tokens_that_disagree_raise_invalid_argument(client):
    with pytest.raises(ec.EncodeError) as e:
        client.encode([ec.Item(image=h.png(56, 56, 15), expected_tokens=9)])
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "gives 4 tokens" in e.value.message


def test_check_false_returns_failures_instead_of_raising(client):
    [r] = client.encode([b"\x89PNG broken"], check=False)
    assert not r.ok and r.code == grpc.StatusCode.INVALID_ARGUMENT


def test_stats_count_what_was_served(client):
    before = client.stats()
    img = h.png(56, 56, 16)
    client.encode([img])
    client.encode([img])
    after = client.stats()
    assert after["misses"] - before["misses"] == 1
    assert after["hits_l1"] - before["hits_l1"] == 1
    assert after["server_id"] == "py-test"


def test_empty_request_raises_invalid_argument(client):
    with pytest.raises(ec.EncodeError) as e:
        client.encode([])
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT


def test_an_item_that_is_not_bytes_is_a_type_error_not_zero_bytes(client):
    """Regression: encode([123]) sent 123 zero bytes (bytes(123))."""
    for bad in (123, "photo.jpg", None, [1, 2, 3]):
        with pytest.raises(TypeError, match=f"item 1: expected the encoded image as bytes-like .*got {type(bad).__name__}"):
            client.encode([h.png(56, 56, 30), bad])
    with pytest.raises(TypeError, match="item 0: Item.image must be bytes-like, got int"):
        client.encode([ec.Item(image=5)])
    # bytearray and memoryview are images like bytes.
    img = h.png(56, 56, 31)
    a, b, c = client.encode([img, bytearray(img), memoryview(img)])
    assert a.ok and b.ok and c.ok and a.key == b.key == c.key


def test_more_items_than_the_server_accepts_are_split_into_several_calls(client):
    """Regression: encode([img] * 300) became one call over the server's
    256-item limit (INVALID_ARGUMENT)."""
    img = h.png(56, 56, 32)
    before = client.stats()
    results = client.encode([img] * 300)
    after = client.stats()
    assert [r.index for r in results] == list(range(300))
    assert all(r.ok and r.tokens == 4 and r.main == results[0].main for r in results)
    assert after["tower_items"] - before["tower_items"] == 1  # one image, encoded once across the calls
    assert after["requests"] - before["requests"] == 2  # 256 + 44


def test_split_calls_keep_the_request_order_without_routing(server):
    imgs = [h.png(56, 56 + 28 * (i % 3), 40 + i) for i in range(7)]  # 4 or 6 or 8 tokens
    with ec.EncodeClient(server, timeout=30, route_by_key=False, max_items_per_call=3) as c:
        info = c.health()
        before = c.stats()
        results = c.encode(imgs)
        after = c.stats()
    assert [r.index for r in results] == list(range(7))
    assert [r.key for r in results] == [ec.content_key(info.model_id, info.preprocess, i) for i in imgs]
    assert [r.tokens for r in results] == [[4, 6, 8][i % 3] for i in range(7)]
    assert after["requests"] - before["requests"] == 3  # 3 + 3 + 1
    with pytest.raises(ValueError, match="max_items_per_call must be an int >= 1, got 0"):
        ec.EncodeClient(server, max_items_per_call=0)


def test_unreachable_server_raises_unavailable():
    port = h.free_ports(1)[0]
    with ec.EncodeClient(f"127.0.0.1:{port}", timeout=5) as c:
        with pytest.raises(ec.EncodeError) as e:
            c.encode([h.png(56, 56, 17)])
    assert e.value.code == grpc.StatusCode.UNAVAILABLE


# --- the C++ CLI client ---------------------------------------------------------

def run_cli(*args):
    return subprocess.run([h.encode_binary(), "client", *args], capture_output=True, text=True, timeout=60)


def test_cli_client_prints_one_line_per_item_and_writes_safetensors(server, client):
    with tempfile.TemporaryDirectory() as d:
        paths = []
        for i, (w, hgt) in enumerate([(56, 56), (84, 56)]):
            p = os.path.join(d, f"img{i}.png")
            with open(p, "wb") as f:
                f.write(h.png(w, hgt, 20 + i))
            paths.append(p)
        out = os.path.join(d, "emb.safetensors")
        r = run_cli("--server", server, "--out", out, *paths)
        assert r.returncode == 0, r.stderr
        lines = [dict(kv.split("=", 1) for kv in ln.split()) for ln in r.stdout.splitlines()]
        assert sorted(int(ln["index"]) for ln in lines) == [0, 1]
        by_index = {int(ln["index"]): ln for ln in lines}
        assert by_index[0]["tokens"] == "4" and by_index[1]["tokens"] == "6"
        assert all(ln["hidden"] == str(HIDDEN) and ln["source"] in ("miss", "l1", "l2", "joined") for ln in lines)
        # The key the CLI prints is the one Python derives.
        assert by_index[0]["key"] == client.key_for(h.png(56, 56, 20)).hex()

        with open(out, "rb") as f:
            blob = f.read()
        n = struct.unpack("<Q", blob[:8])[0]
        header = json.loads(blob[8:8 + n])
        key0 = by_index[0]["key"]
        assert header[key0]["dtype"] == "F32" and header[key0]["shape"] == [4, HIDDEN]
        assert header[key0 + ".deepstack"]["shape"] == [4, HIDDEN * DEEPSTACK]
        # The grid beside it: I64 [3], 56x56 -> (1, 4, 4) by hand.
        g = header[key0 + ".grid_thw"]
        assert g["dtype"] == "I64" and g["shape"] == [3]
        assert struct.unpack("<3q", blob[8 + n + g["data_offsets"][0]:8 + n + g["data_offsets"][1]]) == (1, 4, 4)
        assert header["__metadata__"]["model_id"] == "tiny_tower.pt"
        begin, end = header[key0]["data_offsets"]
        [again] = client.encode([h.png(56, 56, 20)])
        assert blob[8 + n + begin:8 + n + end] == again.main


def test_cli_client_failure_prints_the_status_name_and_exits_nonzero(server):
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "bad.png")
        with open(p, "wb") as f:
            f.write(b"definitely not a png")
        r = run_cli("--server", server, p)
    assert r.returncode != 0
    assert "INVALID_ARGUMENT" in r.stderr and "unsupported image format" in r.stderr


def test_cli_client_reports_an_unreachable_server(server):
    port = h.free_ports(1)[0]
    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "a.png")
        with open(p, "wb") as f:
            f.write(h.png(56, 56, 30))
        r = run_cli("--server", f"127.0.0.1:{port}", "--timeout-s", "5", p)
    assert r.returncode != 0
    assert "UNAVAILABLE" in r.stderr


# --- What prefill needs: the grid, and vLLM's precomputed-embeddings dict ---

def smart_resize(height, width, factor=28, min_pixels=3136, max_pixels=1003520):
    """Qwen2-VL's resize rule, written here from its description (transformers'
    image_processing_qwen2_vl.smart_resize): each side to the nearest multiple
    of patch * merge = 28, then scaled down (floor) or up (ceil) to fit the
    pixel bounds. Returns (height, width)."""
    import math

    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def grid_of(width, height):
    h, w = smart_resize(height, width)
    return (1, h // 14, w // 14)


def test_every_result_carries_the_grid_smart_resize_gives(client):
    # (width, height): 100x60 -> 112x56 -> (1, 4, 8); 300x200 -> 308x196 ->
    # (1, 14, 22); 30x25 is below min_pixels and is scaled up to 84x56 ->
    # (1, 4, 6).
    sizes = [(100, 60), (300, 200), (30, 25)]
    imgs = [h.png(w_, h_, 40 + i) for i, (w_, h_) in enumerate(sizes)]
    first = client.encode(imgs)
    again = client.encode(imgs)
    assert [r.source for r in again] == ["l1"] * 3
    for r, a, (w_, h_) in zip(first, again, sizes):
        want = grid_of(w_, h_)
        assert r.grid_thw == want and a.grid_thw == want
        t, gh, gw = want
        assert r.tokens == t * gh * gw // 4


@pytest.fixture
def torch_np():
    torch = pytest.importorskip("torch")
    import numpy as np
    return torch, np


def _rows(r):
    """main and deepstack parsed with struct, without epd: [tokens][cols] floats."""
    main = struct.unpack(f"<{r.tokens * r.hidden}f", r.main)
    deep = struct.unpack(f"<{r.tokens * r.hidden * r.deepstack_layers}f", r.deepstack)
    cols = r.hidden * r.deepstack_layers
    return ([list(main[t * r.hidden:(t + 1) * r.hidden]) for t in range(r.tokens)],
            [list(deep[t * cols:(t + 1) * cols]) for t in range(r.tokens)])


def test_to_vllm_is_the_main_then_deepstack_columns_and_a_1x3_grid(client, torch_np):
    torch, _ = torch_np
    [r] = client.encode([h.png(100, 60, 50)])
    d = r.to_vllm()
    assert set(d) == {"image_embeds", "image_grid_thw"}
    e, g = d["image_embeds"], d["image_grid_thw"]
    assert e.dtype == torch.float32 and tuple(e.shape) == (8, HIDDEN * (1 + DEEPSTACK))
    assert g.dtype == torch.int64 and g.tolist() == [list(grid_of(100, 60))]
    main, deep = _rows(r)
    assert e.tolist() == [m + d_ for m, d_ in zip(main, deep)]
    # Without deepstack (a Qwen2/2.5-VL prefill): the main rows alone.
    assert r.to_vllm(deepstack=False)["image_embeds"].tolist() == main


def test_to_vllm_batch_stacks_rows_and_grids_in_the_given_order(client, torch_np):
    sizes = [(56, 56), (100, 60), (300, 200)]
    results = client.encode([h.png(w_, h_, 60 + i) for i, (w_, h_) in enumerate(sizes)])
    order = [results[2], results[0], results[1]]
    d = ec.to_vllm_batch(order)
    assert d["image_grid_thw"].tolist() == [list(grid_of(*sizes[2])), list(grid_of(*sizes[0])),
                                            list(grid_of(*sizes[1]))]
    want = []
    for r in order:
        main, deep = _rows(r)
        want += [m + d_ for m, d_ in zip(main, deep)]
    assert tuple(d["image_embeds"].shape) == (4 + 8 + 77, HIDDEN * (1 + DEEPSTACK))
    assert d["image_embeds"].tolist() == want


def test_to_vllm_refuses_a_failed_item(client):
    results = client.encode([b"not an image", h.png(56, 56, 70)], check=False)
    assert not results[0].ok and results[0].grid_thw is None
    with pytest.raises(ValueError, match="item 0 failed"):
        results[0].to_vllm()
    with pytest.raises(ValueError, match="item 0 failed"):
        ec.to_vllm_batch(results)

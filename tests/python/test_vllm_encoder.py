"""epd-encode as vLLM's encoder instance (docs/VLLM.md), driven from the
contract vLLM's own code documents, with real processes only: `epd-encode
serve --http-port` servers, media origins of ours on loopback
(media_origin.py, stopped by PID), and the files they publish read with a
safetensors reader of this file's own.

The proxy's side (vLLM examples/disaggregated/disaggregated_encoder/
disagg_epd_proxy.py, as docs/VLLM.md describes it): each image_url /
video_url part gets uuid = sha256(its url) and goes to the encoder's POST
/v1/chat/completions; the encoder's reply carries ec_transfer_params
{id: {"metadata": {...grid...}, "item_indices": [...]}}; a consumer with
ECExampleConnector then loads <shared_storage_path>/<id>/
encoder_cache.safetensors["ec_cache"].

Independent values: rows from `epd-encode client --out` (the gRPC path) for
the same bytes, interleaved here (main row, then its deepstack row); the
tiny Qwen3-VL checkpoint's out_hidden_size and deepstack_visual_indexes read
from its config.json; tokens = t*h*w / merge_size^2 with merge 2; video
timestamps from the gRPC client's sampled frame times."""

import base64
import hashlib
import http.client
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

import pytest

import child_process
import server_harness as h

reason = h.missing_reason()
if reason:
    pytest.skip(reason, allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
TOKEN = "vllm-e2e-token"
QWEN3 = os.path.join(h.build_dir(), "models", "tiny-qwen3_vl")


# --- the consumer's side: a minimal safetensors reader -------------------------

def read_safetensors(path):
    """{name: (dtype, shape, bytes)}: 8-byte little-endian header length,
    the JSON header, then the data (safetensors' README, "Format")."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    data = blob[8 + n:]
    out = {}
    for name, t in header.items():
        a, b = t["data_offsets"]
        out[name] = (t["dtype"], t["shape"], data[a:b])
    assert 8 + n + max((t["data_offsets"][1] for t in header.values()), default=0) == len(blob)
    return out


def interleave(main, deep, tokens, row_main, row_deep):
    """Each main row followed by its deepstack row (bytes)."""
    return b"".join(main[r * row_main:(r + 1) * row_main] + deep[r * row_deep:(r + 1) * row_deep]
                    for r in range(tokens))


# --- the proxy's side ------------------------------------------------------------

def data_url(blob, mime="image/png"):
    return f"data:{mime};base64," + base64.b64encode(blob).decode()


def image_part(url):
    return {"type": "image_url", "image_url": {"url": url}}


def content_uuid(part):
    """As the proxy derives an item's uuid: sha256 of its URL."""
    url = (part.get("image_url") or part.get("video_url") or {}).get("url") or ""
    return hashlib.sha256((url or json.dumps(part, sort_keys=True)).encode()).hexdigest()


def encoder_request(parts, uuids=True, model=None):
    content = [dict(p, uuid=content_uuid(p)) if uuids else p for p in parts]
    return {"model": model, "messages": [{"role": "user", "content": content}], "stream": False}


def match_items(params, n):
    """The proxy's reading of ec_transfer_params: item index -> (id, metadata);
    every index in range, none twice."""
    by_index = {}
    for mm_hash, reported in params.items():
        for i in reported["item_indices"]:
            assert type(i) is int and 0 <= i < n and i not in by_index
            by_index[i] = (mm_hash, reported["metadata"])
    assert sorted(by_index) == list(range(n))
    return by_index


class Encoder:
    """A running `epd-encode serve` with its HTTP front."""

    def __init__(self, extra, token=TOKEN):
        self.tmp = tempfile.mkdtemp(prefix="epd-vllm-")
        self.ec_dir = os.path.join(self.tmp, "ec")
        self.local = os.path.join(self.tmp, "local")
        os.mkdir(self.local)
        self.token = token
        args = ["--http-port", "0", "--ec-dir", self.ec_dir, "--metrics-port", "0", "--allowed-local-media-path",
                self.local]
        if token:
            self.token_file = os.path.join(self.tmp, "token")
            with open(self.token_file, "w") as f:
                f.write(token + "\n")
            args += ["--auth-token-file", self.token_file]
        self.proc, self.grpc_port, self.metrics_port = h.start_server(args + extra, timeout=120)
        self.http_port = int(self.proc.ready["http_port"])

    def close(self):
        assert h.stop_server(self.proc) == 0, h.server_stderr(self.proc)
        shutil.rmtree(self.tmp)

    def request(self, method, path, body=b"", headers=None, port=None):
        conn = http.client.HTTPConnection("127.0.0.1", port or self.http_port, timeout=60)
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        data = r.read()
        conn.close()
        return r.status, data

    def post(self, body, content_type="application/json", token=None):
        headers = {"Content-Type": content_type}
        tok = self.token if token is None else token
        if tok:
            headers["Authorization"] = f"Bearer {tok}"
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        status, data = self.request("POST", "/v1/chat/completions", raw, headers)
        try:
            return status, json.loads(data)
        except ValueError:
            return status, data

    def metrics(self, token=None):
        tok = self.token if token is None else token
        return self.request("GET", "/metrics", headers={"Authorization": f"Bearer {tok}"} if tok else {},
                            port=self.metrics_port)

    def counter(self, name):
        status, text = self.metrics()
        assert status == 200
        m = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text.decode(), re.M)
        return float(m.group(1)) if m else 0.0

    def grpc_rows(self, path, extra=()):
        """The gRPC client's --out for one file: (key hex, main, deep, grid, dtype, hidden, layers)."""
        out = os.path.join(self.tmp, "grpc.safetensors")
        cmd = [h.encode_binary(), "client", "--server", f"127.0.0.1:{self.grpc_port}", "--out", out, path, *extra]
        if self.token:
            cmd += ["--auth-token-file", self.token_file]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)
        t = read_safetensors(out)
        key = next(k for k in t if re.fullmatch("[0-9a-f]{64}", k))
        dtype, (tokens, hidden), main = t[key]
        deep = t.get(key + ".deepstack", (dtype, [tokens, 0], b""))
        grid = list(struct.unpack("<3q", t[key + ".grid_thw"][2]))
        return key, main, deep[2], grid, dtype, hidden, deep[1][1] // hidden

    def file(self, mm_id):
        return os.path.join(self.ec_dir, mm_id, "encoder_cache.safetensors")


@pytest.fixture(scope="module")
def encoder():
    e = Encoder(h.tiny_serve_args() + ["--http-max-body-mb", "1", "--http-body-timeout-s", "1",
                                       "--media-fetch-timeout-s", "3", "--allowed-media-networks", "127.0.0.2/32"])
    yield e
    e.close()


def start_origin(bind, directory):
    proc = child_process.popen([sys.executable, os.path.join(HERE, "media_origin.py"), "--bind", bind, "--dir",
                                directory, "--slow-s", "10"], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("READY "), line
    return proc, int(line.split("port=")[1])


@pytest.fixture(scope="module")
def origins(encoder):
    """An origin on 127.0.0.2 (allowed by --allowed-media-networks) and one on
    127.0.0.1 (loopback: refused), both serving a.png."""
    d = os.path.join(encoder.tmp, "www")
    os.mkdir(d)
    with open(os.path.join(d, "a.png"), "wb") as f:
        f.write(h.png(40, 30, 77))
    allowed, p2 = start_origin("127.0.0.2", d)
    private, p1 = start_origin("127.0.0.1", d)
    yield {"allowed": f"http://127.0.0.2:{p2}", "private": f"http://127.0.0.1:{p1}", "png": h.png(40, 30, 77)}
    h.stop_pid(allowed)
    h.stop_pid(private)


def check_file_matches_grpc(encoder, mm_id, grpc):
    key, main, deep, grid, dtype, hidden, layers = grpc
    tensors = read_safetensors(encoder.file(mm_id))
    assert list(tensors) == ["ec_cache"]
    got_dtype, shape, rows = tensors["ec_cache"]
    tokens = len(main) // (hidden * 4)
    assert got_dtype == dtype == "F32"
    assert shape == [tokens, hidden * (1 + layers)]
    assert tokens == grid[0] * grid[1] * grid[2] // 4
    assert rows == interleave(main, deep, tokens, hidden * 4, hidden * layers * 4)
    return tokens


def test_one_image_is_published_as_the_grpc_client_sees_it(encoder):
    path = os.path.join(encoder.tmp, "one.png")
    with open(path, "wb") as f:
        f.write(h.png(64, 48, 1))
    grpc = encoder.grpc_rows(path)
    part = image_part(data_url(open(path, "rb").read()))
    status, reply = encoder.post(encoder_request([part]))
    assert status == 200, reply
    assert reply["object"] == "chat.completion" and reply["choices"][0]["message"]["role"] == "assistant"
    [(mm_id, meta)] = match_items(reply["ec_transfer_params"], 1).values()
    assert mm_id == content_uuid(part)
    assert meta == {"image_grid_thw": grpc[3]}
    tokens = check_file_matches_grpc(encoder, mm_id, grpc)
    assert reply["usage"]["prompt_tokens"] == tokens
    # Without a uuid the id is the content key, the gRPC client's key.
    status, reply = encoder.post(encoder_request([part], uuids=False))
    assert status == 200
    assert list(reply["ec_transfer_params"]) == [grpc[0]]
    assert open(encoder.file(grpc[0]), "rb").read() == open(encoder.file(mm_id), "rb").read()


def test_several_items_duplicates_and_two_uuids_for_one_image(encoder):
    a, b, c = (image_part(data_url(h.png(48, 48, s))) for s in (11, 12, 13))
    status, reply = encoder.post(encoder_request([a, b, a]))
    assert status == 200, reply
    params = reply["ec_transfer_params"]
    assert params[content_uuid(a)]["item_indices"] == [0, 2]
    assert params[content_uuid(b)]["item_indices"] == [1]
    assert len(params) == 2
    for mm_id in params:
        assert os.path.isfile(encoder.file(mm_id))
    # Two uuids naming the same bytes: two files, one tower run.
    before = encoder.counter("epd_tower_items_total")
    status, reply = encoder.post({"messages": [{"role": "user", "content": [dict(c, uuid="same-1"),
                                                                            dict(c, uuid="same-2")]}]})
    assert status == 200, reply
    assert sorted(reply["ec_transfer_params"]) == ["same-1", "same-2"]
    assert open(encoder.file("same-1"), "rb").read() == open(encoder.file("same-2"), "rb").read()
    assert encoder.counter("epd_tower_items_total") == before + 1
    # One uuid naming two different images is refused.
    status, reply = encoder.post({"messages": [{"role": "user", "content": [dict(a, uuid="clash"),
                                                                            dict(b, uuid="clash")]}]})
    assert status == 400 and reply["error"]["code"] == "uuid_conflict", reply


def test_grpc_and_http_share_one_cache(encoder):
    path = os.path.join(encoder.tmp, "shared.png")
    with open(path, "wb") as f:
        f.write(h.png(50, 40, 21))
    encoder.grpc_rows(path)  # the miss, over gRPC
    misses = encoder.counter("epd_cache_misses_total")
    status, _ = encoder.post(encoder_request([image_part(data_url(open(path, "rb").read()))]))
    assert status == 200
    assert encoder.counter("epd_cache_misses_total") == misses  # an L1 hit


@pytest.fixture(scope="module")
def mp4(encoder):
    if shutil.which("ffmpeg") is None:
        pytest.skip("ffmpeg CLI not found")
    path = os.path.join(encoder.tmp, "clip.mp4")
    subprocess.run(["ffmpeg", "-y", "-loglevel", "error", "-f", "lavfi", "-i", "testsrc=size=160x120:rate=10",
                    "-frames:v", "20", "-pix_fmt", "yuv420p", path], check=True)
    return path


def test_a_video_item(encoder, mp4):
    grpc = encoder.grpc_rows(mp4)
    part = {"type": "video_url", "video_url": {"url": data_url(open(mp4, "rb").read(), "video/mp4")}}
    status, reply = encoder.post(encoder_request([part]))
    assert status == 200, reply
    [(mm_id, meta)] = match_items(reply["ec_transfer_params"], 1).values()
    assert grpc[3][0] == 2  # 4 sampled frames, 2 per temporal patch
    # The tiny tower has a deepstack layer, so it is taken for Qwen3-VL, whose
    # placeholders need each temporal patch's time: 2 s at 10 fps sampled at
    # 2 fps gives frames at 0, 0.6, 1.3 and 1.9 s (test_client_video.py), so
    # patches at (0 + 0.6) / 2 and (1.3 + 1.9) / 2.
    assert grpc[6] == 1
    assert meta["video_grid_thw"] == grpc[3]
    assert meta["timestamps"] == pytest.approx([0.3, 1.6])
    assert set(meta) == {"video_grid_thw", "timestamps"}
    check_file_matches_grpc(encoder, mm_id, grpc)


def test_media_from_an_allowed_origin_and_a_local_file(encoder, origins):
    status, reply = encoder.post(encoder_request([image_part(origins["allowed"] + "/a.png")]))
    assert status == 200, reply
    by_url = open(encoder.file(next(iter(reply["ec_transfer_params"]))), "rb").read()
    local = os.path.join(encoder.local, "a.png")
    with open(local, "wb") as f:
        f.write(origins["png"])
    status, reply = encoder.post(encoder_request([image_part("file://" + local)]))
    assert status == 200, reply
    assert open(encoder.file(next(iter(reply["ec_transfer_params"]))), "rb").read() == by_url


def slow_body(encoder):
    s = socket.create_connection(("127.0.0.1", encoder.http_port), timeout=30)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Authorization: Bearer " + TOKEN.encode() + b"\r\nContent-Length: 1000\r\n\r\n{\"messages\":")
    data = b""
    while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    s.close()
    status = int(data.split(b" ")[1])
    return status, json.loads(data.split(b"\r\n\r\n", 1)[1])


def test_bad_input_gets_its_status_and_the_server_keeps_serving(encoder, origins):
    good = encoder_request([image_part(data_url(h.png(32, 32, 5)))])
    outside = os.path.join(encoder.tmp, "outside.png")
    with open(outside, "wb") as f:
        f.write(h.png(32, 32, 6))
    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        closed = s.getsockname()[1]  # nothing listens here once closed
    cases = [
        ("malformed JSON", lambda: encoder.post(b"{not json"), 400, "invalid_json"),
        ("wrong content type", lambda: encoder.post(json.dumps(good).encode(), "text/plain"), 415,
         "unsupported_media_type"),
        ("body over the limit", lambda: encoder.post(encoder_request([image_part(data_url(os.urandom(1 << 20)))])),
         413, "request_too_large"),
        ("slow body", lambda: slow_body(encoder), 408, "request_timeout"),
        ("unreachable URL", lambda: encoder.post(encoder_request([image_part(f"http://127.0.0.2:{closed}/a.png")])),
         502, "media_fetch_failed"),
        ("private address", lambda: encoder.post(encoder_request([image_part(origins["private"] + "/a.png")])), 400,
         "media_url_refused"),
        ("redirect to a private address",
         lambda: encoder.post(encoder_request([image_part(origins["allowed"] + "/redirect?to=" + origins["private"] +
                                                          "/a.png")])), 400, "media_url_refused"),
        ("file:// outside the allowed path", lambda: encoder.post(encoder_request([image_part("file://" + outside)])),
         400, "media_url_refused"),
        ("wrong token", lambda: encoder.post(good, token="not-it"), 401, "invalid_api_key"),
        ("undecodable image", lambda: encoder.post(encoder_request([image_part(data_url(b"not an image at all"))])),
         422, "undecodable_media"),
        ("another model", lambda: encoder.post(dict(good, model="Qwen/Qwen2.5-VL-3B-Instruct")), 404,
         "model_not_found"),
        ("processing kwargs", lambda: encoder.post(dict(good, mm_processor_kwargs={"max_pixels": 1000})), 400,
         "processing_kwargs_refused"),
        ("too many media items", lambda: encoder.post(encoder_request([image_part(data_url(h.png(8, 8, 7)))] * 257)),
         400, "too_many_items"),
    ]
    for what, send, want_status, want_code in cases:
        status, reply = send()
        assert status == want_status, (what, reply)
        assert reply["error"]["code"] == want_code, (what, reply)
        assert reply["error"]["message"], what
        status, ok = encoder.post(good)
        assert status == 200, (what, ok)
    # The gRPC door's message for the same rule (CheckRequestShape, src/server/request_shape.cc).
    many = encoder.post(encoder_request([image_part(data_url(h.png(8, 8, 7)))] * 257))[1]["error"]["message"]
    assert many == ("the request has 257 items; this server accepts at most 256 per request "
                    "(split it, or raise --max-items-per-request)"), many
    refused = encoder.post(encoder_request([image_part(origins["private"] + "/a.png")]))[1]["error"]["message"]
    assert "127.0.0.1 (loopback)" in refused
    redirected = encoder.post(encoder_request([image_part(origins["allowed"] + "/redirect?to=" + origins["private"] +
                                                          "/a.png")]))[1]["error"]["message"]
    assert "redirect 1" in redirected and "127.0.0.1 (loopback)" in redirected
    assert encoder.request("GET", "/health")[0] == 200
    status, models = encoder.request("GET", "/v1/models", headers={"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and json.loads(models)["data"][0]["id"] == "tiny_tower.pt"


def test_metrics_count_the_front_and_need_the_token(encoder):
    assert encoder.metrics(token="")[0] == 401
    assert encoder.counter('epd_http_responses_total{status="200"}') >= 1
    assert encoder.counter("epd_ec_files_published_total") >= 1
    assert encoder.counter('epd_http_media_fetches_total{outcome="refused"}') >= 1


def test_the_directory_bound_deletes_the_oldest_file():
    e = Encoder(h.tiny_serve_args() + ["--ec-dir-max-mb", "0.0005", "--ec-dir-grace-s", "0"], token=None)
    try:
        ids = []
        for seed in (31, 32, 33):
            status, reply = e.post(encoder_request([image_part(data_url(h.png(32, 32, seed)))]))
            assert status == 200, reply
            ids += list(reply["ec_transfer_params"])
        # 524 bytes of bound, about 2 files of 4 x 128 floats... each publish
        # keeps only the file just written and evicts the older ones.
        assert [os.path.exists(e.file(i)) for i in ids] == [False, False, True]
        assert e.counter("epd_ec_files_evicted_total") == 2
    finally:
        e.close()


@pytest.fixture(scope="module")
def qwen3():
    if not os.path.isdir(QWEN3):
        pytest.skip(f"{QWEN3} is not built (target tiny_checkpoints)")
    e = Encoder(["--model", QWEN3, "--threads", "1"])
    yield e
    e.close()


def test_qwen3_vl_rows_are_main_then_each_deepstack_level(qwen3):
    with open(os.path.join(QWEN3, "config.json")) as f:
        vision = json.load(f)["vision_config"]
    width = vision["out_hidden_size"] * (1 + len(vision["deepstack_visual_indexes"]))
    path = os.path.join(qwen3.tmp, "q.png")
    with open(path, "wb") as f:
        f.write(h.png(300, 200, 9))
    grpc = qwen3.grpc_rows(path)
    assert grpc[5] * (1 + grpc[6]) == width
    part = image_part(data_url(open(path, "rb").read()))
    status, reply = qwen3.post(encoder_request([part]))
    assert status == 200, reply
    assert reply["ec_transfer_params"][content_uuid(part)]["metadata"] == {"image_grid_thw": grpc[3]}
    assert check_file_matches_grpc(qwen3, content_uuid(part), grpc) == reply["usage"]["prompt_tokens"]


def test_qwen3_vl_video_reports_one_timestamp_per_temporal_patch(qwen3, mp4):
    try:
        from epd import client as ec
    except ImportError as e:
        pytest.skip(f"epd.client is not importable ({e})")
    blob = open(mp4, "rb").read()
    with ec.EncodeClient(f"127.0.0.1:{qwen3.grpc_port}", timeout=120, auth_token=TOKEN) as c:
        [r] = c.encode([ec.Item(video=blob)])
    frames = r.timestamps_s
    want = [(frames[2 * k] + frames[min(2 * k + 1, len(frames) - 1)]) / 2 for k in range(r.grid_thw[0])]
    part = {"type": "video_url", "video_url": {"url": data_url(blob, "video/mp4")}}
    status, reply = qwen3.post(encoder_request([part]))
    assert status == 200, reply
    meta = reply["ec_transfer_params"][content_uuid(part)]["metadata"]
    assert meta["video_grid_thw"] == list(r.grid_thw)
    assert meta["timestamps"] == pytest.approx(want)


def test_the_cli_client_sends_files_through_the_front(encoder):
    path = os.path.join(encoder.tmp, "cli.png")
    with open(path, "wb") as f:
        f.write(h.png(64, 64, 55))
    grid = encoder.grpc_rows(path)[3]
    base = f"http://127.0.0.1:{encoder.http_port}"
    run = subprocess.run([h.encode_binary(), "client", "--http", base, "--auth-token-file", encoder.token_file,
                          "--uuid", "cli-item", path, path], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    tokens = grid[0] * grid[1] * grid[2] // 4
    lines = run.stdout.splitlines()
    assert lines[0] == f"index=0 id=cli-item kind=image grid={grid[0]}x{grid[1]}x{grid[2]}"
    assert re.fullmatch(rf"index=1 id=[0-9a-f]{{64}} kind=image grid={grid[0]}x{grid[1]}x{grid[2]}", lines[1])
    assert lines[2] == f"prompt_tokens={2 * tokens}"
    assert os.path.isfile(encoder.file("cli-item"))
    refused = subprocess.run([h.encode_binary(), "client", "--http", base, path], capture_output=True, text=True,
                             timeout=120)
    assert refused.returncode == 1
    assert refused.stderr.startswith("HTTP 401 AuthenticationError (invalid_api_key): ")

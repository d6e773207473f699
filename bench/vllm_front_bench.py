#!/usr/bin/python3
"""The OpenAI-compatible front (docs/VLLM.md) against the gRPC path, on one
`epd-encode serve` (the default model, a Qwen2.5-VL tower: a 512x512 image is
a 1x36x36 grid, 324 tokens of 512 float32, 663,552 bytes of rows).

Measured side by side in one run (issue 23, "Performance"):
  hit_http     an L1 hit through POST /v1/chat/completions: the image as a
               base64 data: URL in, the file published under a fresh uuid
               (<ec-dir> on /dev/shm), the reply read and parsed; one
               keep-alive connection (http.client, TCP_NODELAY as aiohttp
               sets it; the body built once per image, as a proxy forwards
               the client's data: URL)
  hit_http_present  the same with one fixed uuid: the file is already there
               and not rewritten
  hit_grpc     the same hit over gRPC, rows inline (epd.client, one channel)
  load_file    from a complete encoder_cache.safetensors to its rows in a
               torch tensor, as ECExampleConnector's safetensors.torch.
               load_file does on CPU (read, header parse, copy)
  load_shm     the same rows through our shared-memory path: copied out of
               the arena into a tensor once the reference has arrived
  hit_shm      that reference's call: an L1 hit with shm=True (epd.client)
  callers8     8 threads, each its own keep-alive connection, sending
               data-URL images (a pool of 32, all cached: the front's cost,
               not the tower's), fresh uuids: throughput and latency
Every latency is wall time in the caller, ms. Prints a markdown table and
writes it with the machine's description to --out (default: stdout only).
Run: bench/vllm_front_bench.py [--n 300] [--out docs/...]"""

import argparse
import base64
import http.client
import io
import json
import os
import platform
import socket
import statistics
import struct
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
import server_harness as h  # noqa: E402


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def row(name, ms, n=None, seconds=None):
    extra = f" | {n / seconds:.0f}" if n is not None else " | "
    return f"| {name} | {len(ms)} | {pct(ms, 50):.3f} | {pct(ms, 99):.3f}{extra} |"


_BODIES = {}


def body(png, uuid):
    """The request a proxy forwards: built once per image (a proxy has the
    client's data: URL already), the uuid spliced in."""
    key = id(png)
    if key not in _BODIES:
        url = "data:image/png;base64," + base64.b64encode(png).decode()
        text = json.dumps({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}, "uuid": "@UUID@"}]}], "stream": False})
        _BODIES[key] = text.encode().split(b"@UUID@")
    head, tail = _BODIES[key]
    return head + uuid.encode() + tail


def connect(port):
    """A keep-alive connection with TCP_NODELAY, as aiohttp (vLLM's proxy) opens them."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.connect()
    c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return c


def post(conn, data):
    conn.request("POST", "/v1/chat/completions", body=data, headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    out = json.loads(r.read())
    assert r.status == 200, out
    return out


def load_file(path, torch):
    """ECExampleConnector's load on CPU: the file's ec_cache as a tensor."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    meta = json.loads(blob[8:8 + n])["ec_cache"]
    a, b = meta["data_offsets"]
    return torch.frombuffer(bytearray(blob[8 + n + a:8 + n + b]), dtype=torch.float32).reshape(meta["shape"])


def timed(fn, n):
    out = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - t) * 1000)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    import torch
    from epd import client as ec

    png = h.png(512, 512, 42)
    ec_dir = tempfile.mkdtemp(prefix="epd-bench-ec-", dir="/dev/shm")
    proc, port, _ = h.start_server(["--threads", "2", "--http-port", "0", "--ec-dir", ec_dir, "--shm-arena-mb", "64"],
                                   timeout=120)
    http_port = int(proc.ready["http_port"])
    try:
        grpc = ec.EncodeClient(f"127.0.0.1:{port}", timeout=60)
        shm = ec.EncodeClient(f"127.0.0.1:{port}", timeout=60, shm=True)
        [first] = grpc.encode([ec.Item(image=png)])
        assert first.source == "miss" and first.grid_thw == (1, 36, 36), first.grid_thw
        conn = connect(http_port)
        post(conn, body(png, "warm"))
        results = {}
        # Interleaved in rounds so that drift on a shared machine hits all alike.
        for name in ("hit_http", "hit_http_present", "hit_grpc"):
            results[name] = []
        for r in range(a.n):
            for name, fn in (("hit_http", lambda: post(conn, body(png, f"fresh-{r}"))),
                             ("hit_http_present", lambda: post(conn, body(png, "warm"))),
                             ("hit_grpc", lambda: grpc.encode([ec.Item(image=png)]))):
                t = time.perf_counter()
                fn()
                results[name].append((time.perf_counter() - t) * 1000)
        path = os.path.join(ec_dir, "warm", "encoder_cache.safetensors")
        results["load_file"] = timed(lambda i: load_file(path, torch), a.n)

        results["load_shm"], results["hit_shm"] = [], []
        for i in range(a.n):
            t = time.perf_counter()
            [r] = shm.encode([ec.Item(image=png)])
            t1 = time.perf_counter()
            rows = torch.frombuffer(bytearray(r.main), dtype=torch.float32).reshape(r.tokens, r.hidden)
            t2 = time.perf_counter()
            assert rows.shape == (324, 512)
            r.release()
            results["hit_shm"].append((t1 - t) * 1000)
            results["load_shm"].append((t2 - t1) * 1000)
        pool = [h.png(448, 448, 1000 + i) for i in range(32)]
        for p in pool:
            grpc.encode([ec.Item(image=p)])
        lat, lock = [], threading.Lock()
        per = max(20, a.n // 4)

        def caller(k):
            c = connect(http_port)
            mine = []
            for i in range(per):
                t = time.perf_counter()
                post(c, body(pool[(k * 7 + i) % 32], f"c{k}-{i}"))
                mine.append((time.perf_counter() - t) * 1000)
            with lock:
                lat.extend(mine)

        t0 = time.perf_counter()
        threads = [threading.Thread(target=caller, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        grpc.close()
        shm.close()
    finally:
        h.stop_server(proc)
        for root, dirs, files in os.walk(ec_dir, topdown=False):
            for f in files:
                os.unlink(os.path.join(root, f))
            for d in dirs:
                os.rmdir(os.path.join(root, d))
        os.rmdir(ec_dir)
    lines = [f"Machine: {platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}; n = {a.n} per row.",
             "", "| case | calls | p50 ms | p99 ms | calls/s |", "| --- | --- | --- | --- | --- |"]
    for name in ("hit_http", "hit_http_present", "hit_grpc", "hit_shm", "load_file", "load_shm"):
        lines.append(row(name, results[name]))
    lines.append(row("callers8 (8 threads, 448x448 hits, fresh uuids)", lat, len(lat), wall))
    ratio = pct(results["hit_http"], 50) / pct(results["hit_grpc"], 50)
    lines += ["", f"hit_http p50 / hit_grpc p50 = {ratio:.2f} (target <= 1.5)"]
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Two server figures of issue 15 (docs/SERVER.md, "Memory" and "Fairness").

A benchmark run by hand, not a test: it starts real `epd-encode serve`
processes on loopback and reports what it measured.

memory    48 simultaneous requests of 60 MB each (one 56x56 PNG padded with
          zeros to 60 MB, so the header probes and the worker queues it; the
          same message each time, the server assigning the ids) from 48
          client threads. Reports the server's peak RSS (VmHWM), its RSS
          after 5 s idle, and how many calls succeeded or were refused.
          Run once per binary: --before (e.g. main's build, no budget) and
          --binary (this one, with --max-inflight-request-mb).
fairness  "light" clients send one 512x512 PNG per call, back to back, and
          their latency is measured; alone, then while two "heavy" clients
          each keep --heavy-depth calls of an 8000x8000 PNG (about 186 KB:
          one colour, so it compresses ~1000:1) in flight. Caching is off
          (--no-cache), so every call is a miss. Each client names its tenant
          with x-epd-tenant (they all connect from 127.0.0.1). Reported per
          --order: the light clients' p50/p99, and the heavy calls completed.

Usage:
  /usr/bin/python3 bench/server_memory_fairness.py --binary build/tools/epd-encode \
      --before build/base-build/tools/epd-encode --model build/models/default_tower.pt

Needs python3-grpcio, python3-protobuf, python3-pil, protoc and
grpc_python_plugin (scripts/install-deps.sh). Standard output: a JSON object
of every figure, then a short table.
"""
import argparse
import io
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import grpc
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
import child_process  # noqa: E402 - the server dies with this script


def load_stubs():
    out = tempfile.mkdtemp(prefix="epd-stubs-")
    proto_root = os.path.join(ROOT, "proto")
    subprocess.run(["protoc", "-I", proto_root, f"--python_out={out}", f"--grpc_out={out}",
                    "--plugin=protoc-gen-grpc=/usr/bin/grpc_python_plugin",
                    os.path.join(proto_root, "epd/v1/encoder.proto")], check=True)
    for d in ("epd", "epd/v1"):
        open(os.path.join(out, d, "__init__.py"), "a").close()
    sys.path.insert(0, out)
    from epd.v1 import encoder_pb2, encoder_pb2_grpc  # noqa: E402
    return encoder_pb2, encoder_pb2_grpc


pb, pb_grpc = load_stubs()


def png(width, height, colour=None, seed=0):
    if colour is not None:
        img = Image.new("RGB", (width, height), colour)
    else:
        img = Image.frombytes("RGB", (width, height), os.urandom(width * height * 3))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def rss_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class Server:
    def __init__(self, binary, args):
        self.proc = child_process.popen([binary, "serve", "--host", "127.0.0.1", "--port", "0", *args],
                                        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        m = re.search(r"READY port=(\d+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"server did not start: {line!r}")
        self.port = int(m.group(1))

    def channel(self):
        opts = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        return grpc.insecure_channel(f"127.0.0.1:{self.port}", options=opts)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def call(stub, request, tenant, timeout=120):
    try:
        for _ in stub.Encode(request, timeout=timeout, metadata=[("x-epd-tenant", tenant)]):
            pass
        return "OK"
    except grpc.RpcError as e:
        return e.code().name


def memory_run(binary, model, extra, n=48, mb=60):
    server = Server(binary, ["--model", model, "--threads", "1", "--max-request-mb", "64", *extra])
    try:
        # One message sent 48 times (the server assigns the ids): the server
        # holds each call's copy all the same, and the client stays small.
        body = png(56, 56, colour=(1, 254, 7))
        body += b"\0" * (mb * 1000 * 1000 - len(body))
        requests = [pb.EncodeRequest(items=[pb.EncodeItem(image=body)])] * n
        results = [None] * n
        stubs = [pb_grpc.EncoderStub(server.channel()) for _ in range(n)]
        start = threading.Barrier(n)

        def send(i):
            start.wait()
            results[i] = call(stubs[i], requests[i], f"mem-{i}")
            print(f"  call {i}: {results[i]} at {time.time() - t0:.1f} s", file=sys.stderr, flush=True)

        threads = [threading.Thread(target=send, args=(i,)) for i in range(n)]
        print(f"memory run: {n} x {mb} MB requests built", file=sys.stderr, flush=True)
        t0 = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.time() - t0
        peak = rss_kb(server.proc.pid, "VmHWM")
        time.sleep(5)
        idle = rss_kb(server.proc.pid, "VmRSS")
        counts = {}
        for r in results:
            counts[r] = counts.get(r, 0) + 1
        return {"peak_rss_mb": peak / 1024, "idle_rss_mb_after_5s": idle / 1024, "outcomes": counts,
                "burst_s": elapsed}
    finally:
        server.stop()


def percentile(sorted_values, q):
    if not sorted_values:
        return float("nan")
    k = max(1, int(-(-q * len(sorted_values) // 1)))
    return sorted_values[min(k, len(sorted_values)) - 1]


def fairness_run(binary, model, order, heavy, duration_s, lights=2, heavy_depth=2, decode_threads=3):
    server = Server(binary, ["--model", model, "--threads", "1", "--no-cache", "--order", order,
                             "--decode-threads", str(decode_threads)])
    stop = threading.Event()
    light_ms = []
    heavy_done = [0]
    errors = {}
    lock = threading.Lock()
    try:
        light_img = [png(512, 512, seed=k) for k in range(lights)]
        heavy_imgs = [png(8000, 8000, colour=(10 * k, 200, 30)) for k in range(2)] if heavy else []

        def light(k):
            stub = pb_grpc.EncoderStub(server.channel())
            req = pb.EncodeRequest(items=[pb.EncodeItem(image=light_img[k])])
            while not stop.is_set():
                t = time.perf_counter()
                r = call(stub, req, f"light-{k}")
                ms = (time.perf_counter() - t) * 1e3
                with lock:
                    if r == "OK":
                        light_ms.append(ms)
                    else:
                        errors[r] = errors.get(r, 0) + 1

        def heavy_client(k):
            stub = pb_grpc.EncoderStub(server.channel())
            req = pb.EncodeRequest(items=[pb.EncodeItem(image=heavy_imgs[k % 2])])
            while not stop.is_set():
                r = call(stub, req, f"heavy-{k % 2}", timeout=600)
                with lock:
                    if r == "OK":
                        heavy_done[0] += 1
                    else:
                        errors["heavy " + r] = errors.get("heavy " + r, 0) + 1

        threads = []
        if heavy:
            threads += [threading.Thread(target=heavy_client, args=(k,)) for k in range(2 * heavy_depth)]
            for t in threads:
                t.start()
            time.sleep(3)  # let the heavy queue build up first
        light_threads = [threading.Thread(target=light, args=(k,)) for k in range(lights)]
        for t in light_threads:
            t.start()
        time.sleep(duration_s)
        stop.set()
        for t in light_threads:
            t.join()
        with lock:
            values = sorted(light_ms)
        out = {"order": order, "heavy": heavy, "light_calls": len(values),
               "light_p50_ms": percentile(values, 0.5), "light_p99_ms": percentile(values, 0.99),
               "heavy_calls_done": heavy_done[0], "errors": dict(errors)}
        server.stop()  # heavy calls in flight end with UNAVAILABLE/CANCELLED
        for t in threads:
            t.join()
        return out
    finally:
        stop.set()
        server.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", required=True, help="epd-encode with the admission budget and --order fair")
    ap.add_argument("--before", help="epd-encode to compare for memory (e.g. main's build)")
    ap.add_argument("--model", required=True)
    ap.add_argument("--budget-mb", type=float, default=1024)
    ap.add_argument("--duration-s", type=float, default=40)
    ap.add_argument("--heavy-depth", type=int, default=2, help="calls each heavy client keeps in flight")
    ap.add_argument("--decode-threads", type=int, default=3)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--request-mb", type=int, default=60)
    ap.add_argument("--skip", choices=["memory", "fairness"], action="append", default=[])
    a = ap.parse_args()
    report = {"cpus": os.cpu_count()}
    if "memory" not in a.skip:
        if a.before:
            report["memory_before"] = memory_run(a.before, a.model, [], a.requests, a.request_mb)
        report["memory_after"] = memory_run(a.binary, a.model, ["--max-inflight-request-mb", str(a.budget_mb)],
                                            a.requests, a.request_mb)
    if "fairness" not in a.skip:
        runs = []
        for order in ("fifo", "fair"):
            runs.append(fairness_run(a.binary, a.model, order, False, a.duration_s / 2, heavy_depth=a.heavy_depth,
                                     decode_threads=a.decode_threads))
            runs.append(fairness_run(a.binary, a.model, order, True, a.duration_s, heavy_depth=a.heavy_depth,
                                     decode_threads=a.decode_threads))
        report["fairness"] = runs
    print(json.dumps(report, indent=2))
    for k in ("memory_before", "memory_after"):
        if k in report:
            m = report[k]
            print(f"{k:14s} peak {m['peak_rss_mb']:8.0f} MB  idle {m['idle_rss_mb_after_5s']:8.0f} MB  {m['outcomes']}")
    for r in report.get("fairness", []):
        print(f"{r['order']:5s} heavy={'yes' if r['heavy'] else 'no ':3s} light p50 {r['light_p50_ms']:8.1f} ms "
              f"p99 {r['light_p99_ms']:8.1f} ms  ({r['light_calls']} calls; heavy done {r['heavy_calls_done']})")


if __name__ == "__main__":
    main()

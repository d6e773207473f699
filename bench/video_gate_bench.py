#!/usr/bin/python3
"""Another client's cache hits while one client's video decodes (issue 27,
fault 1; docs/VIDEO.md, "Decode off the loop thread").

A benchmark run by hand, not a test. It starts a real `epd-encode serve`,
caches one small image, then measures that image's hit latency from a client
of its own (one call at a time, --hits calls):

  solo     with nothing else running;
  decode   while another client sends an 8000x8000 MJPEG video (made with
           ffmpeg, --frames frames) and waits for its reply, again and
           again, so that a container decode is running for the whole
           phase; the phase lasts as long as --hits hits take, and each hit
           is stamped with whether a decode was running when it was sent.

Each video is a fresh file (its first frame differs), so none is a cache hit
and every one decodes all its frames at 8000x8000 before the resize.

Usage:
  /usr/bin/python3 bench/video_gate_bench.py --build build [-- extra serve flags]

Needs ffmpeg, the build's Python package (build/python: epd.client) and
python3-grpcio. Prints one line per phase, then a JSON object.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))


def percentile(values, q):
    s = sorted(values)
    if not s:
        return float("nan")
    i = min(len(s) - 1, max(0, int(round(q / 100.0 * (len(s) - 1)))))
    return s[i]


def make_video(path: str, side: int, frames: int, seed: int) -> None:
    """An MJPEG AVI of `frames` frames at side x side; `seed` moves the test
    pattern so each file has bytes of its own."""
    subprocess.run(["ffmpeg", "-v", "error", "-nostdin", "-y", "-f", "lavfi", "-i",
                    f"testsrc2=size={side}x{side}:rate=2,hue=h={seed * 37 % 360}", "-frames:v", str(frames),
                    "-c:v", "mjpeg", "-q:v", "8", path], check=True)


def hit_latencies(client, image, n, busy):
    """n sequential calls of one cached image; (ms, decode running?) each."""
    out = []
    for _ in range(n):
        during = busy.is_set()
        t0 = time.perf_counter()
        [r] = client.encode([image])
        ms = (time.perf_counter() - t0) * 1e3
        if r.source not in ("l1", "l2"):
            raise RuntimeError(f"the cached image came back as {r.source}")
        out.append((ms, during))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--hits", type=int, default=200)
    ap.add_argument("--side", type=int, default=8000)
    ap.add_argument("--frames", type=int, default=8)
    ap.add_argument("--videos", type=int, default=3, help="distinct video files to cycle through")
    ap.add_argument("extra", nargs="*", help="extra serve flags (after --)")
    a = ap.parse_args()
    os.environ.setdefault("EPD_BUILD_DIR", os.path.abspath(a.build))
    sys.path.insert(0, os.path.join(os.path.abspath(a.build), "python"))
    import server_harness as h  # noqa: E402
    from epd.client import EncodeClient, Item  # noqa: E402

    serve = h.tiny_serve_args() + ["--decode-threads", "2", "--video-max-frames", str(a.frames)] + a.extra
    tmp = tempfile.mkdtemp(prefix="video-gate-bench-")
    videos = []
    for i in range(a.videos):
        p = os.path.join(tmp, f"v{i}.avi")
        make_video(p, a.side, a.frames, i)
        with open(p, "rb") as f:
            videos.append(f.read())
    proc, port, _ = h.start_server(serve)
    result = {"side": a.side, "frames": a.frames, "hits": a.hits, "serve_flags": serve[2:]}
    try:
        image = h.png(96, 64, 7)
        with EncodeClient(f"127.0.0.1:{port}") as hitter, EncodeClient(f"127.0.0.1:{port}", timeout=600) as sender:
            [first] = hitter.encode([image])
            idle = threading.Event()
            solo = hit_latencies(hitter, image, a.hits, idle)

            busy, stop = threading.Event(), threading.Event()
            decode_ms, failures = [], []

            def send_videos():
                k = 0
                while not stop.is_set():
                    # A fresh key each time: the same bytes would be a cache
                    # hit after the first, so rotate files and vary sampling.
                    item = Item(video=videos[k % len(videos)])
                    busy.set()
                    t0 = time.perf_counter()
                    [r] = sender.encode([item], check=False, request_id=f"video-{k}")
                    busy.clear()
                    if r.ok and r.source == "miss":
                        decode_ms.append((time.perf_counter() - t0) * 1e3)
                    elif not r.ok:
                        failures.append(f"{r.code.name}: {r.message}")
                    k += 1
                    if k % len(videos) == 0:
                        # every file has been encoded once: later sends hit.
                        stop.set()

            t = threading.Thread(target=send_videos)
            t.start()
            time.sleep(0.2)
            during = hit_latencies(hitter, image, a.hits, busy)
            stop.set()
            t.join()
        for name, rows in (("solo", solo), ("decode", [r for r in during if r[1]])):
            ms = [r[0] for r in rows]
            result[name] = {"calls": len(ms), "p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99),
                            "max_ms": max(ms) if ms else float("nan")}
            print(f"{name:7s} calls {len(ms):4d}  p50 {result[name]['p50_ms']:.2f} ms  p99 "
                  f"{result[name]['p99_ms']:.2f} ms  max {result[name]['max_ms']:.2f} ms")
        result["video_miss_ms"] = decode_ms
        result["video_failures"] = failures
        result["first_source"] = first.source
        print(f"videos encoded while measuring: {len(decode_ms)} ({', '.join(f'{m:.0f}' for m in decode_ms)} ms); "
              f"failed: {len(failures)}")
    finally:
        h.stop_server(proc)
    with open("/proc/loadavg") as f:
        result["loadavg_after"] = f.read().split()[:3]
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

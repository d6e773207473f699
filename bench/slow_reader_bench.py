#!/usr/bin/python3
"""Two server figures of issue 27 (docs/SERVER.md, "Clients that stop reading").

A benchmark run by hand, not a test: it starts a real `epd-encode serve` and
drives it with the raw HTTP/2 peer of tests/python/h2_peer.py, which sets a
stream window of 0 so the server can send it no reply bytes at all.

stall     another client's miss latency, alone and then while a non-reading
          client holds 2 Encode streams of 256 cached items each (the item
          is a ~2.5 MB embedding, so 1.3 GB of replies wait for a reader that
          never reads). Misses are distinct 512x512 PNGs sent one at a time;
          a miss that takes longer than --miss-timeout-s ends the run of
          misses (the tower has stopped: the rest would wait as long).
memory    the server's RSS with --streams unread Encode streams of that
          cached item, spread over --connections connections: before they
          open, while they are held (the highest VmRSS seen over 3 s once the
          server has taken every stream, and VmHWM), and 5 s after the
          connections close. Also the server's own accounting (Stats).

Usage:
  /usr/bin/python3 bench/slow_reader_bench.py --binary build/tools/epd-encode \
      --model build/models/default_tower.pt --label after [-- extra serve flags]

Needs the build's Python package (build/python: epd.client) and
python3-grpcio. Standard output: one line per figure, then a JSON object.
"""
import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))

import h2_peer  # noqa: E402
import pngs  # noqa: E402
import server_harness as h  # noqa: E402

CACHED_KEY = b"slow-reader-bench-item"


def solid_png(width: int, height: int, seed: int) -> bytes:
    return pngs.striped_png(width, height, seed)


def rss_mb(pid: int, field: str = "VmRSS") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def pct(values, q):
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))] if s else float("nan")


def start(args, extra):
    flags = ["--model", args.model, "--threads", str(args.threads)] + extra
    proc, port, _ = h.start_server(flags, timeout=120)
    return proc, port


def seed(ec, port, width, height):
    with ec.EncodeClient(f"127.0.0.1:{port}", timeout=300) as c:
        [r] = c.encode([ec.Item(image=solid_png(width, height, 1), caller_key=CACHED_KEY)])
        return len(r.main) + len(r.deepstack)


def misses(ec, port, n, first_seed, timeout):
    """n distinct 512x512 misses, one at a time; ms each, stopping at the first
    that passes `timeout` (counted as None)."""
    out = []
    with ec.EncodeClient(f"127.0.0.1:{port}", timeout=timeout) as c:
        for i in range(n):
            img = solid_png(512, 512, first_seed + i)
            t0 = time.monotonic()
            try:
                c.encode([img])
            except ec.EncodeError:
                out.append(None)
                break
            out.append((time.monotonic() - t0) * 1000)
    return out


def stall(args, ec, extra):
    proc, port = start(args, extra)
    try:
        item = seed(ec, port, args.item_width, args.item_height)
        misses(ec, port, 3, 10_000, 60)  # warm-up
        solo = misses(ec, port, args.misses, 20_000, 60)
        peer = h2_peer.H2Peer(port)
        sids = [peer.open_encode(h2_peer.encode_request(f"stall-{i}", [CACHED_KEY] * 256), tenant="stalled")
                for i in range(2)]
        time.sleep(1.0)
        loaded = misses(ec, port, args.misses, 30_000, args.miss_timeout_s)
        still_open = len(sids) - len(peer.ended(sids))
        with ec.EncodeClient(f"127.0.0.1:{port}", timeout=30) as c:
            stats = c.stats()
        peer.close()
    finally:
        h.stop_server(proc)
    done = [v for v in loaded if v is not None]
    return {
        "item_bytes": item,
        "solo_ms": {"p50": pct(solo, 0.5), "p99": pct(solo, 0.99), "n": len(solo)},
        "loaded_ms": {"p50": pct(done, 0.5), "p99": pct(done, 0.99), "n": len(done),
                      "timed_out": sum(v is None for v in loaded), "asked": args.misses},
        "stalled_streams_still_open": still_open,
        "sink_full_stalls": stats.get("sink_full_stalls"),
        "buffered_bytes": stats.get("buffered_bytes"),
        "throttled_calls": stats.get("throttled_calls"),
    }


def memory(args, ec, extra):
    proc, port = start(args, extra)
    try:
        item = seed(ec, port, args.item_width, args.item_height)
        time.sleep(2.0)
        before = rss_mb(proc.pid)
        with ec.EncodeClient(f"127.0.0.1:{port}", timeout=30) as c:
            requests0 = c.stats()["requests"]
            peers = [h2_peer.H2Peer(port) for _ in range(args.connections)]
            sids = []
            per = args.streams // args.connections
            for n, p in enumerate(peers):
                sids.append([p.open_encode(h2_peer.encode_request(f"m{n}-{i}", [CACHED_KEY])) for i in range(per)])
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and c.stats()["requests"] - requests0 < per * len(peers):
                time.sleep(0.2)
            # Settled: the replies built (the queue of results stops changing)
            # and RSS steady, over 3 samples 0.5 s apart.
            during, last, steady = 0.0, None, 0
            while time.monotonic() < deadline and steady < 3:
                time.sleep(0.5)
                st = c.stats()
                now = (st["buffered_bytes"], st.get("reply_held_bytes"), round(rss_mb(proc.pid) / 10))
                steady = steady + 1 if now == last else 0
                last = now
                during = max(during, rss_mb(proc.pid))
            for _ in range(15):
                during = max(during, rss_mb(proc.pid))
                time.sleep(0.2)
            held = c.stats()
            refused = sum(p.stream(s).grpc_status() == 8 for p, ss in zip(peers, sids) for s in ss)
            for p in peers:
                p.close()
            time.sleep(5.0)
            after = rss_mb(proc.pid)
            idle = c.stats()
        hwm = rss_mb(proc.pid, "VmHWM")
    finally:
        h.stop_server(proc)
    return {
        "item_bytes": item, "streams": per * args.connections, "connections": args.connections,
        "rss_before_mb": round(before, 1), "rss_during_mb": round(during, 1), "rss_hwm_mb": round(hwm, 1),
        "rss_after_mb": round(after, 1), "refused_resource_exhausted": refused,
        "held": {k: held.get(k) for k in ("buffered_bytes", "reply_held_bytes", "reply_refusals")},
        "idle": {k: idle.get(k) for k in ("buffered_bytes", "reply_held_bytes")},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--label", default="")
    ap.add_argument("--build-dir", default=os.path.join(ROOT, "build"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--misses", type=int, default=20)
    ap.add_argument("--miss-timeout-s", type=float, default=20.0)
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--connections", type=int, default=5)
    # 560x588 -> 20x21 merged tokens = 420 tokens; default tower: 512 + 2 x 512 floats a token = 2.58 MB.
    ap.add_argument("--item-width", type=int, default=560)
    ap.add_argument("--item-height", type=int, default=588)
    ap.add_argument("--only", choices=("stall", "memory"))
    ap.add_argument("serve_args", nargs="*", help="extra flags for `epd-encode serve` (after --)")
    args = ap.parse_args()
    os.environ["EPD_ENCODE_BIN"] = os.path.abspath(args.binary)
    sys.path.insert(0, os.path.join(args.build_dir, "python"))
    from epd import client as ec  # noqa: E402

    out = {"label": args.label, "binary": args.binary, "serve_args": args.serve_args}
    if args.only in (None, "stall"):
        s = out["stall"] = stall(args, ec, args.serve_args)
        print(f"[{args.label}] miss alone p50/p99 {s['solo_ms']['p50']:.1f}/{s['solo_ms']['p99']:.1f} ms; under a "
              f"non-reading client p50/p99 {s['loaded_ms']['p50']:.1f}/{s['loaded_ms']['p99']:.1f} ms "
              f"({s['loaded_ms']['n']} done, {s['loaded_ms']['timed_out']} past {args.miss_timeout_s} s)")
    if args.only in (None, "memory"):
        m = out["memory"] = memory(args, ec, args.serve_args)
        print(f"[{args.label}] RSS with {m['streams']} unread streams: before {m['rss_before_mb']} MB, during "
              f"{m['rss_during_mb']} MB (HWM {m['rss_hwm_mb']}), 5 s after close {m['rss_after_mb']} MB; "
              f"{m['refused_resource_exhausted']} refused")
    print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Measures the Python reference on the workloads of cache_bench and
scheduler_bench, and prints the figures as JSON.

The reference (embedding_cache.py, encode_scheduler.py) is not part of this
repository; it is looked up in --reference, by default ../shared/reference
relative to the repository root. When it is absent the script says so, writes
a JSON object with a "skipped" reason (so bench/report.py can say why the
reference column is empty) and exits 0.

Every figure is named like the C++ benchmark it pairs with (see
bench/report.py). Times are process CPU time (time.process_time), as Google
Benchmark reports CPU time for single-threaded benchmarks, and include the
Python loop that drives the reference; "loop_overhead_ns" measures that loop
alone. Keys are Python ints (the engine keys its cache by an int item hash);
values are distinct objects, so a hit touches a per-entry object as the C++
hit touches a per-entry shared_ptr control block. The charge per entry is the
same 324 * 2048 * 2 bytes as in cache_bench.

Usage:
  /usr/bin/python3 bench/reference_bench.py [--reference DIR] [--streams DIR]
      [--out FILE] [--sched-limit-s 10] [--quick]
--streams is the directory written by `cache_bench --dump_streams=DIR`; the
key-stream figures are skipped without it.
"""

from __future__ import annotations

import argparse
import array
import gc
import json
import math
import os
import platform
import random
import sys
import time

CHARGE = 324 * 2048 * 2
RESIDENT = 1_000_000
HOT = 10_000
MAX_TOKENS = 16384  # must match bench/scheduler_bench.cc
MAX_ITEMS = 64
SCHEMA = "epd-bench-reference/1"
MASK64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """The splitmix64 output function; identical to Mix64 in the C++ benches."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def cpu_time() -> float:
    return time.process_time()


def loop_overhead_ns(keys) -> float:
    noop = id  # a trivial C-level call, standing in for the method call
    t0 = cpu_time()
    for k in keys:
        noop(k)
    return (cpu_time() - t0) * 1e9 / len(keys)


def bench_cache(ref, ops: int, n: int) -> dict:
    EmbeddingCache = ref["EmbeddingCache"]
    out = {}
    rng = random.Random(1234)
    values = [object() for _ in range(n)]

    def filled(entries: int, capacity_entries: int):
        c = EmbeddingCache(capacity_entries * CHARGE)
        put = c.put
        for i in range(entries):
            put(i, values[i % n], CHARGE)
        return c

    # get-hit with n resident (capacity 1.25 n, as in cache_bench).
    for size in (n, HOT):
        c = filled(size, size + size // 4)
        keys = [rng.randrange(size) for _ in range(ops)]
        get = c.get
        for k in keys[: min(ops, 3 * size)]:
            get(k)
        t0 = cpu_time()
        for k in keys:
            get(k)
        dt = cpu_time() - t0
        assert c.hits >= len(keys)
        out[f"hit/{size}"] = {"ns_per_op": dt * 1e9 / ops, "ops": ops}
        if size == n:
            out["loop_overhead_ns"] = loop_overhead_ns(keys)
        del c

    # get-miss and put-with-eviction at n.
    c = filled(n, n)
    keys = [(1 << 40) + rng.randrange(1 << 40) for _ in range(ops)]
    get = c.get
    t0 = cpu_time()
    for k in keys:
        get(k)
    out[f"miss/{n}"] = {"ns_per_op": (cpu_time() - t0) * 1e9 / ops, "ops": ops}
    # New keys cycle over 2n ids, so each was evicted n puts earlier.
    put = c.put
    fresh = [(n + j) % (2 * n) for j in range(ops)]
    t0 = cpu_time()
    for i, k in enumerate(fresh):
        put(k, values[i % n], CHARGE)
    out[f"put_evict/{n}"] = {"ns_per_op": (cpu_time() - t0) * 1e9 / ops, "ops": ops}
    del c
    return out


def bench_tiered(ref, quick: bool) -> dict:
    Tiered = ref["TieredEmbeddingCache"]
    out = {}
    for kind in ("identity", "memcpy"):
        n1, n2 = (16, 64) if kind == "memcpy" else (HOT, 10 * HOT)
        if kind == "memcpy":
            copy = bytearray  # allocates and copies the payload
            payload = bytearray(b"\x01" * CHARGE)
            ops = 200 if quick else 2000
        else:
            copy = lambda v: v  # noqa: E731 - the identity copy
            payload = None
            ops = 1 << (14 if quick else 18)
        values = [object() for _ in range(n1 + n2)]
        # Promote: keys cycle in insertion order, so each get hits L2.
        t = Tiered(n1 * CHARGE, n2 * CHARGE, to_host=copy, to_device=copy)
        for i in range(n1 + n2):
            t.put(i, payload if payload is not None else values[i], CHARGE)
        p0, d0 = t.promotions, t.demotions
        get = t.get
        total = n1 + n2
        seq = [i % total for i in range(ops)]
        t0 = cpu_time()
        for k in seq:
            get(k)
        dt = cpu_time() - t0
        out[f"tiered_promote/{kind}"] = {
            "ns_per_op": dt * 1e9 / ops,
            "ops": ops,
            "promotions_per_op": (t.promotions - p0) / ops,
            "demotions_per_op": (t.demotions - d0) / ops,
        }
        del t
        # Demote: new keys into a full L1; L2 drops its LRU.
        t = Tiered(n1 * CHARGE, n2 * CHARGE, to_host=copy, to_device=copy)
        universe = 2 * total
        for i in range(total):
            t.put(i, payload if payload is not None else values[i], CHARGE)
        d0 = t.demotions
        put = t.put
        seq = [(total + i) % universe for i in range(ops)]
        vals = [payload if payload is not None else values[i % total] for i in range(ops)]
        t0 = cpu_time()
        for k, v in zip(seq, vals):
            put(k, v, CHARGE)
        dt = cpu_time() - t0
        out[f"tiered_demote/{kind}"] = {
            "ns_per_op": dt * 1e9 / ops,
            "ops": ops,
            "demotions_per_op": (t.demotions - d0) / ops,
        }
        del t
    return out


def bench_streams(ref, streams_dir: str, quick: bool) -> dict:
    EmbeddingCache = ref["EmbeddingCache"]
    with open(os.path.join(streams_dir, "streams.json")) as f:
        meta = json.load(f)
    capacity = meta["capacity_entries"] * meta["charge"]
    warm, length = meta["warm"], meta["length"]
    if quick:
        warm, length = warm // 8, warm // 8 + (length - warm) // 8
    values = [object() for _ in range(RESIDENT)]
    out = {}
    for name, file in meta["streams"].items():
        ranks = array.array("I")
        with open(os.path.join(streams_dir, file), "rb") as f:
            ranks.frombytes(f.read())
        if sys.byteorder != "little":
            ranks.byteswap()
        c = EmbeddingCache(capacity)
        get, put = c.get, c.put
        nvals = len(values)
        for r in ranks[:warm]:
            if get(r) is None:
                put(r, values[r % nvals], meta["charge"])
        timed = ranks[warm:length]
        h0 = c.hits
        t0 = cpu_time()
        for r in timed:
            if get(r) is None:
                put(r, values[r % nvals], CHARGE)
        dt = cpu_time() - t0
        hits = c.hits - h0
        out[f"stream/{name}"] = {
            "ns_per_op": dt * 1e9 / len(timed),
            "ops": len(timed),
            "hits": hits,
            "lookups": len(timed),
            "hit_ratio": hits / len(timed),
            "warm_ops": warm,
        }
        del c
    return out


def make_item(PendingEncodeItem, i: int):
    return PendingEncodeItem("%016x" % mix64(i // 2), i % 2, 16 + mix64(i) % 1284)


def bench_scheduler(ref, limit_s: float, quick: bool) -> dict:
    EncodeScheduler, PendingEncodeItem = ref["EncodeScheduler"], ref["PendingEncodeItem"]
    out = {}
    # Sizes 1, 2, 5 x 10^k until one drain passes the limit. The drain grows
    # faster than quadratically (each call sorts everything pending, and the
    # sort slows as the data outgrows the CPU caches), so the growth exponent
    # is re-estimated from the last two sizes, and a step predicted to take
    # more than 1.5x the limit is shortened to one predicted at 1.5x: the run
    # still ends on a size that passes the limit without spending minutes on it.
    nice = [m * 10**e for e in range(3, 8) for m in (1, 2, 5)]
    n, prev = nice[0], None
    while True:
        items = [make_item(PendingEncodeItem, i) for i in range(n)]
        s = EncodeScheduler(MAX_TOKENS, MAX_ITEMS)
        for it in items:
            s.add(it)
        batches = 0
        t0 = cpu_time()
        while s.next_batch():
            batches += 1
        dt = cpu_time() - t0
        out[f"drain/by_key/{n}"] = {"seconds": dt, "batches": batches, "n": n}
        if dt > limit_s or (quick and n >= 10**4):
            reason = f"passed the {limit_s} s limit" if dt > limit_s else "quick mode"
            out["drain_stopped"] = {"n": n, "seconds": dt, "reason": reason}
            break
        k = 2.0
        if prev is not None and dt > prev[1] > 0:
            k = max(2.0, math.log(dt / prev[1]) / math.log(n / prev[0]))
        prev = (n, dt)
        nxt = next(m for m in nice if m > n)
        if dt * (nxt / n) ** k > 1.5 * limit_s:
            nxt = max(n + 1000, int(n * (1.5 * limit_s / max(dt, 1e-9)) ** (1 / k)) // 1000 * 1000)
        n = nxt
    # One next_batch() with 10^5 pending, refilled after each call.
    n = 10**5 if not quick else 10**4
    s = EncodeScheduler(MAX_TOKENS, MAX_ITEMS)
    for i in range(n):
        s.add(make_item(PendingEncodeItem, i))
    nxt = n
    calls, total, items = 5, 0.0, 0
    for _ in range(calls):
        t0 = cpu_time()
        b = s.next_batch()
        total += cpu_time() - t0
        items += len(b)
        for _ in b:
            s.add(make_item(PendingEncodeItem, nxt))
            nxt += 1
    out[f"next_batch/by_key/{n}"] = {"us_per_call": total * 1e6 / calls, "calls": calls, "items_per_batch": items / calls}
    return out


def load_reference(ref_dir: str):
    sys.path.insert(0, ref_dir)
    import embedding_cache  # noqa: E402
    import encode_scheduler  # noqa: E402

    return {
        "EmbeddingCache": embedding_cache.EmbeddingCache,
        "TieredEmbeddingCache": embedding_cache.TieredEmbeddingCache,
        "EncodeScheduler": encode_scheduler.EncodeScheduler,
        "PendingEncodeItem": encode_scheduler.PendingEncodeItem,
    }


def main() -> int:
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reference", default=os.path.join(repo, "..", "shared", "reference"))
    ap.add_argument("--streams", default=None, help="directory from cache_bench --dump_streams")
    ap.add_argument("--out", default=None, help="write JSON here instead of stdout")
    ap.add_argument("--sched-limit-s", type=float, default=10.0)
    ap.add_argument("--quick", action="store_true", help="small sizes, for smoke tests only")
    args = ap.parse_args()

    result = {"schema": SCHEMA, "python": platform.python_version(), "executable": sys.executable,
              "reference_dir": os.path.normpath(args.reference), "quick": args.quick, "figures": {}}
    ref_dir = os.path.normpath(args.reference)
    if not (os.path.isfile(os.path.join(ref_dir, "embedding_cache.py"))
            and os.path.isfile(os.path.join(ref_dir, "encode_scheduler.py"))):
        msg = f"Python reference not found in {ref_dir} (expected embedding_cache.py and encode_scheduler.py); skipping"
        print(f"reference_bench: {msg}", file=sys.stderr)
        result["skipped"] = msg
    else:
        ref = load_reference(ref_dir)
        figs = result["figures"]
        t_start = time.monotonic()
        figs.update(bench_cache(ref, ops=1 << (16 if args.quick else 20), n=RESIDENT // (100 if args.quick else 1)))
        figs.update(bench_tiered(ref, args.quick))
        if args.streams and os.path.isfile(os.path.join(args.streams, "streams.json")):
            figs.update(bench_streams(ref, args.streams, args.quick))
        else:
            result["streams_skipped"] = f"no streams.json in {args.streams!r} (run cache_bench --dump_streams=DIR)"
        gc.collect()
        figs.update(bench_scheduler(ref, args.sched_limit_s, args.quick))
        result["wall_s"] = time.monotonic() - t_start
    text = json.dumps(result, indent=2, sort_keys=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

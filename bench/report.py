#!/usr/bin/env python3
"""Builds docs/BENCHMARKS.md and its plots from the JSON in a results directory.

Inputs: every *.json directly in --results (default: build/bench-results):
  - Google Benchmark output (`--benchmark_out=NAME.json
    --benchmark_out_format=json`), known by its file stem: cache_bench,
    scheduler_bench, ...;
  - bench/reference_bench.py output (schema "epd-bench-reference/1");
  - run_<section>.json, written by scripts/bench.sh: the commands a section
    ran, when, and the load average around them.
Outputs: the report (--out), PNG plots drawn by gnuplot (--img), and one
"ratio" line per paired figure on stdout.

How to add a section (end-to-end, server, ...):
  1. scripts/bench.sh: add a `section_NAME` function that writes NAME.json
     into the results directory (run its commands through `run` so they are
     recorded), and add NAME to SECTIONS there.
  2. Here: write `render_NAME(ctx) -> str | None` (None when its input is
     absent, so the report still builds without it), list it in SECTIONS
     below, and call ctx.claim("NAME") for each Google Benchmark file it
     renders. Use ctx.target(...) for each goal, so it lands in the summary,
     and ctx.ratio(...) for each comparison line.
  A Google Benchmark file that no section claims is still rendered, as a
  raw table under "Other results".
Only the standard library and gnuplot (Debian gnuplot-nox) are needed.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gnuplot_png import render_png  # noqa: E402

UNIT_NS = {"ns": 1.0, "us": 1e3, "ms": 1e6, "s": 1e9}
GB_SUFFIX = re.compile(r"^(iterations|min_time|min_warmup_time|real_time|manual_time|process_time|threads|repeats)(:.*)?$")
REF_SCHEMA = "epd-bench-reference/1"
CACHES = ["epd", "epd_sharded16", "map_list", "leveldb_lru", "rocksdb_lru", "rocksdb_hcc"]
CACHE_LABEL = {
    "epd": "epd EmbeddingCache",
    "epd_sharded16": "epd ConcurrentEmbeddingCache (16 shards)",
    "map_list": "std::unordered_map + std::list",
    "leveldb_lru": "leveldb NewLRUCache (16 shards)",
    "rocksdb_lru": "RocksDB LRUCache (64 shards, plain LRU)",
    "rocksdb_hcc": "RocksDB HyperClockCache (CLOCK)",
    "reference": "Python reference",
}
LRU_EXACT = ["epd", "map_list"]  # one global exact LRU each
# The peer caches cache_bench results must include: a report comparing the epd
# caches only with the map+list baseline would name that baseline "the
# fastest peer" (issue 16), so main() writes no report without them.
PEERS = ["leveldb_lru", "rocksdb_lru", "rocksdb_hcc"]
STREAMS = ["zipf0.8", "zipf1.1", "uniform"]


def base_name(name: str) -> str:
    return "/".join(p for p in name.split("/") if not GB_SUFFIX.match(p))


class Context:
    def __init__(self, results: str, build: str | None, img_dir: str, out_path: str):
        self.results, self.build, self.img_dir, self.out_path = results, build, img_dir, out_path
        self.gb: dict[str, dict] = {}  # stem -> {"context": ..., "runs": {(base, threads): bench}}
        self.ref: dict | None = None
        self.runs: list[dict] = []
        self.claimed: set[str] = set()
        self.targets: list[dict] = []
        self.ratios: list[str] = []
        self.images: list[str] = []
        for path in sorted(glob.glob(os.path.join(results, "*.json"))):
            stem = os.path.splitext(os.path.basename(path))[0]
            try:
                with open(path) as f:
                    data = json.load(f)
            except (OSError, json.JSONDecodeError) as e:
                print(f"report: skipping {path}: {e}", file=sys.stderr)
                continue
            if isinstance(data, dict) and "benchmarks" in data and "context" in data:
                runs = {}
                for b in data["benchmarks"]:
                    if b.get("run_type", "iteration") == "aggregate" and b.get("aggregate_name") != "median":
                        continue
                    key = (base_name(b.get("run_name", b["name"])), int(b.get("threads", 1)))
                    if b.get("run_type") == "aggregate" or key not in runs:
                        runs[key] = b
                self.gb[stem] = {"context": data["context"], "runs": runs, "path": path}
            elif isinstance(data, dict) and data.get("schema") == REF_SCHEMA:
                self.ref = data
            elif stem.startswith("run_"):
                self.runs.append(data)

    def claim(self, stem: str) -> None:
        self.claimed.add(stem)

    def bench(self, stem: str, name: str, threads: int = 1) -> dict | None:
        return self.gb.get(stem, {}).get("runs", {}).get((name, threads))

    def ns(self, stem: str, name: str, threads: int = 1) -> float | None:
        """Nanoseconds per op: CPU time per iteration for one thread, and
        1 / combined throughput (wall clock) for several."""
        b = self.bench(stem, name, threads)
        if b is None or b.get("error_occurred"):
            return None
        if threads > 1 and b.get("items_per_second"):
            return 1e9 / b["items_per_second"]
        return b["cpu_time"] * UNIT_NS[b.get("time_unit", "ns")]

    def counter(self, stem: str, name: str, key: str, threads: int = 1):
        b = self.bench(stem, name, threads)
        return None if b is None else b.get(key)

    def reff(self, name: str) -> dict | None:
        if self.ref is None:
            return None
        return self.ref.get("figures", {}).get(name)

    def target(self, what: str, goal: str, value: str, met: bool | None, margin: str) -> None:
        self.targets.append({"what": what, "goal": goal, "value": value, "met": met, "margin": margin})

    def ratio(self, figure: str, a_label: str, a: float | None, b_label: str, b: float | None, unit: str = "ns") -> str:
        if a is None or b is None or a == 0:
            line = f"{figure}: {a_label} {fmt(a)} {unit}, {b_label} {fmt(b)} {unit}, ratio n/a"
            self.ratios.append(line)
            return "n/a"
        line = f"{figure}: {b_label} {fmt(b)} {unit} / {a_label} {fmt(a)} {unit} = {b / a:.2f}x"
        self.ratios.append(line)
        return f"{b / a:.2f}x"


def fmt(x, digits: int = 3) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, str):
        return x
    if x == 0:
        return "0"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.2f}%"


def table(header: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        out.append("| " + " | ".join(fmt(c) if not isinstance(c, str) else c for c in r) + " |")
    return "\n".join(out) + "\n"


def sh(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def deb_version(pkg: str) -> str:
    return sh(["dpkg-query", "-W", "-f=${Version}", pkg]) or "not installed"


def margin_le(value: float, goal: float) -> tuple[bool, str]:
    """For a goal `value <= goal`."""
    if value <= goal:
        return True, f"{100 * (1 - value / goal):.0f}% under"
    return False, f"missed by {100 * (value / goal - 1):.0f}%"


# ---------------------------------------------------------------------------
# Plots


def gnuplot(ctx: Context, name: str, script: str, data: dict[str, str]) -> str | None:
    os.makedirs(ctx.img_dir, exist_ok=True)
    png = os.path.abspath(os.path.join(ctx.img_dir, name))
    if not render_png(png, script, data, "report"):
        return None
    ctx.images.append(png)
    return os.path.relpath(png, os.path.dirname(os.path.abspath(ctx.out_path)))


# ---------------------------------------------------------------------------
# Sections


def render_machine(ctx: Context) -> str | None:
    lscpu = sh(["lscpu"])
    info = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
    info = {k.strip(): v.strip() for k, v in info.items()}
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        mem = f"{kb / 2**20:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    thp = ""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            thp = f.read().strip()
    except OSError:
        pass
    cxx, build_type = "", ""
    if ctx.build and os.path.isfile(os.path.join(ctx.build, "CMakeCache.txt")):
        with open(os.path.join(ctx.build, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith("CMAKE_CXX_COMPILER:"):
                    cxx = (sh([line.split("=", 1)[1].strip(), "--version"]).splitlines() or ["?"])[0]
                if line.startswith("CMAKE_BUILD_TYPE:"):
                    build_type = line.split("=", 1)[1].strip()
    if cxx and build_type:
        cxx += f", CMAKE_BUILD_TYPE={build_type}"
    gbctx = next(iter(ctx.gb.values()), {}).get("context", {})
    rows = [
        ["CPU", f"{info.get('Model name', '?')}, {info.get('CPU(s)', '?')} logical CPUs "
                f"({info.get('Thread(s) per core', '?')} thread(s) per core), "
                f"{info.get('Hypervisor vendor', 'bare metal')} {'guest' if 'Hypervisor vendor' in info else ''}".strip()],
        ["Caches", f"L1d {info.get('L1d cache', '?')}, L2 {info.get('L2 cache', '?')}, L3 {info.get('L3 cache', '?')}"],
        ["Memory", mem],
        ["Kernel", sh(["uname", "-r"]) + (f"; transparent huge pages: {thp}" if thp else "")],
        ["Compiler", cxx or "?"],
        ["Google Benchmark", f"{deb_version('libbenchmark-dev')} (Debian; its library reports being built without "
                             f"NDEBUG, which only affects the harness)"],
        ["leveldb", deb_version("libleveldb-dev")],
        ["RocksDB", deb_version("librocksdb-dev")],
        ["Python", (ctx.ref or {}).get("python", "?") + f" ({(ctx.ref or {}).get('executable', '/usr/bin/python3')})"],
        ["gnuplot", deb_version("gnuplot-nox")],
        ["Benchmark host clock", f"{gbctx.get('mhz_per_cpu', '?')} MHz reported; CPU scaling "
                                 f"{'enabled' if gbctx.get('cpu_scaling_enabled') else 'disabled or unknown'}"],
    ]
    loads = []
    for r in ctx.runs:
        loads.append(f"`{r.get('section')}`: {r.get('start', '?')} to {r.get('end', '?')}, load average "
                     f"{r.get('loadavg_before', '?')} before, {r.get('loadavg_after', '?')} after")
    text = table(["", ""], rows)
    if loads:
        text += ("\nWhen the sections ran (the machine is shared with other builds; Google Benchmark's "
                 "CPU time is used for single-thread figures so time spent descheduled is not counted, "
                 "but cache and memory-bandwidth interference still is):\n\n" + "\n".join(f"- {x}" for x in loads) + "\n")
    return text


def render_conventions(ctx: Context) -> str | None:
    if "cache_bench" not in ctx.gb and "scheduler_bench" not in ctx.gb:
        return None
    c = ctx.gb.get("cache_bench", {}).get("context", {})
    s = ctx.gb.get("scheduler_bench", {}).get("context", {})
    return f"""- **Time**: single-thread figures are Google Benchmark CPU time per operation (the reference: Python
  `time.process_time`). Two-thread figures are wall time per operation of the two threads combined
  (1 / combined throughput).
- **Keys**: `epd::ContentKey`, 32 uniformly random bytes, hashed by `ContentKeyHash` (its first 8 bytes).
  leveldb and RocksDB's LRUCache get the same 32 bytes as a `Slice`; RocksDB's HyperClockCache accepts only
  16-byte keys and gets the first 16. The Python reference is keyed by ints (as the engine keys by an int item hash).
- **Values**: `EmbeddingPtr` (`shared_ptr<const Embedding>`) to a distinct empty `Embedding` per entry, so a hit
  copies a shared_ptr (one atomic increment and decrement on a control block outside the cache's own memory).
  Peers store a heap box holding the `EmbeddingPtr` and a hit copies it out, then releases the handle.
- **Charge**: every entry is charged {c.get('charge_bytes', '?')} bytes (324 tokens x 2048 x bf16); every cache gets
  the same capacity in bytes. Get-hit runs hold 10^6 (or 10^4) entries in 1.25x their bytes, so sharded peers hold
  every key too; stream runs get exactly {c.get('stream_capacity_entries', '?')} entries' bytes.
- **Access streams** are precomputed arrays of keys read sequentially (no RNG or gather in the timed loop).
  Get-or-insert streams draw ranks from Zipf s=0.8, Zipf s=1.1 (rejection-inversion sampling) or uniformly over a
  universe of {c.get('stream_universe', '?')} keys; the first half of the {c.get('stream_ops', '?')} ops warms the
  cache (untimed), the second half is timed; each miss is followed by a put. The Python reference replays the same
  rank files. Zipf s=1.1 draws fewer distinct keys than the capacity holds, so its misses are first accesses and
  every cache shows the same hit ratio there; s=0.8 and uniform exercise eviction.
- **Scheduler workload**: item i belongs to request `hex(Mix64(i/2))` as item i%2, cost 16 + Mix64(i) % 1284
  tokens; batches of at most {s.get('max_tokens_per_batch', '16384')} tokens and {s.get('max_items_per_batch', '64')} items.
  Drain time excludes the adds.
"""


def render_cache_core(ctx: Context) -> str | None:
    if "cache_bench" not in ctx.gb:
        return None
    ctx.claim("cache_bench")
    S = "cache_bench"
    rows = []
    figures = [
        ("get-hit, 10^6 resident", "hit/epd/1000000", "hit/1000000"),
        ("get-hit, 10^6 resident, u64 values (no shared_ptr)", "hit/epd_u64value/1000000", None),
        ("get-hit, 10^4 resident (hot set)", "hit/epd/10000", "hit/10000"),
        ("get-hit, 10^4 resident, u64 values (no shared_ptr)", "hit/epd_u64value/10000", None),
        ("get-miss, 10^6 resident", "miss/epd/1000000", "miss/1000000"),
        ("put with eviction, 10^6 resident", "put_evict/epd/1000000", "put_evict/1000000"),
    ]
    for label, ours_name, ref_name in figures:
        ours = ctx.ns(S, ours_name)
        if ours is None:
            continue
        if ref_name is None:
            rows.append([label, ours, "-", "-"])
            continue
        ref = (ctx.reff(ref_name) or {}).get("ns_per_op")
        rows.append([label, ours, ref, ctx.ratio(label, "epd", ours, "reference", ref)])
    text = ("All figures in ns per operation. The u64 rows run the same cache with an 8-byte integer value instead "
            "of `EmbeddingPtr`: the same lookup and recency work, without handing out shared ownership (the atomic "
            "reference-count increment and decrement on the embedding's control block, a cache line the cache "
            "itself never touches).\n\n") + table(["figure", "epd EmbeddingCache", "Python reference", "reference / epd"], rows)
    if ctx.ref is not None and ctx.reff("loop_overhead_ns"):
        text += (f"\nThe reference figures include the Python loop that calls it; that loop alone (calling a trivial "
                 f"builtin per key) costs {fmt(ctx.reff('loop_overhead_ns'))} ns per op.\n")
    elif ctx.ref is not None and ctx.ref.get("skipped"):
        text += f"\nReference not measured: {ctx.ref['skipped']}.\n"

    # The floor.
    ws = ctx.counter(S, "floor/ws_1e6", "buffer_bytes")
    floor = ctx.ns(S, "floor/ws_1e6")
    hit = ctx.ns(S, "hit/epd/1000000")
    frows = []
    for name, label in [("floor/ws_1e4", "working set of EmbeddingCache at 10^4"),
                        ("floor/64MiB", "64 MiB"), ("floor/ws_1e6", "working set of EmbeddingCache at 10^6"),
                        ("floor/256MiB", "256 MiB")]:
        frows.append([label, fmt(ctx.counter(S, name, "buffer_bytes") / 2**20 if ctx.counter(S, name, "buffer_bytes") else None) + " MiB",
                      ctx.ns(S, name)])
    text += ("\n**The pointer-chase floor**: one dependent load per op over a buffer, one 64-byte line per element, "
             "in a random cyclic order (Sattolo's algorithm), so each load misses the CPU caches and the TLB and "
             "cannot overlap the next. Measured in the same run:\n\n" + table(["buffer", "size", "ns per load"], frows))
    hit_u64 = ctx.ns(S, "hit/epd_u64value/1000000")
    if floor and hit:
        r = hit / floor
        ok, m = margin_le(r, 1.3)
        ctx.target("EmbeddingCache get-hit at 10^6 within 1.3x of the pointer-chase floor (EmbeddingPtr values)",
                   "<= 1.3x", f"{fmt(hit)} ns vs floor {fmt(floor)} ns = {r:.2f}x", ok, m)
        ctx.ratio("get-hit 10^6 vs floor", "floor", floor, "epd", hit)
        text += (f"\nget-hit at 10^6 is {r:.2f}x the floor over a buffer of its own working set "
                 f"({fmt(ws / 2**20 if ws else None)} MiB: bookkeeping_bytes() plus the keys and values held inline)")
        if hit_u64:
            r2 = hit_u64 / floor
            ok2, m2 = margin_le(r2, 1.3)
            ctx.target("... the same with u64 values (the cache's own work)", "<= 1.3x",
                       f"{fmt(hit_u64)} ns = {r2:.2f}x", ok2, m2)
            text += f"; with u64 values, {r2:.2f}x"
        text += ".\n"
    hot = ctx.ns(S, "hit/epd/10000")
    if hot:
        ok, m = margin_le(hot, 50.0)
        ctx.target("EmbeddingCache get-hit, 10^4 hot set (EmbeddingPtr values)", "<= 50 ns", f"{fmt(hot)} ns", ok, m)
    hot_u64 = ctx.ns(S, "hit/epd_u64value/10000")
    if hot_u64:
        ok, m = margin_le(hot_u64, 50.0)
        ctx.target("... the same with u64 values (the cache's own work)", "<= 50 ns", f"{fmt(hot_u64)} ns", ok, m)
    return text


def render_memory(ctx: Context) -> str | None:
    S = "cache_bench"
    if ctx.bench(S, "hit/epd/1000000") is None:
        return None
    kv = 32 + 16
    rows = []
    for c in CACHES:
        b = ctx.bench(S, f"hit/{c}/1000000")
        if b is None:
            continue
        fill, steady = b.get("heap_B_per_entry_fill"), b.get("heap_B_per_entry_steady")
        bk_fill, bk = b.get("bookkeeping_B_per_entry_fill"), b.get("bookkeeping_B_per_entry")
        rows.append([CACHE_LABEL[c], fill, steady, None if steady is None else steady - kv,
                     "-" if bk is None else f"{fmt(bk_fill)} / {fmt(bk)}"])
    text = ("Heap bytes per entry at 10^6 entries, from glibc `mallinfo2()` (in-use bytes, all arenas, mmapped chunks "
            "included) before and after filling the cache (\"fill\") and after a further 2x10^6 untimed and 2^22 timed "
            f"gets (\"steady\"). \"Beyond key and value\" subtracts {kv} bytes (a 32-byte key and a 16-byte "
            "shared_ptr) from the steady figure; for the peers it therefore includes their handle, their copy of the "
            "key (16 bytes for HyperClockCache) and the heap box around the shared_ptr. The embeddings themselves are "
            "allocated before the measurement and not counted.\n\n")
    text += table(["cache", "heap B/entry, fill", "heap B/entry, steady", "steady, beyond key and value",
                   "bookkeeping_bytes() / n, fill / steady"], rows)
    b = ctx.bench(S, "hit/epd/1000000")
    steady_bk = b.get("heap_B_per_entry_steady", 0) - kv
    text += (f"\nThe header of `include/epd/core/embedding_cache.h` documents 48-96 bytes of bookkeeping records per "
             f"entry plus the vectors' spare capacity. Measured in steady state: {fmt(steady_bk)} bytes by the heap, "
             f"{fmt(b.get('bookkeeping_B_per_entry'))} by `bookkeeping_bytes()`. The recency log dominates: it holds "
             f"up to 3n+64 16-byte records before compaction, and `std::vector`'s doubling rounds its capacity up to "
             f"the next power of two (2^22 records = 64 MiB at 10^6 entries). The slab likewise rounds 10^6 entries "
             f"up to 2^20.\n")
    return text


def render_peers(ctx: Context) -> str | None:
    S = "cache_bench"
    if "cache_bench" not in ctx.gb:
        return None
    present = [c for c in CACHES if ctx.bench(S, f"hit/{c}/1000000") is not None]
    text = ""
    # Single-thread get-hit.
    rows = []
    for c in present:
        rows.append([CACHE_LABEL[c], ctx.ns(S, f"hit/{c}/1000000"), ctx.ns(S, f"hit/{c}/10000")])
    text += "**Get-hit, one thread** (ns per op; every key resident):\n\n" + table(["cache", "10^6 entries", "10^4 entries"], rows)
    # Streams.
    rows = []
    bars = {}
    for c in present + ["reference"]:
        row = [CACHE_LABEL[c]]
        for s in STREAMS:
            if c == "reference":
                f = ctx.reff(f"stream/{s}") or {}
                ns1, hr1, ns2 = f.get("ns_per_op"), f.get("hit_ratio"), None
            else:
                name = f"stream/{s}/{c}"
                ns1, hr1 = ctx.ns(S, name), ctx.counter(S, name, "hit_ratio")
                ns2 = ctx.ns(S, name, threads=2)
                bars.setdefault(c, {})[s] = ns1
            row += [ns1, pct(hr1), "-" if ns2 is None else ns2]
        rows.append(row)
    header = ["cache"]
    for s in STREAMS:
        header += [f"{s} ns/op", f"{s} hit ratio", f"{s} ns/op, 2 threads"]
    cc = ctx.gb[S]["context"]
    text += (f"\n**Get-or-insert over key streams** (capacity {cc.get('stream_capacity_entries', '?')} entries, "
             f"universe {cc.get('stream_universe', '?')} keys; ns per op and hit "
             "ratio over the timed half; a miss costs a get and a put). Two-thread figures: "
             "`ConcurrentEmbeddingCache` for epd, the peers' own thread safety; `EmbeddingCache` and the map+list "
             "baseline are single-threaded.\n\n" + table(header, rows))

    # Goal: single-thread, at least as fast as the fastest peer.
    peers = [c for c in present if c not in ("epd", "epd_sharded16")]
    figs = [("get-hit 10^6", "hit/{}/1000000"), ("get-hit 10^4", "hit/{}/10000")] + [
        (f"stream {s}", f"stream/{s}/{{}}") for s in STREAMS]
    for label, pattern in figs:
        ours = ctx.ns(S, pattern.format("epd"))
        best = None
        for p in peers:
            v = ctx.ns(S, pattern.format(p))
            if v is not None and (best is None or v < best[1]):
                best = (p, v)
        if ours is None or best is None:
            continue
        ctx.ratio(f"{label}, fastest peer ({best[0]}) vs epd", "epd", ours, best[0], best[1])
        ok = ours <= best[1]
        m = (f"{100 * (1 - ours / best[1]):.0f}% faster" if ok else f"missed by {100 * (ours / best[1] - 1):.0f}%")
        ctx.target(f"single thread, {label}: epd at least as fast as the fastest peer", f"<= {best[0]}",
                   f"{fmt(ours)} ns vs {fmt(best[1])} ns", ok, m)
    for s in STREAMS:
        ref = (ctx.reff(f"stream/{s}") or {}).get("ns_per_op")
        ctx.ratio(f"stream {s}", "epd", ctx.ns(S, f"stream/{s}/epd"), "reference", ref)

    # Goal: same hit ratio as the LRU peers.
    lines = []
    for s in STREAMS:
        hits = {c: ctx.counter(S, f"stream/{s}/{c}", "hits") for c in present}
        # A --quick reference replays a shorter window; its counts are not comparable.
        ref = None if (ctx.ref or {}).get("quick") else (ctx.reff(f"stream/{s}") or {}).get("hits")
        ours = hits.get("epd")
        if ours is None:
            continue
        exact_same = [c for c in ("map_list",) if hits.get(c) is not None]
        same = all(hits[c] == ours for c in exact_same) and (ref is None or ref == ours)
        detail = ", ".join(f"{c} {int(hits[c]):,}" for c in present if hits.get(c) is not None)
        if ref is not None:
            detail += f", reference {int(ref):,}"
        ctx.target(f"stream {s}: epd hit count equals the exact-LRU baselines (map+list"
                   f"{', reference' if ref is not None else ''})",
                   "equal", f"epd {int(ours):,}", same, "equal" if same else "differs")
        lines.append(f"- {s}: hits in the timed window: {detail}.")
    if lines:
        text += ("\n**Hit ratio at the same policy.** `EmbeddingCache`, the map+list baseline and the Python reference "
                 "are each one exact LRU over the whole capacity, so on the same stream they must hit exactly the same "
                 "number of times. The sharded LRUs (leveldb 16 shards, RocksDB 64, `ConcurrentEmbeddingCache` 16) "
                 "split the capacity evenly and each shard evicts its own oldest entry: a shard that happens to "
                 "receive more than its share of recently used keys evicts entries that a global LRU would have kept, "
                 "while another shard keeps entries older than the global LRU victim. The difference follows the "
                 "load imbalance between shards, which shrinks relative to the shard size as entries per shard grow "
                 "(as 1/sqrt(entries per shard) for uniformly hashed keys). HyperClockCache is CLOCK, not LRU, so it "
                 "differs by policy.\n\n" + "\n".join(lines) + "\n")

    # Bar plot.
    if bars:
        cols = [c for c in present if c in bars]
        rows_txt = []
        for label, key in [("hit 10^6", None)] + [(s, s) for s in STREAMS]:
            vals = []
            for c in cols:
                v = ctx.ns(S, f"hit/{c}/1000000") if key is None else bars[c].get(key)
                vals.append("NaN" if v is None else f"{v:.1f}")
            rows_txt.append(f'"{label}" ' + " ".join(vals))
        data = "# figure " + " ".join(cols) + "\n" + "\n".join(rows_txt) + "\n"
        plot = ", ".join(f"'bars.dat' using {i + 2}:xtic(1) title '{c}'" for i, c in enumerate(cols))
        script = f"""set title "ns per op, one thread (get-hit at 10^6; get-or-insert streams)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set ylabel "ns per op (CPU time)"
set yrange [0:*]
set key top left
set grid ytics
plot {plot}
"""
        rel = gnuplot(ctx, "cache_ns_per_op.png", script, {"bars.dat": data})
        if rel:
            text += f"\n![ns per op by cache and key stream]({rel})\n"
    return text


def render_concurrency(ctx: Context) -> str | None:
    S = "cache_bench"
    one = ctx.bench(S, "concurrent_hit/epd_sharded16", 1)
    two = ctx.bench(S, "concurrent_hit/epd_sharded16", 2)
    if one is None or two is None:
        return None
    t1, t2 = one.get("items_per_second"), two.get("items_per_second")
    ok = t2 > t1
    ctx.target("ConcurrentEmbeddingCache get-hit, combined throughput 2 threads > 1 thread", "> 1x",
               f"{t2 / 1e6:.2f} vs {t1 / 1e6:.2f} M ops/s = {t2 / t1:.2f}x", ok,
               f"{100 * (t2 / t1 - 1):+.0f}%")
    ctx.ratio("concurrent get-hit throughput", "1 thread", t1 / 1e6, "2 threads", t2 / 1e6, unit="M ops/s")
    rows = []
    for n, b, t in (("1", one, t1), ("2", two, t2)):
        # Google Benchmark sums CPU time over threads and divides wall time by
        # the thread count, so cpu_time / real_time is the CPUs the run got.
        cpus = b["cpu_time"] / b["real_time"]
        rows.append([n, f"{t / 1e6:.2f} M", 1e9 / t, b["cpu_time"] * UNIT_NS[b["time_unit"]], f"{cpus:.2f}",
                     f"{int(n) * 1e3 / (b['cpu_time'] * UNIT_NS[b['time_unit']]):.2f} M"])
    return table(["threads", "combined get-hits/s (wall clock)", "ns per op, combined (wall)", "CPU ns per op",
                  "CPUs the run got", "get-hits/s if each thread had a CPU (threads / CPU ns per op)"], rows) + (
        "\n`ConcurrentEmbeddingCache` with 16 shards and 10^6 resident entries; each thread reads its own part of a "
        "random stream of resident keys. The target is judged on the measured wall-clock throughput. This machine "
        "has 2 CPUs shared with everything else that runs: \"CPUs the run got\" (CPU time over wall time) shows "
        "whether the two threads actually ran in parallel, and the last column is what the measured CPU cost per "
        "op would give with one free CPU per thread. The CPU cost per op rising from 1 to 2 threads is the price of "
        "the two cores passing shard state back and forth (see Findings).\n")


def render_tiered(ctx: Context) -> str | None:
    S = "cache_bench"
    if ctx.bench(S, "tiered_promote/identity") is None:
        return None
    rows = []
    for name, label in [("tiered_promote/identity", "promote (L2 hit) + the demotion it causes, identity copies"),
                        ("tiered_demote/identity", "demote (put into full L1, L2 drops its LRU), identity copies"),
                        ("tiered_promote/memcpy", "promote + demotion, memcpy copies of 1.27 MiB"),
                        ("tiered_demote/memcpy", "demote, memcpy copy of 1.27 MiB")]:
        ours = ctx.ns(S, name)
        ref = (ctx.reff(name) or {}).get("ns_per_op")
        rows.append([label, ours, ref, ctx.ratio(name, "epd", ours, "reference", ref)])
    text = table(["operation", "epd ns/op", "reference ns/op", "reference / epd"], rows)
    p = ctx.ns(S, "tiered_promote/memcpy")
    if p:
        text += (f"\nIdentity copies: L1 10^4 entries, L2 10^5 (as many bytes each as in the hit benchmarks). Memcpy "
                 f"copies: L1 16 entries, L2 64; each copy allocates a new `Embedding` and copies its 1,327,104-byte "
                 f"payload (Python: `bytearray(v)`). A promote moves two payloads (host->device and the demoted "
                 f"victim device->host): {2 * 1327104 / p:.2f} GB/s of copies, so the cache's own bookkeeping is "
                 f"noise next to the copy.\n")
    return text


def render_scheduler(ctx: Context) -> str | None:
    S = "scheduler_bench"
    if S not in ctx.gb:
        return None
    ctx.claim(S)
    ours = {}
    for (name, threads), b in ctx.gb[S]["runs"].items():
        m = re.match(r"drain/(by_key|fifo)/(\d+)$", name)
        if m:
            ours.setdefault(m.group(1), {})[int(m.group(2))] = ctx.ns(S, name) / 1e6  # ms
    ref = {}
    if ctx.ref:
        for k, v in ctx.ref.get("figures", {}).items():
            m = re.match(r"drain/by_key/(\d+)$", k)
            if m:
                ref[int(m.group(1))] = v["seconds"] * 1e3
    ns = sorted(set(ours.get("by_key", {})) | set(ours.get("fifo", {})) | set(ref))
    rows = []
    for n in ns:
        o, f, r = ours.get("by_key", {}).get(n), ours.get("fifo", {}).get(n), ref.get(n)
        rows.append([f"{n:,}", o, f, r, ctx.ratio(f"drain {n}", "epd by_key", o, "reference", r, unit="ms")
                     if (o is not None and r is not None) else "-"])
    text = "Drain time in ms (CPU time; adds not timed):\n\n" + table(
        ["pending items", "epd kByKey", "epd kFifo", "Python reference (by key)", "reference / epd kByKey"], rows)
    stopped = (ctx.ref or {}).get("figures", {}).get("drain_stopped")
    if stopped:
        text += (f"\nThe reference was run from 10^3 items upward (1, 2, 5 steps; a step predicted to take more than 1.5x the limit is shortened to one predicted at 1.5x) until one size passed the limit: "
                 f"stopped at n = {stopped['n']:,} ({stopped['reason']}).\n")
    nb_rows = []
    for order in ("by_key", "fifo"):
        b = ctx.bench(S, f"next_batch/{order}/100000")
        if b:
            nb_rows.append([f"epd {order}", b["real_time"] * UNIT_NS[b["time_unit"]] / 1e3, b.get("items_per_batch")])
    for k, v in ((ctx.ref or {}).get("figures", {}) or {}).items():
        if k.startswith("next_batch/"):
            nb_rows.append([f"reference ({k.split('/')[-1]} pending)", v["us_per_call"], v["items_per_batch"]])
    if nb_rows:
        text += ("\nOne `next_batch()` with 10^5 items pending (popped items are replaced, untimed, so every call "
                 "sees 10^5; epd: wall time of the call alone; reference: CPU time):\n\n"
                 + table(["", "us per call", "items per batch"], nb_rows))
        ctx.ratio("next_batch at 10^5", "epd by_key", nb_rows[0][1], "reference",
                  next((r[1] for r in nb_rows if r[0].startswith("reference")), None), unit="us")
    for order in ("by_key", "fifo"):
        v = ours.get(order, {}).get(100000)
        if v is not None:
            ok, m = margin_le(v, 100.0)
            ctx.target(f"EncodeScheduler ({order}) drains 10^5 items", "<= 100 ms", f"{fmt(v)} ms", ok, m)
    # Plot.
    series = {"epd kByKey": ours.get("by_key", {}), "epd kFifo": ours.get("fifo", {}), "Python reference": ref}
    data = {}
    plots = []
    for i, (label, pts) in enumerate(series.items()):
        if not pts:
            continue
        fname = f"s{i}.dat"
        data[fname] = "".join(f"{n} {pts[n] / 1e3}\n" for n in sorted(pts))
        plots.append(f"'{fname}' using 1:2 with linespoints lw 2 pt 7 title '{label}'")
    if plots:
        script = f"""set title "Scheduler drain time"
set logscale xy
set xlabel "pending items n"
set ylabel "seconds to drain (CPU time)"
set format x "10^{{%L}}"
set format y "10^{{%L}}"
set grid
set key top left
plot {", ".join(plots)}
"""
        script = script.replace('set terminal', 'set terminal')
        rel = gnuplot(ctx, "scheduler_drain.png", "set termoption enhanced\n" + script, data)
        if rel:
            text += f"\n![scheduler drain time against n, log-log]({rel})\n"
    return text


def render_e2e(ctx: Context) -> str | None:
    """e2e.json from bench/e2e_bench.py, rendered by that script's render_body
    (the script draws the plots, and writes docs/BENCHMARKS-e2e.md and a copy
    of its JSON, docs/BENCHMARKS-e2e.json)."""
    path = os.path.join(ctx.results, "e2e.json")
    if not os.path.isfile(path):
        # Not run with these results: the copy of the last run, committed in docs/.
        path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "BENCHMARKS-e2e.json")
        if not os.path.isfile(path):
            return None
    import importlib.util

    spec = importlib.util.spec_from_file_location("e2e_bench", os.path.join(os.path.dirname(os.path.abspath(__file__)), "e2e_bench.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with open(path) as f:
        data = json.load(f)
    img = os.path.relpath(os.path.abspath(ctx.img_dir), os.path.dirname(os.path.abspath(ctx.out_path)))
    return mod.render_body(data, img_prefix=img + "/")


def render_l3(ctx: Context) -> str | None:
    """l3.json from bench/cluster_bench.py (the L3 tier and the cluster,
    issue 14), rendered by that script's render_body; falls back to the copy
    of the last run committed in docs/BENCHMARKS-l3.json."""
    path = os.path.join(ctx.results, "l3.json")
    if not os.path.isfile(path):
        path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "BENCHMARKS-l3.json")
        if not os.path.isfile(path):
            return None
    import importlib.util

    spec = importlib.util.spec_from_file_location("cluster_bench",
                                                  os.path.join(os.path.dirname(os.path.abspath(__file__)), "cluster_bench.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    with open(path) as f:
        data = json.load(f)
    for what, goal, value, met, margin in mod.targets(data):
        ctx.target(what, goal, value, met, margin)
    return mod.render_body(data)


def _included_section(name: str) -> str | None:
    """docs/<name> as written, its own "## " heading dropped (the report adds
    its own); None when the file does not exist."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", name)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        lines = f.read().splitlines()
    if lines and lines[0].startswith("## "):
        lines = lines[1:]
    return "\n".join(lines).strip() + "\n"


def render_server(ctx: Context) -> str | None:
    """docs/BENCHMARKS-server.md, measured by src/server/bench_server.sh (about
    9 minutes, so not part of `make bench`)."""
    return _included_section("BENCHMARKS-server.md")


def render_checkpoint(ctx: Context) -> str | None:
    """docs/BENCHMARKS-checkpoint.md: the tiny checkpoint towers against the
    Python reference (src/tower/checkpoint_tower_bench and
    bench/checkpoint_reference_bench.py, run by hand; commands inside)."""
    return _included_section("BENCHMARKS-checkpoint.md")


def render_video(ctx: Context) -> str | None:
    """docs/BENCHMARKS-video.md, written by bench/video_bench.py (section
    `video` of scripts/bench.sh): tower time on overlapping clips with chunk
    caching, whole-video caching only, and the limit."""
    return _included_section("BENCHMARKS-video.md")


def _bench_module(name: str):
    """bench/<name>.py, imported."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def render_economics(ctx: Context) -> str | None:
    """docs/BENCHMARKS-economics.md, written by bench/economics_bench.py
    (section `economics` of scripts/bench.sh): GDSF against LRU, the
    doorkeeper and `epd-encode plan`; its targets join the summary (from the
    results, or the copy of the last run in docs/BENCHMARKS-economics.json)."""
    path = os.path.join(ctx.results, "economics.json")
    if not os.path.isfile(path):
        path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "BENCHMARKS-economics.json")
    if os.path.isfile(path):
        with open(path) as f:
            data = json.load(f)
        for t in _bench_module("economics_bench").targets(data):
            ctx.target(*t)
    return _included_section("BENCHMARKS-economics.md")


def render_measured_economics(ctx: Context) -> str | None:
    """docs/BENCHMARKS-measured-economics.md, written by
    bench/measured_economics_bench.py (not part of `make bench`: a replay per
    policy and capacity, about 15 minutes on 2 cores): GDSF against LRU with
    the worker's measured costs."""
    return _included_section("BENCHMARKS-measured-economics.md")


def _render_script_section(ctx: Context, name: str, module: str) -> str | None:
    """<name>.json from bench/<module>.py, rendered by that script's
    render_body (its targets added to the summary); falls back to the copy
    of the last run committed in docs/BENCHMARKS-<name with - for _>.json."""
    path = os.path.join(ctx.results, name + ".json")
    if not os.path.isfile(path):
        repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        path = os.path.join(repo, "docs", "BENCHMARKS-" + name.replace("_", "-") + ".json")
        if not os.path.isfile(path):
            return None
    with open(path) as f:
        data = json.load(f)
    mod = _bench_module(module)
    for t in mod.targets(data):
        ctx.target(*t)
    return mod.render_body(data)


def render_http_edge(ctx: Context) -> str | None:
    """Section `http_edge` of scripts/bench.sh: the HTTP edge under issue 40's
    attacks, and Boost.Beast against libmicrohttpd (bench/http_edge_bench.py)."""
    return _render_script_section(ctx, "http_edge", "http_edge_bench")


def render_preprocess(ctx: Context) -> str | None:
    """Section `preprocess` of scripts/bench.sh: DecodeAndPreprocess against
    Pillow + numpy, torchvision and the TurboJPEG decode floor, issue 42
    (bench/preprocess_bench.py)."""
    return _render_script_section(ctx, "preprocess", "preprocess_bench")


def render_findings(ctx: Context) -> str | None:
    notes = os.path.join(os.path.dirname(os.path.abspath(__file__)), "report_notes.md")
    if not os.path.isfile(notes):
        return None
    with open(notes) as f:
        return f.read()


def render_other(ctx: Context) -> str | None:
    parts = []
    for stem, g in sorted(ctx.gb.items()):
        if stem in ctx.claimed:
            continue
        rows = []
        for (name, threads), b in sorted(g["runs"].items()):
            extra = {k: v for k, v in b.items() if isinstance(v, (int, float)) and k not in (
                "real_time", "cpu_time", "iterations", "threads", "repetitions", "repetition_index",
                "family_index", "per_family_instance_index")}
            rows.append([name, threads, b["real_time"], b["cpu_time"], b.get("time_unit", "ns"),
                         ", ".join(f"{k}={fmt(v)}" for k, v in sorted(extra.items()))])
        parts.append(f"`{os.path.basename(g['path'])}` (no section renders it yet):\n\n"
                     + table(["benchmark", "threads", "real", "cpu", "unit", "counters"], rows))
    return "\n".join(parts) if parts else None


def render_commands(ctx: Context) -> str | None:
    if not ctx.runs:
        return None
    out = []
    for r in ctx.runs:
        out.append(f"Section `{r.get('section')}` ({r.get('wall_s', '?')} s):\n\n```sh\n" + "\n".join(r.get("commands", [])) + "\n```\n")
    return ("Regenerate everything with `make bench` (or `scripts/bench.sh BUILD_DIR` on an existing build). "
            "The commands that produced this report:\n\n" + "\n".join(out))


SECTIONS = [
    ("Machine and versions", render_machine),
    ("Conventions", render_conventions),
    ("EmbeddingCache against the Python reference and the memory floor", render_cache_core),
    ("Against peer caches", render_peers),
    ("Two threads", render_concurrency),
    ("Memory per entry", render_memory),
    ("Tiered cache: promote and demote", render_tiered),
    ("EncodeScheduler", render_scheduler),
    ("End to end: replay against the Python reference worker", render_e2e),
    ("Server", render_server),
    ("L3 and the cluster", render_l3),
    ("Checkpoint towers: C++ against the Python reference", render_checkpoint),
    ("Video: chunk caching on overlapping clips", render_video),
    ("Cache economics: GDSF, adaptive, the doorkeeper and plan", render_economics),
    ("Cache economics with measured costs: GDSF and adaptive against LRU through replay", render_measured_economics),
    ("HTTP edge under attack, and Boost.Beast against libmicrohttpd", render_http_edge),
    ("Preprocessing against the decode floor (issue 42)", render_preprocess),
    ("Findings", render_findings),
    ("Other results", render_other),
    ("How these numbers were made", render_commands),
]


def missing_peers(ctx: Context) -> list[str]:
    """The PEERS with no get-hit result in cache_bench.json (none when there is
    no cache_bench.json: its sections are then left out)."""
    if "cache_bench" not in ctx.gb:
        return []
    names = {name for name, _ in ctx.gb["cache_bench"]["runs"]}
    return [p for p in PEERS if not any(n.startswith(f"hit/{p}/") for n in names)]


def render(ctx: Context) -> str:
    bodies = []
    for title, fn in SECTIONS:
        body = fn(ctx)
        if body:
            bodies.append(f"## {title}\n\n{body.rstrip()}\n")
    now = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    head = [
        "# Benchmarks\n",
        f"Generated by `bench/report.py` from `{os.path.relpath(ctx.results)}` on {now}; do not edit by hand "
        "(rerun `make bench`, or edit `bench/report.py` / `bench/report_notes.md`). Every number below was "
        "measured in the runs listed at the end.\n",
    ]
    if ctx.targets:
        rows = [[t["what"], t["goal"], t["value"],
                 "n/a" if t["met"] is None else ("met" if t["met"] else "**missed**"), t["margin"]] for t in ctx.targets]
        head.append("## Targets\n\n" + table(["target", "goal", "measured", "result", "margin"], rows))
    return "\n".join(head) + "\n" + "\n".join(bodies)


def main() -> int:
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", default=os.path.join(repo, "build", "bench-results"))
    ap.add_argument("--build", default=None, help="build directory (for the compiler version)")
    ap.add_argument("--out", default=os.path.join(repo, "docs", "BENCHMARKS.md"))
    ap.add_argument("--img", default=os.path.join(repo, "docs", "img"))
    args = ap.parse_args()
    if not os.path.isdir(args.results):
        print(f"report: no results directory {args.results}", file=sys.stderr)
        return 1
    ctx = Context(args.results, args.build, args.img, args.out)
    missing = missing_peers(ctx)
    if missing:
        print(f"report: {ctx.gb['cache_bench']['path']} has no results for the peer cache(s) "
              f"{', '.join(CACHE_LABEL[p] for p in missing)}: cache_bench was built without them. Install them "
              "(scripts/install-deps.sh bench) and rerun the core section (scripts/bench.sh configures again); "
              f"{args.out} is left as it was.", file=sys.stderr)
        return 1
    text = render(ctx)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    for line in ctx.ratios:
        print("ratio", line)
    for t in ctx.targets:
        print("target", "MET   " if t["met"] else "MISSED", t["what"], "|", t["value"], "|", t["margin"])
    print(f"report: wrote {args.out}" + (f" and {len(ctx.images)} plot(s) in {args.img}" if ctx.images else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

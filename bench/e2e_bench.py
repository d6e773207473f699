#!/usr/bin/python3
"""End-to-end benchmark: `epd-encode replay` against the Python reference worker.

For each trace over real photographs (the demo's images, see scripts/demo.sh)
it runs four versions:
  ours       epd-encode replay (content keys, tiered cache, in-flight joins,
             scheduler, TorchScript tower)
  reference  bench/reference_pipeline.py: the reference cache and scheduler,
             PIL preprocessing, the same tower file, no in-flight dedup
  no-cache   epd-encode replay --no-cache (every item runs the tower)
  limit      the all-at-once limit: the tower time of the trace's distinct
             images, each once (replay of a trace holding each distinct
             image once, all submitted at time 0: its tower_s)
and a cache-size sweep of ours on the two Zipf traces. Each run is compared
with two limits: the all-at-once one above, and the online limit, the
completion time of an ideal encoder that runs each distinct image once, at
the tower's measured cost per token, never before its first arrival and with
no overhead (bench/online_limit.py simulates it and says what it assumes).
The cost per token is tower_s / tower_tokens of the all-at-once run; each
image's post-merge token count comes from its header (Qwen2-VL smart_resize,
bench/reference_pipeline.py) and their sum is checked against that run's
tower_tokens. Latency percentiles are set against the ideal encoder's, per
request: the completion of its last distinct image minus its arrival.

Traces (JSON Lines, docs/REPLAY.md), generated here deterministically:
  zipf0.8  requests of 1..4 images, Zipf s=0.8 over the images
  zipf1.2  the same with s=1.2
  burst    the same new image in 20 requests 1 ms apart (one batch window)
Requests arrive at --rate per second and both engines run in real time
(each request submitted at its arrival_ms), so later requests can find
earlier images cached; the burst arrives faster than one tower call.

Writes BUILD/bench-results/e2e.json (read by bench/report.py) and a copy in
docs/BENCHMARKS-e2e.json (which report.py falls back to), the traces under
BUILD/bench-results/e2e/, docs/BENCHMARKS-e2e.md and docs/img/e2e_*.png
(gnuplot). `--render-only` rebuilds the markdown and plots from the docs copy;
with `--add-online` it first adds the online limit to a docs copy recorded
before the online limit existed (the traces are regenerated and checked
against the recording; nothing is re-measured).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "python"))
import child_process  # noqa: E402 - each replay dies with this script
from gnuplot_png import render_png  # noqa: E402
from online_limit import requests_from_trace, simulate  # noqa: E402

SCHEMA = "epd-bench-e2e/1"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERSIONS = ["ours", "reference", "no_cache", "online", "limit"]
ENGINES = ["ours", "reference", "no_cache"]
LABEL = {"ours": "epd-encode replay", "reference": "Python reference worker",
         "no_cache": "epd-encode replay --no-cache", "online": "online limit (ideal encoder)",
         "limit": "all-at-once limit (tower time, distinct images once)"}


def write_trace(path: str, reqs: list[dict]) -> None:
    with open(path, "w") as f:
        for r in reqs:
            f.write(json.dumps(r) + "\n")


def zipf_trace(images: list[str], n: int, s: float, seed: int, rate: float) -> list[dict]:
    rng = random.Random(seed)
    ranked = images[:]
    rng.shuffle(ranked)  # which photo is popular is random, not the first file name
    weights = [1.0 / (r + 1) ** s for r in range(len(ranked))]
    reqs = []
    for i in range(n):
        k = rng.randint(1, 4)
        reqs.append({"id": f"r{i + 1:06d}", "arrival_ms": round(i * 1000.0 / rate, 3),
                     "images": rng.choices(ranked, weights, k=k)})
    return reqs


def burst_trace(image: str, n: int = 20) -> list[dict]:
    return [{"id": f"b{i + 1:06d}", "arrival_ms": float(i), "images": [image]} for i in range(n)]


def distinct_trace(reqs: list[dict]) -> list[dict]:
    seen: list[str] = []
    for r in reqs:
        for p in r["images"]:
            if p not in seen:
                seen.append(p)
    return [{"id": f"d{i + 1:06d}", "arrival_ms": 0, "images": [p]} for i, p in enumerate(seen)]


def image_tokens(reqs: list[dict], images_dir: str) -> dict[str, int]:
    """Post-merge tokens of each image the trace names, from its header and
    the Qwen2-VL resize rule (max_pixels 1003520 in both engines)."""
    from reference_pipeline import MAX_PIXELS, header_tokens

    out = {}
    for r in reqs:
        for p in r["images"]:
            if p not in out:
                with open(p if os.path.isabs(p) else os.path.join(images_dir, p), "rb") as f:
                    out[p] = header_tokens(f.read(), MAX_PIXELS)
    return out


def online_figures(reqs: list[dict], tokens: dict[str, int], runs: dict) -> dict | None:
    """The ideal encoder on this trace (bench/online_limit.py) at the cost per
    token of the all-at-once run, and, into each engine's run, the online limit
    at that run's own cost per token (`online_limit_own_speed_s`)."""
    lim = runs.get("limit")
    if not lim or not lim.get("tower_tokens"):
        return None
    requests = requests_from_trace(reqs)
    s_per_tok = lim["tower_s"] / lim["tower_tokens"]
    ideal = simulate(requests, tokens, s_per_tok)
    header_sum = sum(tokens.values())
    if header_sum != lim["tower_tokens"]:
        print(f"e2e: the distinct images' header token counts sum to {header_sum}, the all-at-once run encoded "
              f"{lim['tower_tokens']} tokens; the online limit uses the header counts", file=sys.stderr)
    for v in ENGINES:
        r = runs.get(v)
        if r and r.get("tower_tokens"):
            r["online_limit_own_speed_s"] = simulate(requests, tokens, r["tower_s"] / r["tower_tokens"]).limit_s
    return {"seconds_per_token": s_per_tok, "limit_s": ideal.limit_s, "work_s": ideal.work_s,
            "latency_ms_p50": 1e3 * ideal.latency_percentile_s(50),
            "latency_ms_p99": 1e3 * ideal.latency_percentile_s(99),
            "latency_ms_mean": 1e3 * sum(ideal.request_latency_s) / len(requests) if requests else 0.0,
            "tokens": header_sum, "limit_run_tokens": lim["tower_tokens"], "last_arrival_s": max(
                (r.arrival_s for r in requests), default=0.0)}


def build_traces(images: list[str], requests: int, seed: int, rate: float) -> list[tuple[str, str, list[dict]]]:
    """The benchmark's traces (name, description, requests), deterministic in
    the sorted image names and the arguments."""
    traces = [
        ("zipf0.8", "Zipf s=0.8, 1-4 images per request", zipf_trace(images, requests, 0.8, seed, rate)),
        ("zipf1.2", "Zipf s=1.2, 1-4 images per request", zipf_trace(images, requests, 1.2, seed, rate)),
    ]
    # The burst's image appears in neither Zipf trace's head: take the last image name not used there.
    used = {p for _, _, t in traces for r in t for p in r["images"]}
    fresh = [p for p in images if p not in used] or images
    traces.append(("burst", "one new image in 20 requests 1 ms apart", burst_trace(fresh[-1])))
    return traces


def add_online_to_recorded(data: dict, images_dir: str) -> str | None:
    """Adds the online limit to an e2e.json recorded before it existed: the
    traces are regenerated from the recorded seed and rate over the same
    images, and the cost per token is the recorded all-at-once run's. Refuses
    (returns why) unless every trace's request, item and distinct-image counts
    and the distinct images' token sum match the recording."""
    m = data["meta"]
    images = sorted(f for f in os.listdir(images_dir) if f.lower().endswith((".jpg", ".jpeg", ".png")))
    if len(images) != m["n_images"]:
        return f"{images_dir} holds {len(images)} images, the recording used {m['n_images']}"
    recorded = {t["name"]: t for t in data["traces"]}
    n = next((t["requests"] for t in data["traces"] if t["name"].startswith("zipf")), 60)
    for name, _, reqs in build_traces(images, n, m["seed"], m["rate"]):
        t = recorded.get(name)
        if t is None:
            continue
        tokens = image_tokens(reqs, images_dir)
        got = (len(reqs), sum(len(r["images"]) for r in reqs), len(tokens), sum(tokens.values()))
        want = (t["requests"], t["items"], t["distinct"], t["runs"].get("limit", {}).get("tower_tokens"))
        if got != want:
            return f"trace {name}: regenerated (requests, items, distinct, tokens) {got} != recorded {want}"
        t["online"] = online_figures(reqs, tokens, t["runs"])
    m["online_added"] = (datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    return None


def run_json(cmd: list[str], log: list[str]) -> dict | None:
    shown = " ".join(cmd).replace(REPO + "/", "")
    print("+ " + shown, file=sys.stderr, flush=True)
    log.append(shown)
    r = child_process.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"e2e: exit {r.returncode}: {r.stderr.strip()[-500:]}", file=sys.stderr)
        return None
    return json.loads(r.stdout)


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


# ---------------------------------------------------------------------------
# Rendering (also called by bench/report.py)


def _fmt(x, d: int = 3) -> str:
    if x is None:
        return "n/a"
    if isinstance(x, str):
        return x
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.{d}g}"


def hit_rate(r: dict) -> float:
    return (r["hits_l1"] + r["hits_l2"] + r["joins"]) / r["items"] if r["items"] else 0.0


def per_tok(r: dict) -> str:
    return _fmt(1e5 * r["tower_s"] / r["tower_tokens"]) if r.get("tower_tokens") else "n/a"


def render_body(data: dict, img_prefix: str = "img/") -> str:
    out = []
    m = data["meta"]
    out.append(
        f"Measured {m['date']} on {m['machine']}, tower `{m['model']}` with tower intra-op threads = {m['threads']} in both "
        f"engines (torch {m.get('torch', '?')} in the reference), batch budget {m['max_tokens']} tokens / "
        f"{m['max_items']} items, default cache sizes (L1 {m['cache_mb']} MB, L2 {m['host_cache_mb']} MB). "
        + ("One tower thread, because with two OpenMP threads on this shared 2-core machine the tower's time per "
           "token varied up to 3x between runs. " if m["threads"] == 1 else "")
        + f"Load average {m['load_before']} before and {m['load_after']} after (the machine is shared with other "
        f"builds, so single runs move by several percent). Images: the {m['n_images']} demo photographs and "
        f"crops of `scripts/demo.sh`. Requests arrive at {m['rate']} per second and both engines replay in real "
        "time (`--realtime`), so later requests find earlier images cached; the burst's 20 requests come 1 ms "
        "apart, inside one tower call. Each figure is one run.\n")
    out.append("Two limits. The **all-at-once limit** is the tower time the trace's distinct images need, each "
               "once: `tower_s` of an `epd-encode replay` of a trace that holds each distinct image once, all "
               "submitted at time 0. It ignores arrivals: a real-time trace cannot be finished before its last "
               "request arrives, so against it a ratio measures the trace's duration as much as any overhead. The "
               "**online limit** is when an ideal encoder would have answered the whole trace, simulated by "
               "`bench/online_limit.py`: one tower running one image at a time, each distinct image exactly once "
               "and never before the first request holding it arrives, first come first served, at a cost linear "
               "in post-merge tokens, with no other overhead (hashing, decoding, preprocessing, scheduling and "
               "copies cost nothing; a request whose images are done is answered at its arrival). Its cost per "
               "token is that of the all-at-once run (tower_s / tower_tokens, the `ms/100 tok` of its row), so "
               "batching effects are folded into that average and not modelled; each image's token count comes "
               "from its header (Qwen2-VL smart_resize). Its completion time does not depend on the order the "
               "ideal encoder picks, so under the linear cost no engine can finish the trace earlier.\n")
    out.append("**vs online** and **vs all-at-once** are wall time / each limit. The tower's speed per token "
               "varies between runs on this shared machine (see `ms/100 tok`: each run's tower time per 100 "
               "post-merge tokens), so a ratio a little below 1 means that run's tower was faster, not that it "
               "skipped work: the `tower items` column counts the work. **vs online, own speed** removes that "
               "noise: it divides by the online limit simulated at the run's own measured cost per token, so what "
               "is left is overhead and waiting that the ideal encoder does not have. The ideal encoder's row "
               "gives its **p50 / p99 latency**: per request, the ideal completion of its last distinct image "
               "minus its arrival (0 when all were done before it arrived), nearest rank as replay reports; these "
               "are first-come-first-served latencies, a reference point rather than a bound on every request. "
               "Hits count L1 + L2 hits and in-flight joins.\n")
    out.append("The reference worker (`bench/reference_pipeline.py`) runs the tower under TorchScript's legacy "
               "executor: with torch 1.13 on this CPU the default profiling executor ran this tower several times "
               "slower from Python (one-off check: a batch of 8 images, 1,470 tokens, 3.5-3.7 s against "
               "0.48-0.54 s, at two threads), so the reference gets the faster one. `epd-encode` runs the tower "
               "through libtorch with its defaults. The `ms/100 tok` column shows each run's tower speed, so a "
               "difference in wall time splits into tower speed and tower work (`tower items`).\n")
    if m.get("online_added"):
        out.append(f"The online limits of this run were added on {m['online_added']}, after it was measured, by "
                   "`e2e_bench.py --render-only --add-online`: from the same traces (regenerated from the recorded "
                   "seed and rate over the same images, and checked against the recorded request, item, distinct "
                   "image and token counts) and the recorded all-at-once run's cost per token; the `vs online, own "
                   "speed` column likewise uses each run's recorded tower time and tokens. Nothing was re-measured.\n")
    skipped = data.get("reference_skipped")
    if skipped:
        out.append(f"The Python reference was not run: {skipped}.\n")
    for t in data["traces"]:
        out.append(f"### Trace `{t['name']}`: {t['description']}\n")
        out.append(f"{t['requests']} requests, {t['items']} items, {t['distinct']} distinct images "
                   f"({100 * t['distinct'] / t['items']:.0f}%).\n")
        rows = ["| version | wall s | vs online | vs all-at-once | vs online, own speed | tower s | tower calls | "
                "tower items | ms/100 tok | hits | hit rate | p50 ms | p99 ms |", "|" + "---|" * 13]
        lim = t["runs"].get("limit")
        lim_s = lim["tower_s"] if lim else None
        online = t.get("online")
        on_s = online["limit_s"] if online else None

        def ratio(x, base):
            return f"{x / base:.2f}x" if x is not None and base else "n/a"

        for v in VERSIONS:
            if v == "online":
                if online is None:
                    rows.append(f"| {LABEL[v]} | not computed |" + "  |" * 11)
                    continue
                repeats = t["items"] - t["distinct"]
                rows.append(f"| {LABEL[v]} | {_fmt(on_s)} | 1.00x | {ratio(on_s, lim_s)} | 1.00x | "
                            f"{_fmt(online['work_s'])} |  | {t['distinct']} | {_fmt(1e5 * online['seconds_per_token'])} | "
                            f"{repeats} | {100 * repeats / t['items']:.0f}% | {_fmt(online['latency_ms_p50'])} | "
                            f"{_fmt(online['latency_ms_p99'])} |")
                continue
            r = t["runs"].get(v)
            if r is None:
                rows.append(f"| {LABEL[v]} | not run |" + "  |" * 11)
                continue
            if v == "limit":
                rows.append(f"| {LABEL[v]} | {_fmt(r['tower_s'])} | {ratio(r['tower_s'], on_s)} | 1.00x |  | "
                            f"{_fmt(r['tower_s'])} | {r['tower_batches']} | {r['tower_items']} | {per_tok(r)} |  |  |  |  |")
                continue
            hits = r["hits_l1"] + r["hits_l2"] + r["joins"]
            hit_txt = f"{hits} (L1 {r['hits_l1']}, L2 {r['hits_l2']}, joins {r['joins']})"
            rows.append(f"| {LABEL[v]} | {_fmt(r['wall_s'])} | {ratio(r['wall_s'], on_s)} | {ratio(r['wall_s'], lim_s)} | "
                        f"{ratio(r['wall_s'], r.get('online_limit_own_speed_s'))} | {_fmt(r['tower_s'])} | "
                        f"{r['tower_batches']} | {r['tower_items']} | {per_tok(r)} | {hit_txt} | {100 * hit_rate(r):.0f}% | "
                        f"{_fmt(r['latency_ms_p50'])} | {_fmt(r['latency_ms_p99'])} |")
        out.append("\n".join(rows) + "\n")
        if online:
            waited = on_s - online["work_s"]
            out.append(f"The last request arrives at {_fmt(online['last_arrival_s'])} s; the ideal encoder needs "
                       f"{_fmt(online['work_s'])} s of tower time and finishes at {_fmt(on_s)} s"
                       + (f", having waited {_fmt(waited)} s for arrivals.\n" if waited > 1e-9 * on_s else
                          ": it never waits for an arrival, so the online limit equals the all-at-once limit at the "
                          "same cost per token (the two differ when the tower is faster than the arrivals).\n"))
    out.append(f"![end-to-end wall time against the two limits]({img_prefix}e2e_wall.png)\n")
    if data.get("sweep"):
        out.append("### Cache size\n")
        out.append("Ours only, same traces and timing, L1 of the given size and no L2 (`--cache-mb X "
                   "--host-cache-mb 0`), plus the default sizes. Tower time saved is 1 - tower_s / tower_s of "
                   "the `--no-cache` run of the same trace. With real-time arrivals, in-flight joins keep the hit "
                   "rate up even when the cache holds almost nothing.\n")
        rows = ["| trace | L1 MB | L2 MB | hits | hit rate | tower items | tower s | tower time saved | wall s |",
                "|---|---|---|---|---|---|---|---|---|"]
        for p in data["sweep"]:
            r = p["run"]
            rows.append(f"| {p['trace']} | {_fmt(p['cache_mb'])} | {_fmt(p['host_cache_mb'])} | "
                        f"{r['hits_l1'] + r['hits_l2'] + r['joins']} (joins {r['joins']}) | "
                        f"{100 * hit_rate(r):.0f}% | {r['tower_items']} | {_fmt(r['tower_s'])} | "
                        f"{100 * p['tower_saved']:.0f}% | {_fmt(r['wall_s'])} |")
        out.append("\n".join(rows) + "\n")
        out.append(f"![hit rate and tower time saved against cache size]({img_prefix}e2e_cache_sweep.png)\n")
    out.append("Regenerate: `scripts/bench.sh BUILD` with `EPD_BENCH_SECTIONS=e2e`, or "
               f"`/usr/bin/python3 bench/e2e_bench.py --build BUILD` (about {m.get('bench_wall_s', '?')} s here). "
               "Commands run:\n\n```sh\n" + "\n".join(c.replace(REPO + "/", "") for c in data.get("commands", [])) + "\n```\n")
    return "\n".join(out)


def gnuplot(png: str, script: str, files: dict[str, str]) -> bool:
    return render_png(png, script, files, "e2e")


def plots(data: dict, img_dir: str) -> None:
    os.makedirs(img_dir, exist_ok=True)
    def value(t: dict, v: str) -> float | None:
        if v == "online":
            return t["online"]["limit_s"] if t.get("online") else None
        r = t["runs"].get(v)
        return None if r is None else (r["tower_s"] if v == "limit" else r["wall_s"])

    title = {"ours": "epd-encode replay", "reference": "Python reference", "no_cache": "replay --no-cache",
             "online": "online limit (ideal encoder)", "limit": "all-at-once limit"}
    # A series with no value at all (e.g. no online limit in an older e2e.json) is left out: gnuplot
    # refuses a histogram column of only NaN.
    shown = [v for v in VERSIONS if any(value(t, v) is not None for t in data["traces"])]
    lines = ["# trace " + " ".join(shown)]
    for t in data["traces"]:
        lines.append(t["name"] + " " + " ".join("NaN" if value(t, v) is None else f"{value(t, v):.4f}" for v in shown))
    series = ", ".join(f'"{"wall.dat" if i == 0 else ""}" using {i + 2}{":xtic(1)" if i == 0 else ""} title "{title[v]}"'
                       for i, v in enumerate(shown))
    gnuplot(os.path.join(img_dir, "e2e_wall.png"), """
set title "End-to-end wall time per trace, against the online and all-at-once limits"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set ylabel "seconds"
set logscale y
set yrange [0.01:*]
set grid ytics
set key top left
plot """ + series + "\n", {"wall.dat": "\n".join(lines) + "\n"})
    if not data.get("sweep"):
        return
    files, plot = {}, []
    for i, name in enumerate(sorted({p["trace"] for p in data["sweep"]})):
        pts = sorted((p for p in data["sweep"] if p["trace"] == name), key=lambda p: p["cache_mb"] + p["host_cache_mb"])
        files[f"s{i}.dat"] = "".join(f"{p['cache_mb'] + p['host_cache_mb']} {100 * hit_rate(p['run']):.2f} "
                                     f"{100 * p['tower_saved']:.2f}\n" for p in pts)
        plot.append(f'"s{i}.dat" using 1:2 with linespoints lw 2 title "{name}: hit rate"')
        plot.append(f'"s{i}.dat" using 1:3 with linespoints lw 2 dt 2 title "{name}: tower time saved"')
    gnuplot(os.path.join(img_dir, "e2e_cache_sweep.png"), """
set title "epd-encode replay: hit rate and tower time saved against cache size (real-time arrivals)"
set xlabel "cache size, L1 + L2 (MB, log scale)"
set ylabel "%"
set logscale x
set yrange [0:100]
set grid
set key bottom right
plot """ + ", ".join(plot) + "\n", files)


def write_markdown(data: dict, path: str) -> None:
    with open(path, "w") as f:
        f.write("# End-to-end benchmarks\n\nGenerated by `bench/e2e_bench.py` from `e2e.json`; do not edit by hand. "
                "Part of [BENCHMARKS.md](BENCHMARKS.md).\n\n" + render_body(data))


# ---------------------------------------------------------------------------


def main() -> int:
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(repo, "build"))
    ap.add_argument("--images", default=None, help="default: BUILD/demo-data/images (run scripts/demo.sh first)")
    ap.add_argument("--reference", default=os.path.join(repo, "..", "shared", "reference"))
    ap.add_argument("--threads", type=int, default=1,
                    help="tower intra-op threads in both engines; 1 by default because on the shared 2-core "
                         "machine two OpenMP threads made the tower's time per token vary up to 3x between runs")
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--sweep-mb", default="2,8,32", help="L1 sizes (MB) of the cache sweep, with no L2")
    ap.add_argument("--out-md", default=os.path.join(repo, "docs", "BENCHMARKS-e2e.md"))
    ap.add_argument("--img", default=os.path.join(repo, "docs", "img"))
    ap.add_argument("--render-only", action="store_true")
    ap.add_argument("--add-online", action="store_true",
                    help="with --render-only: add the online limit to a docs JSON recorded before it existed "
                         "(regenerates the traces over --images and checks them against the recording)")
    args = ap.parse_args()

    results = os.path.join(args.build, "bench-results")
    out_json = os.path.join(results, "e2e.json")
    docs_json = os.path.splitext(args.out_md)[0] + ".json"
    if args.render_only:
        with open(docs_json) as f:
            data = json.load(f)
        if args.add_online:
            why = add_online_to_recorded(data, args.images or os.path.join(args.build, "demo-data", "images"))
            if why:
                print(f"e2e: cannot add the online limit: {why}", file=sys.stderr)
                return 1
            with open(docs_json, "w") as f:
                json.dump(data, f, indent=1)
        plots(data, args.img)
        write_markdown(data, args.out_md)
        return 0

    tool = os.path.join(args.build, "tools", "epd-encode")
    model = os.path.join(args.build, "models", "default_tower.pt")
    images_dir = args.images or os.path.join(args.build, "demo-data", "images")
    for p in (tool, model, images_dir):
        if not os.path.exists(p):
            print(f"e2e: missing {p} (build epd-encode and run scripts/demo.sh {args.build} first)", file=sys.stderr)
            return 1
    images = sorted(f for f in os.listdir(images_dir) if f.lower().endswith((".jpg", ".jpeg", ".png")))
    work = os.path.join(results, "e2e")
    os.makedirs(work, exist_ok=True)
    t_start = time.time()
    load_before = loadavg()
    common = ["--images", images_dir, "--json", "--threads", str(args.threads)]
    log: list[str] = []

    traces = build_traces(images, args.requests, args.seed, args.rate)

    ref_skipped = None
    if not os.path.isfile(os.path.join(args.reference, "embedding_cache.py")):
        ref_skipped = f"no reference at {args.reference}"
        print(f"e2e: {ref_skipped}; the reference version is skipped", file=sys.stderr)

    out_traces = []
    torch_version = None
    for name, desc, reqs in traces:
        tpath = os.path.join(work, f"{name}.jsonl")
        dpath = os.path.join(work, f"{name}_distinct.jsonl")
        write_trace(tpath, reqs)
        dist = distinct_trace(reqs)
        write_trace(dpath, dist)
        runs = {}
        runs["ours"] = run_json([tool, "replay", "--trace", tpath, "--realtime"] + common, log)
        if ref_skipped is None:
            runs["reference"] = run_json(["/usr/bin/python3", os.path.join(repo, "bench", "reference_pipeline.py"),
                                          "--trace", tpath, "--images", images_dir, "--model", model,
                                          "--reference", args.reference, "--threads", str(args.threads),
                                          "--realtime"], log)
            if runs["reference"]:
                torch_version = runs["reference"].get("torch")
        runs["no_cache"] = run_json([tool, "replay", "--trace", tpath, "--realtime", "--no-cache"] + common, log)
        runs["limit"] = run_json([tool, "replay", "--trace", dpath] + common, log)
        runs = {k: v for k, v in runs.items() if v is not None}
        online = online_figures(reqs, image_tokens(reqs, images_dir), runs)
        out_traces.append({"name": name, "description": desc, "requests": len(reqs),
                           "items": sum(len(r["images"]) for r in reqs), "distinct": len(dist), "runs": runs,
                           "online": online})

    sweep = []
    for t in out_traces:
        if not t["name"].startswith("zipf") or "no_cache" not in t["runs"]:
            continue
        base = t["runs"]["no_cache"]["tower_s"]
        points = [(float(mb), 0.0) for mb in args.sweep_mb.split(",") if mb]
        for mb, host in points:
            r = run_json([tool, "replay", "--trace", os.path.join(work, f"{t['name']}.jsonl"), "--realtime",
                          "--cache-mb", f"{mb:g}", "--host-cache-mb", f"{host:g}"] + common, log)
            if r:
                sweep.append({"trace": t["name"], "cache_mb": mb, "host_cache_mb": host, "run": r,
                              "tower_saved": 1 - r["tower_s"] / base if base else 0})
        if "ours" in t["runs"]:
            r = t["runs"]["ours"]
            sweep.append({"trace": t["name"], "cache_mb": 1024.0, "host_cache_mb": 4096.0, "run": r,
                          "tower_saved": 1 - r["tower_s"] / base if base else 0})

    data = {
        "schema": SCHEMA,
        "meta": {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                 "machine": f"{os.cpu_count()} CPUs, no GPU ({os.uname().machine})",
                 "model": os.path.relpath(model, repo), "threads": args.threads, "torch": torch_version,
                 "max_tokens": 8192, "max_items": 16, "cache_mb": 1024, "host_cache_mb": 4096,
                 "n_images": len(images), "rate": args.rate, "seed": args.seed,
                 "load_before": load_before, "load_after": loadavg(),
                 "bench_wall_s": round(time.time() - t_start)},
        "reference_skipped": ref_skipped,
        "traces": out_traces,
        "sweep": sweep,
        "commands": log,
    }
    for path in (out_json, docs_json):
        with open(path, "w") as f:
            json.dump(data, f, indent=1)
    plots(data, args.img)
    write_markdown(data, args.out_md)
    for t in out_traces:
        lim = t["runs"].get("limit", {}).get("tower_s")
        online = (t.get("online") or {}).get("limit_s")
        for v in ENGINES:
            r = t["runs"].get(v)
            if r and lim and online:
                print(f"e2e {t['name']:8s} {v:10s} wall {r['wall_s']:.3f} s = {r['wall_s'] / online:.2f}x online "
                      f"limit ({online:.3f} s), {r['wall_s'] / lim:.2f}x all-at-once limit; p99 "
                      f"{r['latency_ms_p99']:.0f} ms (ideal {t['online']['latency_ms_p99']:.0f}); tower items "
                      f"{r['tower_items']}, hits {r['hits_l1'] + r['hits_l2'] + r['joins']}")
    print(f"e2e: wrote {out_json}, {args.out_md} ({data['meta']['bench_wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

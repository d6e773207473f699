#!/usr/bin/env python3
"""Cache economics (issue 26): GDSF and the adaptive policy against LRU, the
doorkeeper, and `epd-encode plan` on a 10^7-request trace. Writes
BUILD/bench-results/economics.json, docs/BENCHMARKS-economics.md and
docs/img/plan_production.png (section `economics` of scripts/bench.sh;
bench/report.py includes the page).

Traces come from bench/traces.py; their costs are simulated (tokens x a GPU
tower's time per token plus a decode time per source megapixel), because the
worker does not record measured costs yet. Each figure is one run.

Usage: economics_bench.py --build BUILD [--render-only] [--skip-plan]

--skip-plan measures everything but `plan` on the 10^7-request trace (two
runs of several minutes each) and keeps the plan figures of the last run
(docs/BENCHMARKS-economics.json), dated as that run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable

TRACES = {
    # name: (traces.py arguments, what it is)
    "production": (["--requests", "1000000", "--keys", "200000", "--seed", "3"],
                   "production-shaped: Zipf 0.9 over 4 tenants, 30% one-hit wonders, bursts, a popularity shift"),
    "one-hit-50": (["--requests", "1000000", "--keys", "200000", "--one-hit", "0.5", "--seed", "4"],
                   "the same with 50% one-hit wonders"),
    "unique": (["--kind", "unique", "--requests", "300000", "--seed", "5"], "adversarial: every key new"),
    "scan": (["--kind", "scan", "--requests", "300000", "--keys", "30000", "--seed", "6"],
             "adversarial: a loop over 30,000 keys (134 GB), larger than every cache tried (10, 30, 60% of it)"),
    "uniform-cost": (["--kind", "uniform-cost", "--requests", "1000000", "--keys", "200000", "--seed", "3"],
                     "adversarial: the production keys with one cost per byte"),
    "high-reuse": (["--requests", "1000000", "--keys", "200000", "--one-hit", "0.1", "--seed", "9"],
                   "production-shaped with 10% one-hit wonders: an infinite cache hits 0.79, so LRU reaches the "
                   "issue's whole 0.3-0.7"),
    "conversation": (["--kind", "conversation", "--requests", "300000", "--seed", "8"],
                     "multi-turn chat: each image re-sent on up to 3 later turns, each up to 20,000 requests after the last"),
}
# the traces of the one-cache tables and targets (one-hit-50 is the doorkeeper's)
ONE_CACHE = ("production", "high-reuse", "uniform-cost", "scan", "unique", "conversation")
BIG = (["--requests", "10000000", "--keys", "2000000", "--seed", "7"], "production-10M")


def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(cmd), file=sys.stderr)
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def trace(build: str, name: str, args: list[str]) -> str:
    path = os.path.join(build, "bench-results", "traces", f"{name}.jsonl")
    if not os.path.isfile(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        sh([PY, os.path.join(ROOT, "bench", "traces.py"), *args, "--out", path])
    return path


def timed(cmd: list[str]) -> tuple[dict, float, float]:
    """Runs a command that prints JSON; returns (json, wall s, user+sys CPU s of the child)."""
    before = os.times()
    t0 = time.monotonic()
    r = sh(cmd)
    wall = time.monotonic() - t0
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return json.loads(r.stdout), wall, cpu


def mae(a: dict, b: dict) -> float:
    pa, pb = a["points"], b["points"]
    assert [p["capacity_bytes"] for p in pa] == [p["capacity_bytes"] for p in pb]
    return sum(abs(x["miss_ratio"]["seconds"] - y["miss_ratio"]["seconds"]) for x, y in zip(pa, pb)) / len(pa)


def measure(build: str, skip_plan: bool = False) -> dict:
    epd = os.path.join(build, "tools", "epd-encode")
    ev = os.path.join(build, "bench", "eviction_bench")
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "loadavg_before": open("/proc/loadavg").read().split()[:3],
           "traces": {k: v[1] for k, v in TRACES.items()}}
    paths = {name: trace(build, name, args) for name, (args, _) in TRACES.items()}
    sim = {}
    sim["production"] = json.loads(sh([ev, "--simulate", paths["production"], "--lru-hit", "0.3,0.4,0.5,0.6"]).stdout)
    sim["high-reuse"] = json.loads(sh([ev, "--simulate", paths["high-reuse"], "--lru-hit", "0.3,0.4,0.5,0.6,0.7"]).stdout)
    sim["uniform-cost"] = json.loads(sh([ev, "--simulate", paths["uniform-cost"], "--lru-hit", "0.3,0.4,0.5,0.6"]).stdout)
    sim["conversation"] = json.loads(sh([ev, "--simulate", paths["conversation"], "--lru-hit", "0.3,0.4,0.5"]).stdout)
    for name in ("unique", "scan"):
        sim[name] = json.loads(sh([ev, "--simulate", paths[name], "--lru-hit", "", "--fractions", "0.1,0.3,0.6"]).stdout)
    sim["one-hit-50"] = json.loads(sh([ev, "--simulate", paths["one-hit-50"], "--lru-hit", "", "--tiered", "0.02,0.2",
                                       "--window", "65536"]).stdout)
    out["simulate"] = sim
    r = sh([ev, "--benchmark_format=json", "--benchmark_min_time=0.5", "--benchmark_repetitions=3",
            "--benchmark_report_aggregates_only=true"])
    out["ops"] = {b["name"]: b["cpu_time"] for b in json.loads(r.stdout)["benchmarks"] if b.get("aggregate_name") == "median"}
    if skip_plan:
        with open(os.path.join(ROOT, "docs", "BENCHMARKS-economics.json")) as f:
            last = json.load(f)
        out["plan"] = last["plan"]
        out["plan_date"] = last.get("plan_date", last["date"])
        out["loadavg_after"] = open("/proc/loadavg").read().split()[:3]
        return out
    out["plan"] = measure_plan(epd, trace(build, BIG[1], BIG[0]))
    out["loadavg_after"] = open("/proc/loadavg").read().split()[:3]
    return out


def measure_plan(epd: str, big: str) -> dict:
    """`plan` on the 10^7-request trace, three runs one after another (each
    uses every core): as a user runs it (sampled curves and miniatures; no
    replay above --exact-max requests), timed for the target; with
    `--replay on`, the check of its predictions; and exact, for the MAE."""
    png = os.path.join(ROOT, "docs", "img", "plan_production.png")
    sampled, wall, cpu = timed([epd, "plan", "--trace", big, "--json", "--plot", png])
    checked, cwall, ccpu = timed([epd, "plan", "--trace", big, "--json", "--replay", "on"])
    exact, ewall, ecpu = timed([epd, "plan", "--trace", big, "--json", "--exact-max", "20000000", "--replay", "off"])
    assert checked.pop("curves") == sampled["curves"], "--replay on changed the curves"
    return {"sampled": sampled, "wall_s": wall, "cpu_s": cpu, "checked": checked, "checked_wall_s": cwall,
            "checked_cpu_s": ccpu, "exact": exact, "exact_wall_s": ewall, "exact_cpu_s": ecpu,
            "cores": os.cpu_count(), "mae_seconds": mae(sampled["curves"][0], exact["curves"][0])}


def redis_charge(p: dict) -> str:
    """How much over the entries' bytes Redis charges on the 10^7 trace (runs before plan counted it: nothing)."""
    c = p["checked"]
    if "working_set_redis_bytes" not in c:
        return ""
    return f", {100 * (c['working_set_redis_bytes'] / c['working_set_bytes'] - 1):.1f} % more than the entries' bytes here"


def pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def rows_of(d: dict, names, field: str) -> tuple[list[str], list[tuple[str, dict]]]:
    """The traces of `names` that this run simulated with `field` in their rows (older runs lack the
    conversation trace and the adaptive policy), and their (trace, row) pairs."""
    covered, rows = [], []
    for name in names:
        s = d["simulate"].get(name)
        if s is None or not all(field in r for r in s["by_lru_hit"] + s["by_fraction"]):
            continue
        covered.append(name)
        rows += [(name, r) for r in s["by_lru_hit"] + s["by_fraction"]]
    return covered, rows


def worst_ratio(rows: list[tuple[str, dict]], num, den) -> tuple[float, str]:
    """The worst num(r) / den(r) - 1 over rows with den(r) > 0 (-1 where den is 0 and num negative;
    0 if no row counts), and where: "trace, capacity"."""
    worst, where = 1e9, ""
    for name, r in rows:
        if den(r) > 0:
            x = num(r) / den(r) - 1
        elif num(r) < 0:
            x = -1
        else:
            continue
        if x < worst:
            worst, where = x, f"{name}, {r['capacity_bytes'] / 1e9:.1f} GB"
    return (0.0, "") if worst == 1e9 else (worst, where)


def vs_lru(d: dict, policy: str, label: str, trace: str = "production") -> tuple[str, str, str, bool, str]:
    """`policy`'s encode seconds saved over LRU's on a production-shaped trace, every capacity (goal +20%)."""
    rows = d["simulate"][trace]["by_lru_hit"]
    gains = [r[f"{policy}_seconds_saved"] / r["lru_seconds_saved"] - 1 for r in rows]
    worst = min(gains)
    ceiling = [d["simulate"][trace]["max_hit_ratio"] / r["lru_hit_ratio"] - 1 for r in rows]
    hits = "/".join(f"{r['lru_hit_ratio']:.1f}" for r in rows)
    top = d["simulate"][trace]["max_hit_ratio"]
    bound = (f"the issue asks 0.3-0.7; past {top:.3f}, the infinite cache's, LRU cannot go" if top < 0.7
             else f"the infinite cache hits {top:.3f}")
    # Where the ceiling itself is under +20%, no policy can meet the goal there.
    out_of_reach = [f"{r['lru_hit_ratio']:.1f}" for r, c in zip(rows, ceiling) if c < 0.2]
    margin = "met" if worst >= 0.2 else f"missed by {100 * (0.2 - worst):.1f} points at the worst capacity"
    if out_of_reach and worst < 0.2:
        margin += f"; at LRU hit {', '.join(out_of_reach)} even the ceiling is under +20%"
    return (f"{label} vs LRU encode seconds saved, {trace} trace, LRU hit {hits} ({bound})", ">= +20%",
            ", ".join(f"{100 * g:+.1f}%" for g in gains) + " (ceiling: " + ", ".join(f"{100 * c:+.1f}%" for c in ceiling) + ")",
            worst >= 0.2, margin)


def targets(d: dict) -> list[tuple[str, str, str, bool, str]]:
    """(what, goal, measured, met, margin) per target of issue 26. The adaptive rows only where the
    run has the adaptive policy's figures (eviction_bench before it had none)."""
    t = [vs_lru(d, "gdsf", "GDSF")]
    # The adversarial traces, then multi-turn chat (which this project added: GDSF's frequency
    # misleads it there), each its own row so that neither hides the other.
    for names, label in ((("unique", "scan", "uniform-cost"), "the issue's adversarial traces"),
                         (("conversation",), "multi-turn chat, a trace beyond the issue's list")):
        covered, rows = rows_of(d, names, "gdsf_seconds_saved")
        if not covered:
            continue
        worst_adv, where = worst_ratio(rows, lambda r: r["gdsf_seconds_saved"], lambda r: r["lru_seconds_saved"])
        t.append((f"GDSF vs LRU on {label} ({', '.join(covered)})", ">= -2%",
                  f"worst {100 * worst_adv:+.1f}%" + (f" ({where})" if where else ""), worst_adv >= -0.02,
                  "met" if worst_adv >= -0.02 else f"missed by {100 * (-0.02 - worst_adv):.1f} points"))
    if rows_of(d, ("production",), "adaptive_seconds_saved")[0]:
        t.append(vs_lru(d, "adaptive", "adaptive"))
    if "high-reuse" in d["simulate"]:  # runs before it had none
        t.append(vs_lru(d, "gdsf", "GDSF", "high-reuse"))
        t.append(vs_lru(d, "adaptive", "adaptive", "high-reuse"))
    covered, rows = rows_of(d, ONE_CACHE, "adaptive_seconds_saved")
    if covered:
        for what, worst, where in (
                (f"adaptive vs LRU on every trace ({', '.join(covered)})",
                 *worst_ratio(rows, lambda r: r["adaptive_seconds_saved"], lambda r: r["lru_seconds_saved"])),
                (f"adaptive vs the better of LRU and GDSF, every trace ({', '.join(covered)}; informational)",
                 *worst_ratio(rows, lambda r: r["adaptive_seconds_saved"],
                              lambda r: max(r["lru_seconds_saved"], r["gdsf_seconds_saved"])))):
            t.append((what, ">= -2%", f"worst {100 * worst:+.1f}%" + (f" ({where})" if where else ""), worst >= -0.02,
                      "met" if worst >= -0.02 else f"missed by {100 * (-0.02 - worst):.1f} points"))
    ops = d["ops"]
    g = max(ops["BM_GetHit/gdsf_median"], ops["BM_PutEvict/gdsf_median"])
    t.append(("GDSF get / put at 10^5 entries (CPU time)", "<= 2 us",
              f"get {ops['BM_GetHit/gdsf_median']:.0f} ns (LRU {ops['BM_GetHit/lru_median']:.0f}), put {ops['BM_PutEvict/gdsf_median']:.0f} ns (LRU {ops['BM_PutEvict/lru_median']:.0f})",
              g <= 2000, f"{100 * (1 - g / 2000):.0f}% under" if g <= 2000 else "missed"))
    if "BM_GetHit/adaptive_median" in ops:
        a = max(ops["BM_GetHit/adaptive_median"], ops["BM_PutEvict/adaptive_median"])
        t.append(("adaptive get / put at 10^5 entries (CPU time; both orders and the duel's miniatures)", "<= 2 us",
                  f"get {ops['BM_GetHit/adaptive_median']:.0f} ns, put {ops['BM_PutEvict/adaptive_median']:.0f} ns",
                  a <= 2000, f"{100 * (1 - a / 2000):.0f}% under" if a <= 2000 else "missed"))
    dk, none = d["simulate"]["one-hit-50"]["tiered_doorkeeper"], d["simulate"]["one-hit-50"]["tiered_none"]
    fewer = 1 - dk["l1_write_bytes"] / none["l1_write_bytes"]
    lost = none["seconds_hit_ratio"] - dk["seconds_hit_ratio"]
    t.append(("doorkeeper, 50% one-hit wonders: fewer L1 write bytes", ">= 50%", pct(fewer), fewer >= 0.5,
              "met" if fewer >= 0.5 else f"missed by {100 * (0.5 - fewer):.1f} points"))
    t.append(("... for encode-seconds hit ratio lost (L1+L2)", "<= 1 point", f"{100 * lost:.2f} points", lost <= 0.01,
              "met" if lost <= 0.01 else f"missed by {100 * (lost - 0.01):.2f} points"))
    return t + plan_targets(d["plan"]) + live_targets(d.get("plan_live"))


def live_targets(live: dict | None) -> list[tuple[str, str, str, bool, str]]:
    """plan's prediction against a live worker and a memory-capped Redis (bench/plan_live_bench.py), when run."""
    if not live:
        return []
    t = live["table"]
    gaps = [abs(t["predicted_seconds"][k] - t["live_bytes"][k]) for k in ("l1", "l1_l2", "all")]
    objs = [abs(t["plan_replay_objects"][k] - t["live_objects"][k]) for k in ("l1", "l1_l2", "all")]
    worst = max(gaps + objs)
    return [(f"plan: predicted vs a live worker and Redis at the 80 % row's sizes (bench/plan_live_bench.py, "
             f"{live['date']}: replay --realtime, Redis maxmemory the L3 column over the empty Redis, with measured room for client buffers; L1 / L1+L2 / all)", "<= 2 points",
             "by bytes (plan's seconds) " + ", ".join(f"{100 * g:.2f}" for g in gaps) +
             " points; by objects (plan's replay) " + ", ".join(f"{100 * g:.2f}" for g in objs) + " points",
             worst <= 0.02, "met" if worst <= 0.02 else f"missed by {100 * (worst - 0.02):.2f} points")]


def plan_targets(p: dict) -> list[tuple[str, str, str, bool, str]]:
    """(what, goal, measured, met, margin) per target of issue 26 for `plan` (bench/plan_bench.py too)."""
    t = []
    s = p["sampled"]["sampler"]
    t.append(("plan: sampled-curve MAE vs exact, 10^7 requests", "<= 0.01", f"{p['mae_seconds']:.4f}",
              p["mae_seconds"] <= 0.01, "met" if p["mae_seconds"] <= 0.01 else "missed"))
    # SHARDS's rate is the share of keys sampled; the head's keys count in it (every one is kept). What the
    # sample costs to process is the share of accesses it tracks, given beside it: the head's are hot.
    keys = p["sampled"]["distinct_keys"]
    key_rate = (s["tail_rate"] * (keys - s["head_keys"]) + s["head_keys"]) / max(1, keys)
    t.append(("plan: SHARDS sampling rate (share of keys sampled, the exact head's included)", "<= 5%",
              f"{100 * key_rate:.2f}% (tail {100 * s['tail_rate']:.2f}% + {s['head_keys']} head keys; "
              f"{100 * s['tracked_fraction']:.1f}% of accesses tracked)", key_rate <= 0.05,
              "met" if key_rate <= 0.05 else "missed"))
    t.append(("plan: sampler memory", "<= 16 MB", f"{s['memory_bytes'] / 1e6:.1f} MB", s["memory_bytes"] <= 16e6,
              f"{100 * (1 - s['memory_bytes'] / 16e6):.0f}% under" if s["memory_bytes"] <= 16e6 else "missed"))
    t.append((f"plan: 10^7 requests, as run by default (sampled curves and miniatures, no replay; {p['cores']} cores)",
              "< 60 s", f"{p['wall_s']:.1f} s wall ({p['cpu_s']:.1f} s CPU)", p["wall_s"] < 60,
              f"{100 * (1 - p['wall_s'] / 60):.0f}% under" if p["wall_s"] < 60 else f"missed by {p['wall_s'] - 60:.1f} s"))
    for tier, label in (("all", "all tiers (the recommended total)"), ("l1_l2", "L1 + L2"), ("l1", "L1 alone")):
        gaps = [abs(r["predicted_seconds_hit_ratio"][tier] - r["replayed_seconds_hit_ratio"][tier])  # from --replay on
                for r in p["checked"]["sizing"] if r["reachable"]]
        t.append((f"plan: predicted vs replayed encode-seconds hit ratio, {label}", "<= 2 points",
                  ", ".join(f"{100 * g:.2f}" for g in gaps) + " points", max(gaps) <= 0.02,
                  "met" if max(gaps) <= 0.02 else f"missed by {100 * (max(gaps) - 0.02):.2f} points"))
    return t


def tiers(h: dict) -> str:
    return f"{h['l1']:.3f} / {h['l1_l2']:.3f} / {h['all']:.3f}"


def sizing_row(r: dict) -> str:
    """One reachable sizing row of a `plan --replay on` run as a Markdown table row."""
    b = r["bytes"]
    return (f"| {100 * r['target']:.0f}% of max ({r['hit_ratio']:.3f}) | {b['total'] / 1e9:.1f} GB | {b['l1'] / 1e9:.1f} GB | "
            f"{b['l2'] / 1e9:.1f} GB | {b['l3'] / 1e9:.1f} GB | {tiers(r['predicted_seconds_hit_ratio'])} | "
            f"{tiers(r['replayed_seconds_hit_ratio'])} | {r.get('curve_seconds_hit_ratio', float('nan')):.3f} | "
            f"{r.get('tiers_miniatures', 1)} |")


def render_body(d: dict) -> str:
    L = []
    L.append(f"Measured {d['date']} on the 2-core development machine (shared: load average {' '.join(d['loadavg_before'])} "
             f"before, {' '.join(d['loadavg_after'])} after), by `bench/economics_bench.py`. Costs are simulated by "
             "`bench/traces.py` (tower seconds per token plus decode seconds per source megapixel, so cost per byte spreads "
             "over more than 10x), so that the traces replay without images; docs/BENCHMARKS-measured-economics.md replays "
             "with the worker's measured costs instead. Each figure is one run; "
             "whole-trace replays through `EmbeddingCache` (`eviction_bench --simulate`), not miniatures.\n")
    L.append("| target | goal | measured | result |\n|---|---|---|---|")
    for what, goal, value, met, margin in targets(d):
        L.append(f"| {what} | {goal} | {value} | {'met' if met else '**missed**'} ({margin}) |")
    if d.get("ops_note"):
        L.append(f"\n{d['ops_note']}")
    L.append("\nTraces:\n")
    for k, v in d["traces"].items():
        L.append(f"- `{k}`: {v}")
    L.append("\n### GDSF against LRU, one cache, the whole trace\n")
    L.append("`gdsf` is the kept rule (frequency from a history that outlives eviction, `GdsfFrequency::kHistory`); "
             "*resident* is Cherkasova's, whose count restarts at 1 when an entry re-enters (`kResident`). *Ceiling*: the "
             "most any policy could save, every request but a key's first a hit (the trace's `max_hit_ratio`), over LRU. "
             "*adaptive* takes, per eviction, the victim of LRU, GDSF or GDSF with probation, whichever of three online miniatures (one per policy, "
             "on a hash sample of keys) currently saves more encode seconds; its *LRU share* is the share of its evictions "
             "whose victim LRU chose. n/a: not in this run.\n")
    L.append("| trace | capacity | LRU seconds hit | GDSF seconds hit | adaptive seconds hit | GDSF / LRU seconds saved | "
             "adaptive / LRU seconds saved | adaptive LRU share | resident GDSF / LRU | ceiling / LRU | LRU object hit | "
             "GDSF object hit |")
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in ONE_CACHE:
        s = d["simulate"].get(name)
        if s is None:  # runs before the conversation trace
            continue
        for r in s["by_lru_hit"] + s["by_fraction"]:
            lru = r["lru_seconds_saved"]
            ratio = "n/a (both 0)" if lru == 0 else f"{r['gdsf_seconds_saved'] / lru:.3f}"
            adaptive = "n/a" if "adaptive_hit_ratio" not in r else f"{r['adaptive_hit_ratio']:.3f}"
            a_saved = r.get("adaptive_seconds_saved")
            a_ratio = "n/a" if a_saved is None else ("n/a (LRU 0)" if lru == 0 else f"{a_saved / lru:.3f}")
            share = "n/a" if r.get("adaptive_lru_share") is None else pct(r["adaptive_lru_share"])
            resident = "n/a" if lru == 0 or "gdsf_resident_seconds_saved" not in r else f"{r['gdsf_resident_seconds_saved'] / lru:.3f}"
            ceiling = "n/a" if r["lru_hit_ratio"] == 0 else f"{s['max_hit_ratio'] / r['lru_hit_ratio']:.3f}"
            L.append(f"| {name} | {r['capacity_bytes'] / 1e9:.1f} GB | {r['lru_hit_ratio']:.3f} | {r['gdsf_hit_ratio']:.3f} | {adaptive} | "
                     f"{ratio} | {a_ratio} | {share} | {resident} | {ceiling} | {r['lru_object_hit_ratio']:.3f} | "
                     f"{r['gdsf_object_hit_ratio']:.3f} |")
    o = d["simulate"]["one-hit-50"]
    L.append("\n### The doorkeeper, 50% one-hit wonders\n")
    L.append(f"TieredEmbeddingCache under GDSF, L1 2% and L2 20% of the working set ({o['working_set_bytes'] / 1e9:.0f} GB), window 65,536 requests:\n")
    L.append("| L1 admission | L1 write bytes | L1 seconds hit | L1+L2 seconds hit |\n|---|---|---|---|")
    for k, label in (("tiered_none", "none"), ("tiered_doorkeeper", "doorkeeper")):
        x = o[k]
        L.append(f"| {label} | {x['l1_write_bytes'] / 1e9:.1f} GB | {x['l1_seconds_hit_ratio']:.3f} | {x['seconds_hit_ratio']:.3f} |")
    p = d["plan"]
    s = p["sampled"]
    L.append("\n### `epd-encode plan` on 10^7 requests\n")
    if "date" in p:  # re-measured alone by bench/plan_bench.py
        L.append(f"Measured {p['date']} by `bench/plan_bench.py` (load average {' '.join(p['loadavg_before'])} before, "
                 f"{' '.join(p['loadavg_after'])} after). {p.get('note', '')}\n")
    elif d.get("plan_date"):
        L.append(f"From the run of {d['plan_date']} (`--skip-plan` kept it; this page's other figures are newer).\n")
    L.append(f"`production-10M`: {s['requests']:,} requests, {s['distinct_keys']:,} distinct keys, working set {s['working_set_bytes'] / 1e12:.2f} TB. "
             f"Sampled run (the default, no replay): {p['wall_s']:.1f} s wall, {p['cpu_s']:.1f} s CPU on {p['cores']} cores; "
             f"with `--replay on`: {p['checked_wall_s']:.1f} s wall, {p['checked_cpu_s']:.1f} s CPU; exact run (`--exact-max 20000000`): "
             f"{p['exact_wall_s']:.1f} s wall, {p['exact_cpu_s']:.1f} s CPU. MAE of the sampled LRU curve against the exact one, by encode "
             f"seconds, over its {len(s['curves'][0]['points'])} capacities: {p['mae_seconds']:.4f}.\n")
    L.append("Hit ratios by encode seconds, L1 / L1+L2 / all tiers. With the defaults (`--eviction gdsf`, L1 up to 16 GB, L2 up to "
             "256 GB) L1 and L2 are full in every row and the rest is L3: Redis, written through with every tower result and "
             "evicting by LRU, so it holds copies of what L1 and L2 hold and its column is the `maxmemory` it needs, in "
             "the bytes Redis charges for the values" + redis_charge(d["plan"]) + " (docs/PLAN.md, \"The tiers "
             "modelled\" and \"What Redis charges a value\"). The total is sized off the GDSF curve (*curve*: the "
             "curve there) and moved where a miniature of the tiers misses the target by over half a point (*miniatures*: "
             "how many the row ran; 1, not moved); all three predictions come from that miniature at the row's sizes "
             "(docs/PLAN.md, \"Per-tier predictions\"), since the tiered L1 ranks by promotion cost and keeps other entries "
             "than one GDSF cache on the curve would.\n")
    L.append("| encode seconds saved | total | L1 | L2 | L3 | predicted | replayed | curve | miniatures |\n"
             "|---|---|---|---|---|---|---|---|---|")
    for r in p["checked"]["sizing"]:
        if not r["reachable"]:
            L.append(f"| {100 * r['target']:.0f}% of max | unreachable | | | | | | | |")
            continue
        L.append(sizing_row(r))
    L.append("\n![miss ratio by encode seconds against capacity: LRU, GDSF, GDSF + doorkeeper, adaptive](img/plan_production.png)\n")
    return "\n".join(L) + "\n"


def load_or_measure(path: str, render_only: bool, measure_fn) -> dict:
    """The results at `path` (--render-only), or measure_fn()'s, written there first."""
    if render_only:
        with open(path) as f:
            return json.load(f)
    d = measure_fn()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(d, f, indent=1)
    return d


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--render-only", action="store_true")
    ap.add_argument("--skip-plan", action="store_true")
    args = ap.parse_args()
    path = os.path.join(args.build, "bench-results", "economics.json")
    d = load_or_measure(path, args.render_only, lambda: measure(args.build, args.skip_plan))
    # bench/plan_live_bench.py's last run, when there is one (scripts/bench.sh runs it first).
    live = os.path.join(args.build, "bench-results", "plan_live.json")
    if os.path.exists(live):
        with open(live) as f:
            d["plan_live"] = {k: v for k, v in json.load(f).items() if k in ("date", "params", "table", "plan")}
        with open(path, "w") as f:  # bench/report.py reads the targets from here
            json.dump(d, f, indent=1)
    with open(os.path.join(ROOT, "docs", "BENCHMARKS-economics.json"), "w") as f:
        json.dump({k: v for k, v in d.items() if k != "plan"} | {"plan": {k: v for k, v in d["plan"].items() if k != "exact"}}, f, indent=1)
    with open(os.path.join(ROOT, "docs", "BENCHMARKS-economics.md"), "w") as f:
        f.write("## Cache economics: GDSF, adaptive, the doorkeeper and plan\n\n" + render_body(d))
    for t in targets(d):
        print("target", "MET   " if t[3] else "MISSED", t[0], "|", t[2], "|", t[4])
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""`epd-encode plan` on the 10^7-request production trace alone: the "plan"
rows of bench/economics_bench.py (same trace, same runs, same targets),
without re-running its GDSF and doorkeeper measurements. The sampled run and
the exact run (for the MAE) run side by side; each one's CPU time is its own
(user + system, from wait4). Writes BUILD/bench-results/plan.json and prints
the target rows as Markdown.

Usage: plan_bench.py --build BUILD [--render-only]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import economics_bench as eb  # noqa: E402  (the trace, the MAE and the targets)


def start(cmd: list[str]) -> tuple[subprocess.Popen, float, str]:
    print("+", " ".join(cmd), file=sys.stderr)
    out = os.path.join("/tmp", f"plan-bench-{os.getpid()}-{len(cmd)}-{time.monotonic_ns()}.json")
    return subprocess.Popen(cmd, stdout=open(out, "w"), stderr=subprocess.DEVNULL), time.monotonic(), out


def finish(job: tuple[subprocess.Popen, float, str]) -> tuple[dict, float, float]:
    proc, t0, out = job
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"plan exited with {proc.returncode}")
    with open(out) as f:
        j = json.load(f)
    os.remove(out)
    return j, wall, ru.ru_utime + ru.ru_stime


def measure(build: str) -> dict:
    epd = os.path.join(build, "tools", "epd-encode")
    big = eb.trace(build, eb.BIG[1], eb.BIG[0])
    d = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
         "loadavg_before": open("/proc/loadavg").read().split()[:3]}
    png = os.path.join(eb.ROOT, "docs", "img", "plan_production.png")
    sampled_job = start([epd, "plan", "--trace", big, "--json", "--plot", png])
    exact_job = start([epd, "plan", "--trace", big, "--json", "--exact-max", "20000000"])
    sampled, wall, cpu = finish(sampled_job)
    exact, ewall, ecpu = finish(exact_job)
    d["plan"] = {"sampled": sampled, "wall_s": wall, "cpu_s": cpu, "exact_wall_s": ewall, "exact_cpu_s": ecpu,
                 "mae_seconds": eb.mae(sampled["curves"][0], exact["curves"][0])}
    d["loadavg_after"] = open("/proc/loadavg").read().split()[:3]
    return d


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(eb.ROOT, "build"))
    ap.add_argument("--render-only", action="store_true")
    args = ap.parse_args()
    path = os.path.join(args.build, "bench-results", "plan.json")
    d = eb.load_or_measure(path, args.render_only, lambda: measure(args.build))
    p = d["plan"]
    print(f"measured {d['date']}, load average {' '.join(d['loadavg_before'])} before, "
          f"{' '.join(d['loadavg_after'])} after; sampled {p['cpu_s']:.1f} s CPU ({p['wall_s']:.1f} s wall, "
          f"curves {p['sampled']['curves_s']:.1f} s, tiers and replays {p['sampled']['replay_s']:.1f} s wall); "
          f"exact {p['exact_cpu_s']:.1f} s CPU ({p['exact_wall_s']:.1f} s wall)")
    for what, goal, value, met, margin in eb.plan_targets(p):
        print(f"| {what} | {goal} | {value} | {'met' if met else '**missed**'} | {margin} |")
    for r in p["sampled"]["sizing"]:
        if r["reachable"]:
            b = r["bytes"]
            print(f"| {100 * r['target']:.0f}% of max ({r['hit_ratio']:.3f}) | {b['total'] / 1e9:.1f} GB | "
                  f"{b['l1'] / 1e9:.1f} GB | {b['l2'] / 1e9:.1f} GB | {b['l3'] / 1e9:.1f} GB | "
                  f"{eb.tiers(r['predicted_seconds_hit_ratio'])} | {eb.tiers(r['replayed_seconds_hit_ratio'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

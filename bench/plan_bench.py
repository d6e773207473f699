#!/usr/bin/env python3
"""`epd-encode plan` on the 10^7-request production trace alone: the "plan"
rows of bench/economics_bench.py (same trace, same runs, same targets),
without re-running its GDSF and doorkeeper measurements: the default run
(timed), the `--replay on` run (the check) and the exact run (the MAE), one
after another (economics_bench.measure_plan). Writes
BUILD/bench-results/plan.json and prints the target rows as Markdown.

Usage: plan_bench.py --build BUILD [--render-only]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import economics_bench as eb  # noqa: E402  (the trace, the MAE and the targets)


def measure(build: str) -> dict:
    epd = os.path.join(build, "tools", "epd-encode")
    big = eb.trace(build, eb.BIG[1], eb.BIG[0])
    d = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
         "loadavg_before": open("/proc/loadavg").read().split()[:3]}
    d["plan"] = eb.measure_plan(epd, big)
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
          f"{' '.join(d['loadavg_after'])} after; sampled {p['wall_s']:.1f} s wall ({p['cpu_s']:.1f} s CPU, "
          f"curves {p['sampled']['curves_s']:.1f} s, miniatures {p['sampled']['replay_s']:.1f} s wall); with --replay on "
          f"{p['checked_wall_s']:.1f} s wall ({p['checked_cpu_s']:.1f} s CPU, replays and miniatures "
          f"{p['checked']['replay_s']:.1f} s); exact {p['exact_wall_s']:.1f} s wall ({p['exact_cpu_s']:.1f} s CPU)")
    for what, goal, value, met, margin in eb.plan_targets(p):
        print(f"| {what} | {goal} | {value} | {'met' if met else '**missed**'} | {margin} |")
    for r in p["checked"]["sizing"]:
        if r["reachable"]:
            print(eb.sizing_row(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())

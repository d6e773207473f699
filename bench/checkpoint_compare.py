#!/usr/bin/env python3
"""Side-by-side table of the C++ checkpoint towers against the Python reference,
from the JSON files the two benchmarks write (docs/BENCHMARKS.md, "Checkpoint
towers: C++ against the Python reference").

Inputs: --cpp, one or more files of src/tower/checkpoint_tower_bench --json
(schema epd-bench-checkpoint-tower/1), and --python, one or more files of
bench/checkpoint_reference_bench.py --json (schema
epd-bench-checkpoint-reference/1). Rows are matched on (arch, threads) at batch
1, float32 on both sides; ratio = Python median / C++ median (above 1: C++ is
faster). When a side has several runs of one row (files given in order), every
run is shown, separated by " / ".

Usage:
  /usr/bin/python3 bench/checkpoint_compare.py --cpp A.json [B.json] --python P1.json [P2.json]
"""

import argparse
import json
import sys


def load(paths, schema):
    rows = {}
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        if doc.get("schema") != schema:
            raise SystemExit(f"checkpoint_compare: {path}: schema {doc.get('schema')!r}, expected {schema!r}")
        threads = doc.get("threads")
        for r in doc["rows"]:
            if r.get("dtype", "f32") != "f32" or r.get("batch", 1) != 1:
                continue
            key = (r["arch"], r.get("threads", threads))
            rows.setdefault(key, []).append(r)
    return rows


def runs(rs, field):
    return " / ".join(f"{r[field]:.1f}" for r in rs)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpp", nargs="+", required=True)
    ap.add_argument("--python", nargs="+", required=True)
    args = ap.parse_args(argv)
    cpp = load(args.cpp, "epd-bench-checkpoint-tower/1")
    py = load(args.python, "epd-bench-checkpoint-reference/1")
    print("| arch | threads | grid (t,h,w) / tokens | C++ median ms | C++ min ms | Python f32 median ms | "
          "Python f32 min ms | ratio (Python / C++ median) |")
    print("|---|---|---|---|---|---|---|---|")
    order = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
    for key in sorted(set(cpp) & set(py), key=lambda k: (k[1], order.index(k[0]) if k[0] in order else 99, k[0])):
        c, p = cpp[key], py[key]
        g = c[0]["grid_thw"]
        ratios = " / ".join(f"{pr['median_ms'] / cr['median_ms']:.1f}x" for cr in c for pr in p)
        print(f"| {key[0]} | {key[1]} | ({g[0]}, {g[1]}, {g[2]}) / {c[0]['tokens']} | {runs(c, 'median_ms')} | "
              f"{runs(c, 'min_ms')} | {runs(p, 'median_ms')} | {runs(p, 'min_ms')} | {ratios} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

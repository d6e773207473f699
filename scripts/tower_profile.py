#!/usr/bin/env python3
"""Reads a Kineto Chrome trace of checkpoint tower Encode calls and prints
what issue 24 asks to write down (docs/GPU.md "Tower restructure").

    tower_profile.py --trace TRACE.json [--top 15] [--json OUT.json] [--label TEXT]

The trace comes from src/tower/checkpoint_tower_profile (libtorch's Kineto
profiler, CPU and CUDA activities), where every Encode call is one
"epd::encode" user range and the tower marks "epd::tower_metadata",
"epd::tower_stage_pixels", "epd::tower_forward" (an eager forward),
"epd::tower_graph_replay" (a CUDA graph replay) and "epd::tower_output".
Device activity is tied to the call that launched it through the CUPTI
correlation id of its runtime or driver call (kernels of a replayed graph
carry the id of cudaGraphLaunch).

Per Encode call (mean over the calls in the trace):
  - kernels per forward: kernels launched inside the forward ranges;
  - GPU busy time against wall time: the union of the call's kernel, memcpy
    and memset intervals, against the call's range;
  - the CPU time of each tower range;
  - every device-to-host copy and every synchronising runtime call
    (cudaStreamSynchronize, cudaDeviceSynchronize, cudaEventSynchronize and
    the synchronous cudaMemcpy) inside the forward ranges, and the same for
    the rest of the call (the output copy is expected there);
  - the top kernels by device time, with names, calls and share.
Standard library only. Exit status 1 with a message on a trace without
"epd::encode" ranges.
"""
import argparse
import json
import re
import sys
from collections import defaultdict

KERNEL = {"kernel"}
RUNTIME = {"cuda_runtime", "runtime", "cuda_driver", "driver"}
MEMCPY = {"gpu_memcpy", "memcpy"}
MEMSET = {"gpu_memset", "memset"}
ANNOTATION = {"user_annotation"}
FORWARD_RANGES = ("epd::tower_forward", "epd::tower_graph_replay")
TOWER_RANGES = ("epd::tower_metadata", "epd::tower_stage_pixels", "epd::tower_forward", "epd::tower_graph_replay",
                "epd::tower_output")
SYNC = re.compile(r"(Synchronize|^cudaMemcpy$|^cudaMemcpy2D$|^cuMemcpyDtoH|^cuCtxSynchronize)")


def fail(message):
    print(f"tower_profile.py: {message}", file=sys.stderr)
    sys.exit(1)


def cat(e):
    return str(e.get("cat", "")).lower()


def correlation(e):
    args = e.get("args") or {}
    return args.get("correlation", args.get("correlation id"))


def inside(e, r):
    return r["ts"] <= e["ts"] <= r["ts"] + r.get("dur", 0)


def union_us(intervals):
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def analyse(events, top):
    ranges = [e for e in events if cat(e) in ANNOTATION and e.get("ph") == "X"]
    encodes = sorted((r for r in ranges if r["name"] == "epd::encode"), key=lambda r: r["ts"])
    if not encodes:
        fail("no epd::encode ranges in the trace (was it written by checkpoint_tower_profile?)")
    runtime = [e for e in events if cat(e) in RUNTIME and e.get("ph") == "X"]
    device = [e for e in events if cat(e) in KERNEL | MEMCPY | MEMSET and e.get("ph") == "X"]
    by_corr = defaultdict(list)
    for d in device:
        if correlation(d) is not None:
            by_corr[correlation(d)].append(d)

    calls = []
    kernel_time = defaultdict(float)
    kernel_calls = defaultdict(int)
    for enc in encodes:
        fwd = [r for r in ranges if r["name"] in FORWARD_RANGES and inside(r, enc)]
        tower = defaultdict(float)
        for r in ranges:
            if r["name"] in TOWER_RANGES and inside(r, enc):
                tower[r["name"]] += r.get("dur", 0)
        rt = [r for r in runtime if inside(r, enc)]
        in_fwd = [r for r in rt if any(inside(r, f) for f in fwd)]
        fwd_ids = {correlation(r) for r in in_fwd}
        work = [d for r in rt for d in by_corr.get(correlation(r), [])]
        fwd_kernels = [d for d in work if cat(d) in KERNEL and correlation(d) in fwd_ids]
        for d in work:
            if cat(d) in KERNEL:
                kernel_time[d["name"]] += d.get("dur", 0)
                kernel_calls[d["name"]] += 1

        def syncs_and_copies(runtime_events, ids):
            found = defaultdict(lambda: [0, 0.0])
            for r in runtime_events:
                if SYNC.search(r["name"]):
                    found[r["name"]][0] += 1
                    found[r["name"]][1] += r.get("dur", 0)
            for d in work:
                if cat(d) in MEMCPY and correlation(d) in ids and "dtoh" in d["name"].lower().replace(" ", ""):
                    found[d["name"]][0] += 1
                    found[d["name"]][1] += d.get("dur", 0)
            return dict(found)

        rest = [r for r in rt if correlation(r) not in fwd_ids]
        calls.append({
            "wall_us": enc.get("dur", 0),
            "busy_us": union_us([(d["ts"], d["ts"] + d.get("dur", 0)) for d in work]),
            "kernels_in_forward": len(fwd_kernels),
            "kernels_in_call": sum(1 for d in work if cat(d) in KERNEL),
            "forward_ranges": len(fwd),
            "tower_ranges_us": dict(tower),
            "forward_syncs_and_d2h": syncs_and_copies(in_fwd, fwd_ids),
            "other_syncs_and_d2h": syncs_and_copies(rest, {correlation(r) for r in rest}),
        })
    n = len(calls)
    device_total = sum(kernel_time.values())
    top_kernels = sorted(kernel_time, key=kernel_time.get, reverse=True)[:top]
    return {
        "calls": calls,
        "mean": {
            "wall_ms": sum(c["wall_us"] for c in calls) / n / 1e3,
            "busy_ms": sum(c["busy_us"] for c in calls) / n / 1e3,
            "kernels_per_forward": sum(c["kernels_in_forward"] for c in calls) / n,
            "kernels_per_call": sum(c["kernels_in_call"] for c in calls) / n,
        },
        "top_kernels": [{"name": k, "calls_per_encode": kernel_calls[k] / n, "ms_per_encode": kernel_time[k] / n / 1e3,
                         "share": kernel_time[k] / device_total if device_total else 0.0} for k in top_kernels],
    }


def render(result, label):
    m = result["mean"]
    out = []
    title = f" ({label})" if label else ""
    out.append(f"### Profile{title}: {len(result['calls'])} Encode calls")
    out.append("")
    busy_share = 100 * m["busy_ms"] / m["wall_ms"] if m["wall_ms"] else 0
    out.append(f"- kernels per forward: {m['kernels_per_forward']:.0f} (per Encode call, with staging and output: "
               f"{m['kernels_per_call']:.0f})")
    out.append(f"- GPU busy {m['busy_ms']:.2f} ms of {m['wall_ms']:.2f} ms wall per call ({busy_share:.0f} %)")
    ranges = defaultdict(float)
    for c in result["calls"]:
        for k, v in c["tower_ranges_us"].items():
            ranges[k] += v / len(result["calls"]) / 1e3
    if ranges:
        out.append("- CPU time per call: " + ", ".join(f"{k} {v:.2f} ms" for k, v in sorted(ranges.items())))
    for key, what in (("forward_syncs_and_d2h", "inside the forward"), ("other_syncs_and_d2h", "outside the forward")):
        merged = defaultdict(lambda: [0, 0.0])
        for c in result["calls"]:
            for name, (count, dur) in c[key].items():
                merged[name][0] += count
                merged[name][1] += dur
        if merged:
            listed = "; ".join(f"{name}: {count / len(result['calls']):g} per call, {dur / len(result['calls']) / 1e3:.3f} ms"
                               for name, (count, dur) in sorted(merged.items()))
            out.append(f"- device-to-host copies and synchronisations {what}: {listed}")
        else:
            out.append(f"- device-to-host copies and synchronisations {what}: none")
    out.append("")
    out.append("| # | kernel | calls per Encode | ms per Encode | share of kernel time |")
    out.append("|---|---|---|---|---|")
    for i, k in enumerate(result["top_kernels"], 1):
        name = k["name"] if len(k["name"]) <= 110 else k["name"][:107] + "..."
        name = name.replace("|", "\\|")
        out.append(f"| {i} | `{name}` | {k['calls_per_encode']:g} | {k['ms_per_encode']:.3f} | {100 * k['share']:.1f} % |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--json")
    ap.add_argument("--label", default="")
    args = ap.parse_args(argv)
    try:
        with open(args.trace) as fh:
            doc = json.load(fh)
    except (OSError, ValueError) as e:
        fail(str(e))
    events = doc.get("traceEvents", doc) if isinstance(doc, dict) else doc
    result = analyse(events, args.top)
    print(render(result, args.label))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

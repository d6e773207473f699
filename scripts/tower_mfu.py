#!/usr/bin/env python3
"""MFU of the checkpoint towers from checkpoint_tower_bench's JSON, and the
step-gain table of the tower restructure.

    tower_mfu.py --config DIR/config.json --bench BENCH.json [--peak-tflops T]
                 [--peak-name NAME] [--steps] [--hf HF.json] [--targets]

Reads the checkpoint's vision_config and each row of the benchmark's JSON
(schema epd-bench-checkpoint-tower/1: batch, median_ms per image, grid_thw
and, in newer files, grids: the (t, h, w) of every item of the timed call,
and config: the step configuration) of the checkpoint's architecture and
prints a Markdown table: FLOPs per
image (the mean over the call's items), images/s, achieved TFLOP/s and,
with --peak-tflops, MFU = achieved / peak. With --steps, also the step-gain
table: per batch (and the mixed-size batch), each configuration's ms/image
and its gain over the configuration before it and over the first one, in
the order of the file. With --targets, issue 24's targets against the last
configuration of the file (the finished tower) on 512x512 rows, grid
(1, 36, 36): >= 40 % MFU at batch 8, <= 8 ms per image at batch 1 and, with
--hf (scripts/hf_tower_bench.py --json), >= 3x transformers' tower at
batch 8 (batch 1 shown too); each met or missed, by how much. Standard
library only.

FLOPs (docs/GPU.md "Real-size checkpoint tower"): a multiply-add is 2 FLOPs;
the linear layers and the two attention matmuls (QK^T, PV) are counted;
norms, rotary, softmax, activations, biases and Qwen3-VL's position
interpolation are not. Per item, with N = t*h*w patches, T = N / m^2
post-merge tokens, D the block width, F the MLP width, P = in_chans *
temporal_patch_size * patch_size^2, O the output width, L = depth:
  patch embedding   2 N P D
  one block         Qwen2.5-VL (SwiGLU):       2 N (4 D^2 + 3 D F)
                    Qwen2-VL, Qwen3-VL (fc1/fc2): 2 N (4 D^2 + 2 D F)
                    (fused qkv 3 D^2 + proj D^2, then the MLP)
  patch merger      2 T (16 D^2 + 4 D O)  Linear(4D, 4D), Linear(4D, O);
                    Qwen3-VL adds one more per deepstack tap
  full attention    4 D t (h w)^2 per block (per frame: cu_seqlens)
  window attention  4 D * sum over windows of n_w^2 per windowed block
                    (Qwen2.5-VL's blocks outside fullatt_block_indexes)
Layer shapes from huggingface/transformers models/qwen2_vl, qwen2_5_vl and
qwen3_vl modeling files. The MLP width counted is the checkpoint's (3420
for Qwen2.5-VL-7B), not the padded one the tower runs: padding is not work.
Exit status 1 with a message on bad input.
"""
import argparse
import json
import sys


def fail(message):
    print(f"tower_mfu.py: {message}", file=sys.stderr)
    sys.exit(1)


def window_sides(merge_blocks, window_blocks, m):
    """Patch counts along one axis of each window: full windows, then the rest."""
    sides = []
    left = merge_blocks
    while left > 0:
        sides.append(min(window_blocks, left) * m)
        left -= window_blocks
    return sides


def arch_of(cfg, v):
    kind = v.get("model_type") or cfg.get("model_type", "")
    if kind in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"):
        return kind
    return "qwen2_5_vl" if "window_size" in v else "qwen2_vl"


def dims(arch, v):
    """(D, F, O) of the vision_config."""
    if arch == "qwen2_vl":
        d = v["embed_dim"]
        return d, int(d * v.get("mlp_ratio", 4)), v["hidden_size"]
    return v["hidden_size"], v["intermediate_size"], v["out_hidden_size"]


def flops_per_item(arch, v, grid):
    t, h, w = grid
    m = v["spatial_merge_size"]
    p = v["patch_size"]
    d, f, o = dims(arch, v)
    depth = v["depth"]
    patch_dim = v.get("in_chans", v.get("in_channels", 3)) * v["temporal_patch_size"] * p * p
    n = t * h * w
    tokens = n // (m * m)
    total = 2 * n * patch_dim * d
    mlp = 3 * d * f if arch == "qwen2_5_vl" else 2 * d * f
    total += depth * 2 * n * (4 * d * d + mlp)
    mergers = 1 + (len(v.get("deepstack_visual_indexes", [])) if arch == "qwen3_vl" else 0)
    total += mergers * 2 * tokens * (16 * d * d + 4 * d * o)
    full_sq = t * (h * w) ** 2
    if arch != "qwen2_5_vl":
        return total + depth * 4 * d * full_sq
    full = set(v.get("fullatt_block_indexes", []))
    window_blocks = v["window_size"] // p // m
    if window_blocks < 1:
        fail(f"window_size {v['window_size']} is under one merge block")
    rows = window_sides(h // m, window_blocks, m)
    cols = window_sides(w // m, window_blocks, m)
    # sum over windows of n_w^2 = (sum of row sides^2) * (sum of column sides^2), per frame.
    window_sq = t * sum(r * r for r in rows) * sum(c * c for c in cols)
    n_full = sum(1 for i in range(depth) if i in full)
    return total + n_full * 4 * d * full_sq + (depth - n_full) * 4 * d * window_sq


def row_grids(r):
    return r.get("grids") or [r["grid_thw"]] * r["batch"]


def is_mixed(r):
    g = row_grids(r)
    return any(x != g[0] for x in g)


def row_flops_per_image(arch, v, r):
    grids = row_grids(r)
    return sum(flops_per_item(arch, v, g) for g in grids) / len(grids)


def mfu_table(arch, v, rows, peak):
    lines = ["| config | batch | grid (t,h,w) | GFLOP/image | ms/image (median) | images/s | TFLOP/s | MFU |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        flops = row_flops_per_image(arch, v, r)
        per_s = 1e3 / r["median_ms"]
        achieved = per_s * flops / 1e12
        mfu = f"{100 * achieved / peak:.1f} %" if peak > 0 else "n/a"
        g = r["grid_thw"]
        grid = f"mixed: {len(row_grids(r))} sizes" if is_mixed(r) else f"({g[0]}, {g[1]}, {g[2]})"
        lines.append(f"| {r.get('config', 'default')} | {r['batch']} | {grid} | {flops / 1e9:.1f} | "
                     f"{r['median_ms']:.2f} | {per_s:.1f} | {achieved:.1f} | {mfu} |")
    return lines


def steps_table(rows):
    """Per workload (batch, or mixed), each config against the one before it."""
    lines = ["| workload | step | ms/image | images/s | gain over the previous step | gain over the first |",
             "|---|---|---|---|---|---|"]
    workloads = []
    for r in rows:
        key = ("mixed" if is_mixed(r) else "batch", r["batch"])
        if key not in workloads:
            workloads.append(key)
    for key in workloads:
        sel = [r for r in rows if ("mixed" if is_mixed(r) else "batch", r["batch"]) == key]
        first = prev = None
        for r in sel:
            ms = r["median_ms"]
            step_gain = f"{prev / ms:.2f}x" if prev else "-"
            total_gain = f"{first / ms:.2f}x" if first else "-"
            label = f"mixed, {key[1]} sizes" if key[0] == "mixed" else f"batch {key[1]}"
            lines.append(f"| {label} | {r.get('config', 'default')} | {ms:.2f} | {1e3 / ms:.1f} | {step_gain} | "
                         f"{total_gain} |")
            first = first or ms
            prev = ms
    return lines


def targets_table(arch, v, rows, peak, hf_rows):
    final = rows[-1].get("config", "default")
    sel = {r["batch"]: r for r in rows if r.get("config", "default") == final and not is_mixed(r)
           and list(r["grid_thw"]) == [1, 36, 36]}
    lines = [f"Targets (issue 24) for the configuration '{final}', 512x512 images, grid (1, 36, 36):", "",
             "| target | measured | verdict |", "|---|---|---|"]

    def verdict(ok, miss):
        return "met" if ok else f"missed by {miss}"

    if 8 in sel and peak > 0:
        mfu = 100 * (1e3 / sel[8]["median_ms"]) * row_flops_per_image(arch, v, sel[8]) / 1e12 / peak
        lines.append(f"| >= 40 % MFU at batch 8 | {mfu:.1f} % ({1e3 / sel[8]['median_ms']:.1f} images/s) | "
                     f"{verdict(mfu >= 40, f'{40 - mfu:.1f} points')} |")
    if 1 in sel:
        ms = sel[1]["median_ms"]
        lines.append(f"| <= 8 ms per image at batch 1 | {ms:.2f} ms | {verdict(ms <= 8, f'{ms - 8:.2f} ms')} |")
    hf = {r["batch"]: r["median_ms"] for r in hf_rows}
    for batch in (8, 1):
        if batch in sel and batch in hf:
            ratio = hf[batch] / sel[batch]["median_ms"]
            goal = ">= 3x transformers' tower at batch 8" if batch == 8 else "transformers' tower at batch 1 (shown)"
            lines.append(f"| {goal} | {ratio:.2f}x ({hf[batch]:.2f} ms against {sel[batch]['median_ms']:.2f} ms) | "
                         f"{verdict(ratio >= 3, f'{3 - ratio:.2f}x') if batch == 8 else '-'} |")
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="the checkpoint's config.json")
    ap.add_argument("--bench", required=True, help="checkpoint_tower_bench --json output")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="dense peak of the device, TFLOP/s")
    ap.add_argument("--peak-name", default="", help="what the peak is, printed with it")
    ap.add_argument("--steps", action="store_true", help="also print the step-gain table")
    ap.add_argument("--hf", help="scripts/hf_tower_bench.py --json output, for --targets")
    ap.add_argument("--targets", action="store_true", help="also print issue 24's targets")
    args = ap.parse_args()
    try:
        with open(args.config) as fh:
            cfg = json.load(fh)
        with open(args.bench) as fh:
            bench = json.load(fh)
    except (OSError, ValueError) as e:
        fail(str(e))
    v = cfg.get("vision_config", cfg)
    arch = arch_of(cfg, v)
    if arch == "qwen2_5_vl" and "window_size" not in v:
        fail(f"{args.config}: a qwen2_5_vl vision_config without window_size")
    try:
        # A bench over several checkpoints: the rows of this one's architecture.
        rows = [r for r in bench["rows"] if r.get("arch", arch) == arch]
        if not rows:
            fail(f"{args.bench}: no {arch} rows")
        lines = mfu_table(arch, v, rows, args.peak_tflops)
        if args.steps:
            lines += ["", *steps_table(rows)]
        if args.targets:
            hf_rows = []
            if args.hf:
                with open(args.hf) as fh:
                    hf_rows = json.load(fh)["rows"]
            lines += ["", *targets_table(arch, v, rows, args.peak_tflops, hf_rows)]
    except (KeyError, TypeError, ZeroDivisionError, OSError, ValueError) as e:
        fail(f"{args.bench}: not a checkpoint_tower_bench JSON, or a bad --hf file ({e!r})")
    print("\n".join(lines))
    if args.peak_tflops > 0:
        print(f"\nMFU against {args.peak_tflops:g} TFLOP/s dense bf16{' (' + args.peak_name + ')' if args.peak_name else ''}.")


if __name__ == "__main__":
    main()

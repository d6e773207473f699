#!/usr/bin/env python3
"""MFU of the Qwen2.5-VL checkpoint tower from checkpoint_tower_bench's JSON.

    tower_mfu.py --config DIR/config.json --bench BENCH.json [--peak-tflops T]

Reads the checkpoint's vision_config and each row of the benchmark's JSON
(schema epd-bench-checkpoint-tower/1: grid_thw, batch, median_ms per image)
and prints a Markdown table: FLOPs per image, images/s, achieved TFLOP/s and,
with --peak-tflops, MFU = achieved / peak. Standard library only.

FLOPs per image (docs/GPU.md "Real-size checkpoint tower"): a multiply-add is
2 FLOPs; the linear layers and the two attention matmuls (QK^T, PV) are
counted, norms, rotary, softmax, activations and biases are not. With
N = t*h*w patches, T = N / m^2 post-merge tokens, D = hidden_size,
F = intermediate_size, P = in_chans * temporal_patch_size * patch_size^2,
O = out_hidden_size, L = depth:
  patch embedding  2 N P D
  one block        2 N (4 D^2 + 3 D F)   fused qkv (3 D^2) + proj (D^2),
                                          SwiGLU gate/up/down (3 D F)
  patch merger     2 T (16 D^2 + 4 D O)  Linear(4D, 4D), Linear(4D, O)
  full attention   4 D N^2 per block in fullatt_block_indexes
  window attention 4 D * sum over windows of n_w^2 per other block
Layer shapes from huggingface/transformers
models/qwen2_5_vl/modeling_qwen2_5_vl.py. Windows are window_size /
patch_size / m merge blocks a side, cut from the top-left of each frame's
(h/m, w/m) merge-block grid, the last row/column of windows smaller.
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


def flops_per_image(v, grid):
    t, h, w = grid
    m = v["spatial_merge_size"]
    p = v["patch_size"]
    d, f, o, depth = v["hidden_size"], v["intermediate_size"], v["out_hidden_size"], v["depth"]
    patch_dim = v.get("in_chans", 3) * v["temporal_patch_size"] * p * p
    n = t * h * w
    tokens = n // (m * m)
    full = set(v.get("fullatt_block_indexes", []))
    window_blocks = v["window_size"] // p // m
    if window_blocks < 1:
        fail(f"window_size {v['window_size']} is under one merge block")
    rows = window_sides(h // m, window_blocks, m)
    cols = window_sides(w // m, window_blocks, m)
    # sum over windows of n_w^2 = (sum of row sides^2) * (sum of column sides^2), per frame.
    window_sq = t * sum(r * r for r in rows) * sum(c * c for c in cols)
    total = 2 * n * patch_dim * d
    total += depth * 2 * n * (4 * d * d + 3 * d * f)
    total += 2 * tokens * (16 * d * d + 4 * d * o)
    n_full = sum(1 for i in range(depth) if i in full)
    total += n_full * 4 * d * n * n + (depth - n_full) * 4 * d * window_sq
    return total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="the checkpoint's config.json")
    ap.add_argument("--bench", required=True, help="checkpoint_tower_bench --json output")
    ap.add_argument("--peak-tflops", type=float, default=0.0, help="dense peak of the device, TFLOP/s")
    ap.add_argument("--peak-name", default="", help="what the peak is, printed with it")
    args = ap.parse_args()
    try:
        with open(args.config) as fh:
            cfg = json.load(fh)
        with open(args.bench) as fh:
            bench = json.load(fh)
    except (OSError, ValueError) as e:
        fail(str(e))
    v = cfg.get("vision_config", cfg)
    if "window_size" not in v:
        fail(f"{args.config}: the FLOP formula here is Qwen2.5-VL's (window attention); "
             f"this vision_config has no window_size")
    try:
        rows = bench["rows"]
        lines = []
        lines.append("| batch | grid (t,h,w) | GFLOP/image | ms/image (median) | images/s | TFLOP/s | MFU |")
        lines.append("|---|---|---|---|---|---|---|")
        for r in rows:
            flops = flops_per_image(v, r["grid_thw"])
            per_s = 1e3 / r["median_ms"]
            achieved = per_s * flops / 1e12
            mfu = f"{100 * achieved / args.peak_tflops:.1f} %" if args.peak_tflops > 0 else "n/a"
            g = r["grid_thw"]
            lines.append(f"| {r['batch']} | ({g[0]}, {g[1]}, {g[2]}) | {flops / 1e9:.1f} | {r['median_ms']:.2f} | "
                  f"{per_s:.1f} | {achieved:.1f} | {mfu} |")
    except (KeyError, TypeError, ZeroDivisionError) as e:
        fail(f"{args.bench}: not a checkpoint_tower_bench JSON ({e!r})")
    print("\n".join(lines))
    if args.peak_tflops > 0:
        print(f"\nMFU against {args.peak_tflops:g} TFLOP/s dense bf16{' (' + args.peak_name + ')' if args.peak_name else ''}.")


if __name__ == "__main__":
    main()

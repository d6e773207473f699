#!/usr/bin/env python3
"""GEMM microbenchmark of a Qwen2.5-VL vision block's four shapes (issue 24,
"Measure first"; docs/GPU.md "Tower restructure").

    tower_gemm_bench.py [--device cuda] [--dtype bf16] [--m 10368,1296]
                        [--widths 3420,3456] [--width 1280] [--repeats 50]
                        [--json OUT.json]

Each GEMM runs as the tower runs it: torch.addmm(bias, x, w.t()) with the
weight stored [out, in] (a bias inside the GEMM). Shapes, with D the block
width (--width, 1280 for Qwen2.5-VL-7B) and F each MLP width of --widths
(3420 is the checkpoint's, 3456 = 3420 padded to a multiple of 64):
  qkv        [M, D] x [D, 3D]
  proj       [M, D] x [D, D]
  gate-up    [M, D] x [D, 2F]   (one fused GEMM)
  down       [M, F] x [F, D]
  gate / up  [M, D] x [D, F]    (the unfused layout, once per F)
M = 10368 is a batch of 8 images of 512x512 (8 x 1296 patches), M = 1296
one. Times: CUDA events around each call (wall clock on the CPU), median
of --repeats after 5 warm-up calls; TFLOP/s = 2 M K N / time. On CUDA, the
kernel each shape ran (torch.profiler, one call) is printed beside it, so
Ampere-generation (sm80) against Hopper (sm90) kernels and the alignment
suffixes (align1, align2, align8) show. Markdown table on stdout.
"""
import argparse
import json
import statistics
import sys
import time


def shapes(d, widths):
    rows = [("qkv", d, 3 * d), ("proj", d, d)]
    for f in widths:
        rows += [(f"gate-up (F={f})", d, 2 * f), (f"down (F={f})", f, d), (f"gate / up (F={f}, unfused)", d, f)]
    return rows


def time_call(torch, fn, device, repeats):
    for _ in range(5):
        fn()
    times = []
    if device.startswith("cuda"):
        for _ in range(repeats):
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def kernel_name(torch, fn):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.key for e in prof.key_averages() if getattr(e, "device_type", None) is not None
             and "cuda" in str(e.device_type).lower() and not e.key.startswith("Memcpy")]
    return ", ".join(names) if names else "?"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    ap.add_argument("--m", default="10368,1296")
    ap.add_argument("--widths", default="3420,3456")
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    import torch

    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[args.dtype]
    ms = [int(x) for x in args.m.split(",")]
    widths = [int(x) for x in args.widths.split(",")]
    cuda = args.device.startswith("cuda")
    name = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"torch {torch.__version__}, {name}, {args.dtype}, addmm(bias, x, w.t()), median of {args.repeats}\n")
    print("| shape | M | K | N | ms | TFLOP/s | kernel |")
    print("|---|---|---|---|---|---|---|")
    rows = []
    torch.manual_seed(0)
    for m in ms:
        for label, k, n in shapes(args.width, widths):
            x = torch.randn(m, k, device=args.device, dtype=dtype)
            w = torch.randn(n, k, device=args.device, dtype=dtype) * k ** -0.5
            b = torch.randn(n, device=args.device, dtype=dtype)
            def call():
                return torch.addmm(b, x, w.t())
            t = time_call(torch, call, args.device, args.repeats)
            tflops = 2 * m * k * n / (t * 1e-3) / 1e12
            kern = kernel_name(torch, call) if cuda else "(cpu)"
            print(f"| {label} | {m} | {k} | {n} | {t:.3f} | {tflops:.1f} | `{kern}` |")
            rows.append({"shape": label, "m": m, "k": k, "n": n, "ms": t, "tflops": tflops, "kernel": kern})
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"schema": "epd-tower-gemm/1", "device": name, "dtype": args.dtype, "rows": rows}, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Per-image time of the eager Python reference (tests/python/qwen_vl_reference.py)
on the tiny Qwen-VL checkpoints, for comparison with the C++ checkpoint towers
in docs/BENCHMARKS.md.

Workload: scikit-image's astronaut.png (512x512 RGB photo), preprocessed once
per architecture as its processor does (Qwen2 family: 504x504, grid 1x36x36,
324 tokens; Qwen3-VL: 512x512, grid 1x32x32, 256 tokens). Preprocessing is
timed separately and is not part of the forward time. Each configuration runs
one warm-up forward, then --repeats forwards; the table gives the median and
the minimum wall time per image (time.perf_counter) and the median process
CPU time (time.process_time), with torch.set_num_threads(--threads).

The reference is written for clarity (explicit per-segment attention loops, a
real Conv3d, float64 by default in the tests), so these figures are a floor
for "obvious PyTorch", not a tuned baseline. Both float32 and float64 are
measured; the tests compare against float64.

Checkpoints: --models DIR holding tiny-<arch>/ (default build/models, written
by the build's tiny_checkpoints target); an absent one is generated into a
temporary directory with scripts/make_tiny_checkpoint.py.

Usage:
  /usr/bin/python3 bench/checkpoint_reference_bench.py [--models build/models]
      [--repeats 5] [--threads 1] [--dtypes f32,f64] [--json OUT.json]
"""

import argparse
import importlib.util
import json
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time

import torch
from PIL import Image

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "python"))
import qwen_vl_reference as ref  # noqa: E402

PHOTO = "/usr/lib/python3/dist-packages/skimage/data/astronaut.png"
DTYPES = {"f32": torch.float32, "f64": torch.float64}


def checkpoint_dir(models, arch, scratch):
    path = pathlib.Path(models) / f"tiny-{arch}"
    if (path / "config.json").is_file():
        return path
    spec = importlib.util.spec_from_file_location("make_tiny_checkpoint", REPO / "scripts" / "make_tiny_checkpoint.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    path = pathlib.Path(scratch) / f"tiny-{arch}"
    script.build(arch, str(path))
    return path


def measure(arch, model_dir, dtype_name, repeats, image):
    tower, _, config, pre = ref.load_tower(model_dir, dtype=DTYPES[dtype_name])
    t0 = time.perf_counter()
    pixel_values, grid = pre.image(image)
    preprocess_ms = (time.perf_counter() - t0) * 1e3
    pv = torch.from_numpy(pixel_values)
    ref.run(tower, pv, [grid])  # warm-up
    walls, cpus = [], []
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        main, _ = ref.run(tower, pv, [grid])
        walls.append((time.perf_counter() - w0) * 1e3)
        cpus.append((time.process_time() - c0) * 1e3)
    v = config["vision_config"]
    return {
        "arch": arch, "dtype": dtype_name, "grid_thw": list(grid), "patches": int(pv.shape[0]),
        "tokens": int(main.shape[0]), "depth": v["depth"],
        "width": v["embed_dim"] if arch == "qwen2_vl" else v["hidden_size"],
        "preprocess_ms": preprocess_ms, "median_ms": statistics.median(walls), "min_ms": min(walls),
        "median_cpu_ms": statistics.median(cpus), "repeats": repeats,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=str(REPO / "build" / "models"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtypes", default="f32,f64")
    ap.add_argument("--photo", default=PHOTO)
    ap.add_argument("--json", help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    image = Image.open(args.photo).convert("RGB")
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for arch in ref.ARCHS:
            model_dir = checkpoint_dir(args.models, arch, scratch)
            for dtype_name in args.dtypes.split(","):
                rows.append(measure(arch, model_dir, dtype_name, args.repeats, image))
    print(f"Python reference (tests/python/qwen_vl_reference.py), {os.path.basename(args.photo)} "
          f"{image.width}x{image.height}, torch {torch.__version__}, {args.threads} thread(s), "
          f"{platform.processor() or platform.machine()}, load average {os.getloadavg()[0]:.2f}")
    print()
    print("| arch | dtype | depth x width | grid (t,h,w) | tokens | preprocess ms | forward ms/image (median) | min | CPU ms (median) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['arch']} | {r['dtype']} | {r['depth']} x {r['width']} | {tuple(r['grid_thw'])} | {r['tokens']} | "
              f"{r['preprocess_ms']:.1f} | {r['median_ms']:.1f} | {r['min_ms']:.1f} | {r['median_cpu_ms']:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"schema": "epd-bench-checkpoint-reference/1", "threads": args.threads,
                       "torch": torch.__version__, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

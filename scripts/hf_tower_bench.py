#!/usr/bin/env python3
"""Times Hugging Face transformers' own Qwen2.5-VL vision tower on a checkpoint
directory, as the peer figure beside checkpoint_tower_bench (docs/GPU.md).

For the GPU device machine, which has transformers and a CUDA torch; nothing
in the build or the tests uses it. The tower is transformers'
Qwen2_5_VisionTransformerPretrainedModel built from the checkpoint's
vision_config, with the checkpoint's `visual.*` (or `model.visual.*`) tensors
loaded, in bf16 on cuda, attention through SDPA. Each timed call encodes B
images of grid (1, 36, 36) (a 512x512 photo after smart_resize: 504x504) from
random patch rows; the weights are the checkpoint's, so the arithmetic is the
same as for the C++ tower. Prints a markdown table (median ms per image,
images/s, TFLOP/s from --gflop-per-image) and, for the middle batch size, the
ten CUDA kernels with the most device time and the share of wall time the
GPU was busy, from torch.profiler.

Usage: hf_tower_bench.py --model DIR [--batches 1,8,32] [--repeats 10]
                         [--gflop-per-image 1710.7] [--json OUT.json]
--json writes {"schema": "epd-hf-tower-bench/1", "transformers": version,
"rows": [{"batch", "median_ms" (per image)}]} for scripts/tower_mfu.py --hf.
"""
import argparse
import json
import pathlib
import statistics
import sys
import time


def load_vision_state(model_dir: pathlib.Path):
    from safetensors.torch import load_file

    state = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        for name, tensor in load_file(str(shard)).items():
            for prefix in ("model.visual.", "visual."):
                if name.startswith(prefix):
                    state[name[len(prefix):]] = tensor
                    break
    return state


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, type=pathlib.Path)
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--gflop-per-image", type=float, default=1710.7)
    ap.add_argument("--json", type=pathlib.Path)
    args = ap.parse_args()

    import torch
    import transformers
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as mq
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig

    vision = json.loads((args.model / "config.json").read_text())["vision_config"]
    config = Qwen2_5_VLVisionConfig(**vision)
    config._attn_implementation = "sdpa"
    tower = mq.Qwen2_5_VisionTransformerPretrainedModel(config)
    missing, unexpected = tower.load_state_dict(load_vision_state(args.model), strict=False)
    if missing:
        print(f"hf_tower_bench: tensors missing from the checkpoint: {missing[:5]}", file=sys.stderr)
        return 1
    tower = tower.to("cuda", torch.bfloat16).eval()
    patch_dim = 3 * config.temporal_patch_size * config.patch_size ** 2

    def encode(batch: int):
        grid = torch.tensor([[1, 36, 36]] * batch, device="cuda")
        rows = torch.randn(batch * 36 * 36, patch_dim, device="cuda", dtype=torch.bfloat16)
        out = tower(rows, grid_thw=grid)
        if not torch.is_tensor(out):
            out = out.pooler_output if getattr(out, "pooler_output", None) is not None else out.last_hidden_state
        return out

    print(f"transformers {transformers.__version__}, torch {torch.__version__}, {torch.cuda.get_device_name()}, "
          f"Qwen2_5_VisionTransformerPretrainedModel (sdpa, bf16), grid (1, 36, 36)\n")
    print("| batch | ms/image (median) | images/s | TFLOP/s | output rows |")
    print("|---|---|---|---|---|")
    batches = [int(b) for b in args.batches.split(",")]
    results = []
    with torch.inference_mode():
        for batch in batches:
            out = encode(batch)
            torch.cuda.synchronize()
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                out = encode(batch)
                torch.cuda.synchronize()
                times.append((time.perf_counter() - t0) / batch)
            ms = statistics.median(times) * 1e3
            print(f"| {batch} | {ms:.2f} | {1e3 / ms:.1f} | {args.gflop_per_image / ms:.1f} | {out.shape[0]} |")
            results.append({"batch": batch, "median_ms": ms})
        if args.json:
            args.json.write_text(json.dumps({"schema": "epd-hf-tower-bench/1", "transformers": transformers.__version__,
                                             "torch": torch.__version__, "rows": results}, indent=2) + "\n")

        batch = batches[len(batches) // 2]
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            encode(batch)
            torch.cuda.synchronize()
            wall_us = (time.perf_counter() - t0) * 1e6
        averages = prof.key_averages()
        kernel_us = sum(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) for e in averages)
        print(f"\nbatch {batch} under torch.profiler: wall {wall_us / 1e3:.1f} ms, device time {kernel_us / 1e3:.1f} ms "
              f"({100 * kernel_us / wall_us:.0f} % of wall)\n")
        for key in ("self_device_time_total", "self_cuda_time_total"):
            try:
                print(averages.table(sort_by=key, row_limit=10, max_name_column_width=60))
                break
            except (AttributeError, KeyError, ValueError):
                continue
    return 0


if __name__ == "__main__":
    sys.exit(main())

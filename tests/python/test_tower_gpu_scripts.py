"""The Python halves of the tower's device check (scripts/gpu-check-tower.sh),
on inputs whose answers are worked out here: a synthetic Kineto trace for
scripts/tower_profile.py, the published FLOP counts and hand-made benchmark
JSON for scripts/tower_mfu.py, and a CPU run of scripts/tower_gemm_bench.py.
They run on the GPU machine's outputs; here they must already be right.
CTest runs this file as tower_gpu_scripts_tests (src/tower/CMakeLists.txt).
"""

import json
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
sys.path.insert(0, str(SCRIPTS))
import tower_mfu  # noqa: E402
import tower_profile  # noqa: E402

# Qwen2.5-VL-7B's vision_config (the fields the FLOP count reads).
Q25 = {"model_type": "qwen2_5_vl", "spatial_merge_size": 2, "patch_size": 14, "hidden_size": 1280,
       "intermediate_size": 3420, "out_hidden_size": 3584, "depth": 32, "in_chans": 3, "temporal_patch_size": 2,
       "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31]}


def x(cat, name, ts, dur, corr=None):
    e = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}
    if corr is not None:
        e["args"] = {"correlation": corr}
    return e


# Two Encode calls of 100 us. Call 1: a forward range [10, 60] launching
# kernels A (correlation 1), B (2), A (3) and a cudaStreamSynchronize; an
# output range with a DtoH copy (4). On the device: A [15, 25], B [22, 32]
# (overlapping A by 3), A [35, 40], the copy [80, 84]. Call 2 (at 1000): a
# graph replay whose one cudaGraphLaunch (5) ran A and B; an aten op there is
# CPU work. Columns: category|name|ts|dur|correlation.
TRACE = """
user_annotation|epd::encode|0|100|
user_annotation|epd::tower_forward|10|50|
cuda_runtime|cudaLaunchKernel|12|2|1
cuda_runtime|cudaLaunchKernel|20|2|2
cuda_runtime|cudaLaunchKernel|30|2|3
cuda_runtime|cudaStreamSynchronize|40|15|
user_annotation|epd::tower_output|70|20|
cuda_runtime|cudaMemcpyAsync|72|3|4
kernel|kernel_A|15|10|1
kernel|kernel_B|22|10|2
kernel|kernel_A|35|5|3
gpu_memcpy|Memcpy DtoH (Device -> Pageable)|80|4|4
user_annotation|epd::encode|1000|100|
user_annotation|epd::tower_graph_replay|1010|30|
cuda_runtime|cudaGraphLaunch|1012|4|5
kernel|kernel_A|1020|10|5
kernel|kernel_B|1030|20|5
cpu_op|aten::addmm|1013|1|
"""


def synthetic_trace():
    events = []
    for line in TRACE.strip().splitlines():
        cat, name, ts, dur, corr = line.split("|")
        events.append(x(cat, name, float(ts), float(dur), int(corr) if corr else None))
    return {"traceEvents": events}


def test_profile_counts_kernels_busy_time_syncs_and_top_kernels(tmp_path):
    result = tower_profile.analyse(synthetic_trace()["traceEvents"], top=15)
    c1, c2 = result["calls"]
    assert c1["kernels_in_forward"] == 3 and c2["kernels_in_forward"] == 2
    # Union of [15, 25], [22, 32], [35, 40], [80, 84] = 17 + 5 + 4.
    assert c1["busy_us"] == pytest.approx(26)
    assert c2["busy_us"] == pytest.approx(30)
    assert result["mean"]["kernels_per_forward"] == pytest.approx(2.5)
    assert result["mean"]["wall_ms"] == pytest.approx(0.1)
    assert c1["forward_syncs_and_d2h"] == {"cudaStreamSynchronize": [1, 15]}
    assert c1["other_syncs_and_d2h"] == {"Memcpy DtoH (Device -> Pageable)": [1, 4]}
    assert c2["forward_syncs_and_d2h"] == {}
    top = result["top_kernels"]
    # kernel_B: 10 + 20 = 30 us; kernel_A: 10 + 5 + 10 = 25 us; of 55.
    assert [k["name"] for k in top] == ["kernel_B", "kernel_A"]
    assert top[0]["share"] == pytest.approx(30 / 55)
    assert top[1]["calls_per_encode"] == pytest.approx(1.5)
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps(synthetic_trace()))
    out = subprocess.run([sys.executable, str(SCRIPTS / "tower_profile.py"), "--trace", str(trace)],
                         capture_output=True, text=True, check=True).stdout
    assert "kernels per forward: 2" in out  # 2.5 rounds to 2 (banker's rounding of :.0f)
    assert "cudaStreamSynchronize: 0.5 per call" in out


def test_profile_refuses_a_trace_without_encode_ranges(tmp_path):
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": [x("kernel", "k", 0, 1, 1)]}))
    proc = subprocess.run([sys.executable, str(SCRIPTS / "tower_profile.py"), "--trace", str(trace)],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "epd::encode" in proc.stderr


def test_flops_of_the_three_towers_at_512x512():
    # docs/GPU.md's count for Qwen2.5-VL-7B at grid (1, 36, 36): 1710.7 GFLOP.
    assert tower_mfu.flops_per_item("qwen2_5_vl", Q25, [1, 36, 36]) / 1e9 == pytest.approx(1710.65, abs=0.01)
    # Qwen2-VL-7B, every term written out: N = 1296, T = 324, D = 1280,
    # F = 4 D = 5120, O = 3584, P = 1176, 32 blocks of full attention.
    n, t, d, f, o, p = 1296, 324, 1280, 5120, 3584, 1176
    want = 2 * n * p * d + 32 * (2 * n * 4 * d * d + 2 * n * 2 * d * f) + 2 * t * (16 * d * d + 4 * d * o) \
        + 32 * 4 * d * n * n
    q2 = {"model_type": "qwen2_vl", "spatial_merge_size": 2, "patch_size": 14, "embed_dim": 1280, "mlp_ratio": 4,
          "hidden_size": 3584, "depth": 32, "in_chans": 3, "temporal_patch_size": 2}
    assert tower_mfu.flops_per_item("qwen2_vl", q2, [1, 36, 36]) == want
    # Qwen3-VL: two deepstack mergers on top of the main one; patch 16.
    q3 = {"model_type": "qwen3_vl", "spatial_merge_size": 2, "patch_size": 16, "hidden_size": 1152,
          "intermediate_size": 4304, "out_hidden_size": 4096, "depth": 27, "in_channels": 3,
          "temporal_patch_size": 2, "deepstack_visual_indexes": [8, 16]}
    n, t, d, f, o, p = 1024, 256, 1152, 4304, 4096, 1536
    want = 2 * n * p * d + 27 * (2 * n * 4 * d * d + 2 * n * 2 * d * f) + 3 * 2 * t * (16 * d * d + 4 * d * o) \
        + 27 * 4 * d * n * n
    assert tower_mfu.flops_per_item("qwen3_vl", q3, [1, 32, 32]) == want
    # A video of two frames attends per frame: twice one frame's work.
    assert tower_mfu.flops_per_item("qwen3_vl", q3, [2, 32, 32]) == 2 * want


def bench_rows():
    grid = [1, 36, 36]
    mixed = [[1, 16, 16], [1, 74, 74]]
    rows = []
    for config, ms8, ms1 in (("baseline", 20.0, 21.0), ("fusions", 5.0, 9.0), ("graphs", 4.0, 7.5)):
        rows.append({"arch": "qwen2_5_vl", "config": config, "batch": 1, "grid_thw": grid, "grids": [grid],
                     "median_ms": ms1})
        rows.append({"arch": "qwen2_5_vl", "config": config, "batch": 8, "grid_thw": grid, "grids": [grid] * 8,
                     "median_ms": ms8})
        rows.append({"arch": "qwen2_5_vl", "config": config, "batch": 2, "grid_thw": mixed[0], "grids": mixed,
                     "median_ms": 2 * ms8})
    rows.append({"arch": "qwen3_vl", "config": "graphs", "batch": 1, "grid_thw": grid, "median_ms": 1.0})
    return {"schema": "epd-bench-checkpoint-tower/1", "rows": rows}


def run_mfu(tmp_path, *extra):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "qwen2_5_vl", "vision_config": Q25}))
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps(bench_rows()))
    return subprocess.run([sys.executable, str(SCRIPTS / "tower_mfu.py"), "--config", str(cfg), "--bench", str(bench),
                           *extra], capture_output=True, text=True, check=True).stdout


def test_mfu_steps_and_targets(tmp_path):
    hf = tmp_path / "hf.json"
    hf.write_text(json.dumps({"rows": [{"batch": 1, "median_ms": 54.0}, {"batch": 8, "median_ms": 10.0}]}))
    out = run_mfu(tmp_path, "--peak-tflops", "989.4", "--steps", "--targets", "--hf", str(hf))
    lines = out.splitlines()
    # The qwen3_vl row is another architecture's: left out.
    assert not any("qwen3" in l for l in lines)
    # graphs at batch 8: 250 images/s * 1710.65 GFLOP = 427.66 TFLOP/s = 43.2 % of 989.4.
    assert "| graphs | 8 | (1, 36, 36) | 1710.7 | 4.00 | 250.0 | 427.7 | 43.2 % |" in lines
    # The mixed row averages its two grids' FLOPs.
    per_image = (tower_mfu.flops_per_item("qwen2_5_vl", Q25, [1, 16, 16]) +
                 tower_mfu.flops_per_item("qwen2_5_vl", Q25, [1, 74, 74])) / 2
    assert f"| baseline | 2 | mixed: 2 sizes | {per_image / 1e9:.1f} |" in out
    # Steps: 20 -> 5 -> 4 ms at batch 8.
    assert "| batch 8 | fusions | 5.00 | 200.0 | 4.00x | 4.00x |" in lines
    assert "| batch 8 | graphs | 4.00 | 250.0 | 1.25x | 5.00x |" in lines
    assert "| mixed, 2 sizes | graphs | 8.00 | 125.0 | 1.25x | 5.00x |" in lines
    # Targets on the last configuration (graphs): MFU met, batch 1 7.5 <= 8
    # met, 10 / 4 = 2.5x transformers missed by 0.5x.
    assert any(l.startswith("| >= 40 % MFU at batch 8 | 43.2 %") and l.endswith("| met |") for l in lines)
    assert "| <= 8 ms per image at batch 1 | 7.50 ms | met |" in lines
    assert any("2.50x (10.00 ms against 4.00 ms) | missed by 0.50x |" in l for l in lines)


def test_gemm_bench_runs_the_blocks_shapes_on_cpu(tmp_path):
    out = tmp_path / "gemm.json"
    subprocess.run([sys.executable, str(SCRIPTS / "tower_gemm_bench.py"), "--device", "cpu", "--dtype", "f32",
                    "--m", "16", "--widths", "24,32", "--width", "8", "--repeats", "2", "--json", str(out)],
                   capture_output=True, text=True, check=True)
    rows = json.loads(out.read_text())["rows"]
    got = [(r["shape"], r["m"], r["k"], r["n"]) for r in rows]
    assert got == [("qkv", 16, 8, 24), ("proj", 16, 8, 8),
                   ("gate-up (F=24)", 16, 8, 48), ("down (F=24)", 16, 24, 8), ("gate / up (F=24, unfused)", 16, 8, 24),
                   ("gate-up (F=32)", 16, 8, 64), ("down (F=32)", 16, 32, 8), ("gate / up (F=32, unfused)", 16, 8, 32)]
    assert all(r["ms"] > 0 and r["tflops"] > 0 for r in rows)

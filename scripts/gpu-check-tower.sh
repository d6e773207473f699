#!/usr/bin/env bash
# The vision tower's device measurements (issue 24; docs/GPU.md "Tower
# restructure"), in one prepared run. scripts/gpu-check.sh runs it as its
# step "tower" after its build; it also runs on its own against any build
# directory that has the tower tools, e.g. a CPU dry run here:
#   scripts/gpu-check-tower.sh --build build --out /tmp/tower --device cpu --model tiny
#
# Usage: scripts/gpu-check-tower.sh --build DIR --out DIR [--device cuda]
#          [--model 7b|tiny] [--budget-s 420] [--images DIR] [--python P]
#          [--repeats 10] [--batches 1,4,8] [--mixed 1]
#   --build   where the tools are: checkpoint_tower_bench, _profile, _parity,
#             checkpoint_tower_gpu_test (under DIR, DIR/bench-gpu or
#             DIR/src/tower); models are written to DIR/models
#   --device  cuda (the H200) or cpu (a dry run: the GPU test is skipped,
#             float32, small GEMMs)
#   --model   7b: the real-size checkpoints (random weights, bf16, written
#             here by scripts/make_tiny_checkpoint.py --size 7b, ~1.6 GB each,
#             in the background while the GPU test runs); tiny: the tiny ones
#   --budget-s  seconds this script may take; each step is capped and skipped
#             (saying so) when the budget left is below its cap
#   --images  photos (build-gpucarry/images from gpu-check.sh --stage; else
#             scikit-image's data directory)
#   --repeats, --batches, --mixed  of the step benchmark (smaller for a dry
#             run on a slow CPU)
# Everything measured goes under --out: tower-gpu.md (the summary docs/GPU.md
# is updated from), the tables and logs of each step, JSON next to them.
# Exit status: 0 when every step that ran passed, 1 otherwise (a missed
# performance target is reported, not a failure; parity outside its bounds
# and a failing or skipping GPU test are failures).
set -uo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="" out="" device=cuda model=7b budget=420 images="" python_bin="${PYTHON:-$(command -v python3 || true)}"
repeats=10 batches=1,4,8 mixed=1
while (($#)); do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --device) device="$2"; shift 2 ;;
    --model) model="$2"; shift 2 ;;
    --budget-s) budget="$2"; shift 2 ;;
    --images) images="$2"; shift 2 ;;
    --python) python_bin="$2"; shift 2 ;;
    --repeats) repeats="$2"; shift 2 ;;
    --batches) batches="$2"; shift 2 ;;
    --mixed) mixed="$2"; shift 2 ;;
    *) echo "gpu-check-tower.sh: unknown argument $1 (see the header)" >&2; exit 2 ;;
  esac
done
if [[ -z "$build" || -z "$out" ]]; then
  echo "usage: scripts/gpu-check-tower.sh --build DIR --out DIR [--device cuda|cpu] [--model 7b|tiny] [--budget-s N]" >&2
  exit 2
fi
if [[ "$device" != cuda && "$device" != cpu ]]; then echo "gpu-check-tower.sh: --device cuda or cpu" >&2; exit 2; fi
if [[ "$model" != 7b && "$model" != tiny ]]; then echo "gpu-check-tower.sh: --model 7b or tiny" >&2; exit 2; fi
if ! [[ "$budget" =~ ^[0-9]+$ ]]; then echo "gpu-check-tower.sh: --budget-s must be a whole number" >&2; exit 2; fi
[[ -n "$python_bin" ]] || { echo "gpu-check-tower.sh: no python3" >&2; exit 2; }
if [[ -z "$images" ]]; then
  images=/usr/lib/python3/dist-packages/skimage/data
  [[ -d "$root/build-gpucarry/images" ]] && images="$root/build-gpucarry/images"
fi
mkdir -p "$out" "$build/models"
summary="$out/tower-gpu.md"
start=$SECONDS
failed=0

tool() {  # the path of a tower tool in the build directory
  local t
  for t in "$build/bench-gpu/$1" "$build/src/tower/$1" "$build/$1"; do
    [[ -x "$t" ]] && { echo "$t"; return 0; }
  done
  return 1
}
note() { echo "$*" | tee -a "$summary"; }
left() { echo $((budget - (SECONDS - start))); }
# Runs "$@" capped at $1 seconds (or the budget left), output appended to log $2.
capped() {
  local cap="$1" log="$2"
  shift 2
  local l
  l=$(left)
  ((l < cap)) && cap=$l
  ((cap < 5)) && { echo "out of time" >>"$log"; return 124; }
  timeout --kill-after=10 "$cap" "$@" >>"$log" 2>&1
}
# True when at least $1 seconds of the budget are left; else notes the skip of $2.
fits() {
  (($(left) >= $1)) && return 0
  note "- $2: skipped, $(left) s of the budget left (needs $1)"
  return 1
}

# On CUDA: bf16, the output kept in device memory in bf16 (the serving path
# with the GPU tier, and what transformers' tower returns), and 8 intra-op
# threads for the host work (staging the pixels in bf16, the metadata).
if [[ $device == cuda ]]; then
  dtype=bf16 threads=8 out_flags=(--output device)
else
  dtype=f32 threads=1 out_flags=()
fi
gpu_name="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || true)"
peak=0
case "$gpu_name" in
  *H200*NVL*) peak=835 ;;  # NVIDIA's dense bf16 Tensor Core peaks (docs/GPU.md)
  *H200*) peak=989.4 ;;
esac
: >"$summary"
note "# Tower on the device ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
note ""
note "device: ${gpu_name:-$device}; dtype $dtype; model size $model; peak ${peak} TFLOP/s dense bf16 (0: no MFU)"
"$python_bin" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' >>"$summary" 2>&1 || true
note ""

# --- checkpoints: tiny now, the real-size ones in the background --------------
declare -A ckpt
for arch in qwen2_vl qwen2_5_vl qwen3_vl; do
  d="$build/models/tiny-$arch"
  if [[ ! -f "$d/model.safetensors" ]]; then
    "$python_bin" "$root/scripts/make_tiny_checkpoint.py" --arch "$arch" --out "$d" >>"$out/checkpoints.log" 2>&1 ||
      { note "- FAIL: writing tiny-$arch (see checkpoints.log)"; failed=1; }
  fi
  ckpt[$arch]="$d"
done
writers=()
if [[ $model == 7b ]]; then
  for arch in qwen2_5_vl qwen2_vl qwen3_vl; do  # Qwen2.5-VL first: every step needs it
    d="$build/models/$arch-7b-bf16"
    ckpt[$arch]="$d"
    [[ -f "$d/.complete" ]] && continue
    rm -rf "$d"
    ( timeout 150 "$python_bin" "$root/scripts/make_tiny_checkpoint.py" --arch "$arch" --size 7b --dtype bf16 \
        --out "$d" >>"$out/checkpoints.log" 2>&1 && touch "$d/.complete" ) &
    writers+=("$arch:$!")
  done
fi
# Waits for the background writer of $1; false when it failed.
ready() {
  local w
  for w in "${writers[@]}"; do
    [[ ${w%%:*} == "$1" ]] && wait "${w#*:}" 2>/dev/null
  done
  [[ $model == tiny || -f "${ckpt[$1]}/.complete" ]]
}

# --- 1. the GPU test: kernels, attention adapter, graphs, batch vs alone -----
if [[ $device == cuda ]]; then
  if gpu_test="$(tool checkpoint_tower_gpu_test)" && fits 30 "checkpoint_tower_gpu_test"; then
    if EPD_TINY_CHECKPOINTS="$build/models" capped 180 "$out/gpu_test.log" "$gpu_test"; then
      note "- checkpoint_tower_gpu_test: $(grep -E '^\[  PASSED  \]' "$out/gpu_test.log" | tail -n 1)"
    else
      note "- checkpoint_tower_gpu_test: FAILED (see gpu_test.log): $(grep -E '^\[  FAILED  \]' "$out/gpu_test.log" | head -n 8 | tr '\n' ' ')"
      failed=1
    fi
    if grep -q '^\[  SKIPPED \]' "$out/gpu_test.log"; then
      note "- checkpoint_tower_gpu_test: tests SKIPPED on a GPU machine (see gpu_test.log)"
      failed=1
    fi
  elif [[ -z "${gpu_test:-}" ]]; then
    note "- checkpoint_tower_gpu_test: not built (needs EPD_WITH_CUDA and a CUDA libtorch: EPD_TOWER_CUDA)"
    failed=1
  fi
else
  note "- checkpoint_tower_gpu_test: not run (--device cpu)"
fi

main_ckpt="${ckpt[qwen2_5_vl]}"
if ! ready qwen2_5_vl; then
  note "- FAIL: the real-size Qwen2.5-VL checkpoint was not written (see checkpoints.log; needs numpy)"
  note ""
  note "total: $((SECONDS - start)) s; FAIL"
  exit 1
fi
photo="$images/astronaut.png"
[[ -f "$photo" ]] || photo=/usr/lib/python3/dist-packages/skimage/data/astronaut.png
bench="$(tool checkpoint_tower_bench || true)"

# --- 2. profile at batch 8: the baseline and the finished tower ---------------
note ""
note "## Profile at batch 8 (Kineto, 3 Encode calls after 2 warm-ups)"
if profiler="$(tool checkpoint_tower_profile)"; then
  for cfg in baseline default; do
    fits 40 "profile ($cfg)" || break
    trace="$build/trace_$cfg.json"
    rm -f "$trace"
    if capped 90 "$out/profile_$cfg.log" "$profiler" --model "$main_ckpt" --photo "$photo" --device "$device" \
         --dtype "$dtype" --batch 8 --calls 3 --config "$cfg" --trace "$trace" --threads "$threads" \
         "${out_flags[@]}" &&
       "$python_bin" "$root/scripts/tower_profile.py" --trace "$trace" --label "$cfg" --json "$out/profile_$cfg.json" \
         >"$out/profile_$cfg.md" 2>>"$out/profile_$cfg.log"; then
      cat "$out/profile_$cfg.md" >>"$summary"
      gzip -c "$trace" >"$out/trace_$cfg.json.gz" 2>/dev/null || true
      note ""
    else
      note "- profile ($cfg): failed (see profile_$cfg.log): $(grep -m1 -E 'checkpoint_tower_profile:|tower_profile.py:' "$out/profile_$cfg.log")"
      [[ $device == cuda ]] && failed=1
    fi
  done
else
  note "- checkpoint_tower_profile: not built (its build step failed; see build.log)"
  [[ $device == cuda ]] && failed=1
fi

# --- 3. the block's GEMMs ---------------------------------------------------------
note ""
note "## GEMM microbenchmark (the block's shapes, addmm with bias)"
if fits 20 "GEMM microbenchmark"; then
  gemm_args=(--device "$device" --dtype "$dtype")
  [[ $device == cpu ]] && gemm_args+=(--m 64 --repeats 3)
  if capped 90 "$out/gemm.log" "$python_bin" "$root/scripts/tower_gemm_bench.py" "${gemm_args[@]}" --json "$out/gemm.json"; then
    grep -E '^(\||torch)' "$out/gemm.log" >>"$summary"
  else
    note "- tower_gemm_bench.py: failed (see gemm.log)"
  fi
fi

# --- 4. the step-gain table and MFU (Qwen2.5-VL) ---------------------------------
note ""
note "## Steps, MFU and targets (Qwen2.5-VL, astronaut.png 512x512 and the mixed batch)"
hf_json="$out/hf_tower_bench.json"
if [[ -z "$bench" ]]; then
  note "- checkpoint_tower_bench: not built"; failed=1
elif fits 60 "step benchmark"; then
  # One process per step, so that a step that breaks (a kernel fault kills
  # its CUDA context) loses only its own rows; the JSON rows are then joined.
  step_jsons=()
  for cfg in baseline restructure attention fusions graphs; do
    fits 20 "step $cfg" || break
    if capped 120 "$out/steps.md" "$bench" --model "$main_ckpt" --photo "$photo" --device "$device" --dtype "$dtype" \
         --threads "$threads" --batches "$batches" --repeats "$repeats" --mixed "$mixed" "${out_flags[@]}" \
         --out-dtype "$dtype" --configs "$cfg" --json "$out/step_$cfg.json"; then
      step_jsons+=("$out/step_$cfg.json")
    else
      note "- step $cfg: FAILED (see steps.md)"; failed=1
    fi
  done
  "$python_bin" - "$out/steps.json" "${step_jsons[@]}" <<'EOF_JOIN'
import json, sys
docs = [json.load(open(p)) for p in sys.argv[2:]]
joined = dict(docs[0]) if docs else {"schema": "epd-bench-checkpoint-tower/1"}
joined["rows"] = [r for d in docs for r in d["rows"]]
json.dump(joined, open(sys.argv[1], "w"), indent=2)
EOF_JOIN
  if ((${#step_jsons[@]} > 0)); then
    # transformers' tower on the same checkpoint, for the ratio (a figure, not a check).
    if [[ $device == cuda ]] && "$python_bin" -c 'import transformers, safetensors' 2>/dev/null && fits 60 "hf_tower_bench"; then
      capped 150 "$out/hf_tower_bench.md" "$python_bin" "$root/scripts/hf_tower_bench.py" --model "$main_ckpt" \
        --batches 1,8 --repeats "$repeats" --json "$hf_json" || note "- hf_tower_bench.py: failed (see hf_tower_bench.md)"
    else
      note "- hf_tower_bench.py: not run (cpu, no transformers/safetensors, or out of time)"
    fi
    hf_flag=()
    [[ -f "$hf_json" ]] && hf_flag=(--hf "$hf_json")
    if "$python_bin" "$root/scripts/tower_mfu.py" --config "$main_ckpt/config.json" --bench "$out/steps.json" \
         --peak-tflops "$peak" --peak-name "${gpu_name:-$device}" --steps --targets "${hf_flag[@]}" \
         >"$out/steps_mfu.md" 2>>"$out/steps.md"; then
      cat "$out/steps_mfu.md" >>"$summary"
    else
      note "- tower_mfu.py: FAILED (see steps.md)"; failed=1
    fi
    grep -E '^note' "$out/steps.md" >>"$summary" || true
    [[ -f "$out/hf_tower_bench.md" ]] && { note ""; note "transformers' tower:"; grep -E '^(\||batch .* under)' "$out/hf_tower_bench.md" >>"$summary" || true; }
  fi
fi

# --- 5. parity: the device tower against the CPU float32 tower on 4 photos -------
note ""
note "## Parity: $device $dtype against CPU float32, 4 photos of different sizes"
if parity="$(tool checkpoint_tower_parity)" && fits 60 "parity"; then
  photos="$images/astronaut.png,$images/coffee.png,$images/chelsea.png,$images/rocket.jpg"
  capped 200 "$out/parity.md" "$parity" --model "$main_ckpt" --device "$device" --dtype "$dtype" --photos "$photos" \
    --json "$out/parity.json"
  rc=$?
  grep -E '^(\||bounds)' "$out/parity.md" >>"$summary" || true
  if ((rc != 0)); then
    note "- parity: $([[ $rc == 2 ]] && echo "bounds MISSED" || echo "FAILED (see parity.md)")"; failed=1
  fi
elif [[ -z "${parity:-}" ]]; then
  note "- checkpoint_tower_parity: not built"; failed=1
fi

# --- 6. the other two towers: the finished tower at batch 1 and 8, mixed ---------
note ""
note "## Qwen2-VL and Qwen3-VL ($model checkpoints, the finished tower)"
for arch in qwen2_vl qwen3_vl; do
  fits 40 "$arch" || continue
  if ! ready "$arch"; then note "- $arch: the checkpoint was not written (see checkpoints.log)"; continue; fi
  arch_photo="$photo"
  if capped 120 "$out/$arch.md" "$bench" --model "${ckpt[$arch]}" --photo "$arch_photo" --device "$device" \
       --dtype "$dtype" --threads "$threads" --batches "$batches" --repeats "$repeats" --mixed "$mixed" \
       "${out_flags[@]}" --out-dtype "$dtype" --json "$out/$arch.json" &&
     "$python_bin" "$root/scripts/tower_mfu.py" --config "${ckpt[$arch]}/config.json" --bench "$out/$arch.json" \
       --peak-tflops "$peak" --peak-name "${gpu_name:-$device}" >"$out/${arch}_mfu.md" 2>>"$out/$arch.md"; then
    note "### $arch"
    cat "$out/${arch}_mfu.md" >>"$summary"
  else
    note "- $arch: FAILED (see $arch.md)"; failed=1
  fi
done

# --- 7. the engines users would pick instead ----------------------------------------
note ""
for engine in vllm sglang; do
  if "$python_bin" -c "import $engine" 2>/dev/null; then
    note "- $engine is importable here; its vision tower is not timed by this script (not written yet)"
  else
    note "- $engine: not importable here, not timed"
  fi
done

for w in "${writers[@]}"; do wait "${w#*:}" 2>/dev/null || true; done
note ""
note "total: $((SECONDS - start)) s; $([[ $failed == 0 ]] && echo PASS || echo FAIL)"
exit "$failed"

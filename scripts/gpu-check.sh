#!/usr/bin/env bash
# The GPU tier's device checks, for a machine with an NVIDIA GPU (written for
# the H200 device machine: nvcc 13, PyTorch with CUDA, no Debian -dev
# packages, no network). Never installs anything.
#
# What it does, each step logged under $OUT:
#   1. configures src/gpu on its own (core + gpu, plus the torch tower when
#      python3's torch has a CMake config, plus media + worker when the
#      sysroot is staged; no gRPC or Python) with CUDA on, for sm_90, and
#      builds it, with the GPU benchmarks of bench/gpu/;
#   2. runs the tests (ctest): the CPU tests and cuda_device_test, which must
#      not skip here;
#   2b. runs cuda_ipc_check: device rows exported by CUDA IPC in one process,
#      imported and compared byte for byte in another (docs/SHM.md); once from
#      a plain device buffer and once (--from-l1) from an L1 entry of the GPU
#      tier, as the server's CUDA IPC delivery exports;
#   2c. with GPU_CHECK_SERVE_BUILD (a full build directory with gRPC and
#      EPD_WITH_CUDA=ON, made where the -dev packages exist): starts
#      `epd-encode serve --device cuda --ipc-export-mb 64` on the default
#      tower, and cuda_ipc_fetch_check (src/client/ipc_fetch_check.cc)
#      encodes a staged image inline (warming L1 in VRAM), fetches it again
#      by CUDA IPC from this second process, imports it on cuda:0 and
#      compares the bytes with inline (docs/SHM.md, "CUDA IPC"). Without
#      GPU_CHECK_SERVE_BUILD it is skipped and says so: the standalone
#      src/gpu build of step 1 has no gRPC, hence no server;
#   3. runs compute-sanitizer --tool memcheck over the CUDA round-trip tests;
#   4. runs gpu_tier_bench (offload/onboard GB/s vs the pinned-copy peak); if
#      the tower was built, makes a ViT-L-sized tower (scripts/
#      make_default_tower.py) and runs tower_gpu_bench on it (items/s by
#      batch size, output to host and kept on the device); if the worker was
#      built too, gpu_replay_bench (a Zipf replay of the staged images with
#      L1 in VRAM and L2 pinned, against the tower-only limit);
#   5. with torch + worker (which build epd::model, epd::checkpoint_tower and
#      the tower tools): scripts/gpu-check-tower.sh, the vision tower's
#      measurements of issue 24 (its header lists them), under $OUT/tower/:
#      the CUDA tower's GPU test, real-size checkpoints of the three towers
#      (random weights, bf16, python3 + numpy on the device), the profile at
#      batch 8, the GEMM microbenchmark, the step-gain table, MFU at batch 1,
#      8 and mixed sizes, transformers' tower, and the parity on 4 photos
#      (docs/GPU.md "Tower restructure"; the peak from the GPU's name: H200
#      SXM 989.4, H200 NVL 835 dense bf16 TFLOP/s).
# GPU_CHECK_STEPS (comma-separated, default "all") picks the steps after the
# build: tests, serve_ipc, sanitizer, bench, tower (alias: checkpoint); e.g.
# GPU_CHECK_STEPS=tower spends a short device lease on step 5 alone.
# GPU_CHECK_BUDGET_S (default 560) is the whole run's time budget; step 5
# gets what the steps before it left.
# Exits non-zero if the build, a test, the sanitizer, the replay or the
# checkpoint step (numpy missing included) fails.
# Budget: about 4-6 minutes on 16 cores, each step capped so the whole stays
# under 9.
#
# Usage:
#   scripts/gpu-check.sh --stage   on the development machine, before the run,
#                                  fills build-gpucarry/ (the device image has
#                                  no GTest, no -dev packages, no network):
#                                  googletest/  Debian's GoogleTest source;
#                                  sysroot/     headers and static archives of
#                                    libcrypto, libpng16, zlib, TurboJPEG,
#                                    libwebp(+demux), giflib,
#                                    xxHash, stb_image_resize and nlohmann-json,
#                                    unpacked (dpkg -x, nothing installed) from
#                                    Debian 12 packages fetched with apt-get
#                                    download into $GPU_CHECK_DEB_CACHE (default
#                                    ${TMPDIR:-/tmp}/epd-gpucheck-debs), for
#                                    src/gpu's -DEPD_GPU_WITH_WORKER=ON;
#                                  images/      the demo's photographs and
#                                    derived variants (scripts/demo.sh
#                                    --images-only), for the replay benchmark
#                                    and (astronaut.png, 512x512) the 7B
#                                    checkpoint tower benchmark.
#   scripts/gpu-check.sh           on the device machine (OUT is set by the
#                                  device tool; default build-gpucheck-out/;
#                                  GPU_CHECK_BUILD_DIR overrides build-gpucheck/)
# With the device tool: run(command="scripts/gpu-check.sh",
#                           carry=["build-gpucarry"], timeout_s=540)
#   the tower alone (issue 24): run(command="GPU_CHECK_STEPS=tower
#     GPU_CHECK_BUDGET_S=570 scripts/gpu-check.sh", carry=["build-gpucarry"],
#     timeout_s=590)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
carry_dir="$root/build-gpucarry"

if [[ "${1:-}" == "--stage" ]]; then
  src=/usr/src/googletest
  if [[ ! -f "$src/CMakeLists.txt" ]]; then
    echo "gpu-check.sh: $src not found (Debian package googletest / libgtest-dev)" >&2
    exit 1
  fi
  rm -rf "$carry_dir/googletest"
  mkdir -p "$carry_dir"
  cp -r "$src" "$carry_dir/googletest"

  # The media libraries for -DEPD_GPU_WITH_WORKER=ON (src/gpu/standalone.cmake
  # names the files it uses). Static archives, so the device binaries need
  # nothing from the device image but glibc.
  debs="${GPU_CHECK_DEB_CACHE:-${TMPDIR:-/tmp}/epd-gpucheck-debs}"
  pkgs=(libssl-dev libpng-dev zlib1g-dev libturbojpeg0-dev libxxhash-dev libstb-dev nlohmann-json3-dev
        libwebp-dev libgif-dev)
  mkdir -p "$debs"
  missing=()
  for p in "${pkgs[@]}"; do
    compgen -G "$debs/${p}_*.deb" >/dev/null || missing+=("$p")
  done
  if ((${#missing[@]} > 0)); then
    echo "gpu-check.sh: downloading ${missing[*]} into $debs (nothing is installed)" >&2
    if ! (cd "$debs" && apt-get download -qq "${missing[@]}"); then
      sudo=""
      [[ $(id -u) -ne 0 ]] && sudo="sudo"
      echo "gpu-check.sh: apt-get download failed; refreshing the apt lists and retrying" >&2
      $sudo apt-get update -qq >/dev/null 2>&1 || true
      (cd "$debs" && apt-get download -qq "${missing[@]}") || {
        echo "gpu-check.sh: could not download ${missing[*]}" >&2
        exit 1
      }
    fi
  fi
  sysroot="$carry_dir/sysroot"
  rm -rf "$sysroot"
  mkdir -p "$sysroot"
  for p in "${pkgs[@]}"; do
    dpkg -x "$(compgen -G "$debs/${p}_*.deb" | sort -V | tail -n 1)" "$sysroot"
  done
  # Keep only what the build uses: no docs, tools, CMake/pkg-config files,
  # libssl.a, libstb.a or the other stb headers, and no symlinks (the .so
  # links point at libraries that are not there, and the header aliases such
  # as png.h -> libpng16/png.h are not needed: the build uses libpng16/).
  inc="$sysroot/usr/include"
  lib="$sysroot/usr/lib/x86_64-linux-gnu"
  rm -rf "$sysroot/usr/share" "$sysroot/usr/bin" "$lib/pkgconfig" "$lib/cmake" \
    "$lib/libssl.a" "$lib/libstb.a" "$inc/xxh3.h" "$inc/xxh_x86dispatch.h"
  find "$sysroot" -type l -delete
  find "$inc/stb" -type f ! -name stb_image_resize.h -delete
  for f in "$lib/libcrypto.a" "$lib/libpng16.a" "$lib/libz.a" "$lib/libturbojpeg.a" "$lib/libxxhash.a" \
           "$lib/libwebp.a" "$lib/libwebpdemux.a" "$lib/libgif.a" "$inc/webp/demux.h" "$inc/gif_lib.h" \
           "$inc/openssl/evp.h" "$inc/x86_64-linux-gnu/openssl/configuration.h" "$inc/libpng16/png.h" \
           "$inc/zlib.h" "$inc/turbojpeg.h" "$inc/xxhash.h" "$inc/stb/stb_image_resize.h" \
           "$inc/nlohmann/json.hpp"; do
    if [[ ! -f "$f" ]]; then
      echo "gpu-check.sh: $f is not in the unpacked packages" >&2
      exit 1
    fi
  done

  # The replay benchmark's images, made exactly as `make demo` makes them.
  "$root/scripts/demo.sh" --images-only "$carry_dir/images"
  if compgen -G "$carry_dir/images/synthetic_*" >/dev/null; then
    echo "gpu-check.sh: WARNING: images/ holds synthetic images (the photographs could not be downloaded)" >&2
  fi

  du -sh "$carry_dir"/googletest "$carry_dir"/sysroot "$carry_dir"/images
  size_kb=$(du -sk "$carry_dir" | cut -f1)
  echo "staged $((size_kb / 1024)) MB in $carry_dir; pass carry=[\"build-gpucarry\"] to the run"
  if ((size_kb > 35 * 1024)); then
    echo "gpu-check.sh: WARNING: over 35 MB; the device tool carries at most 64 MB with the working tree" >&2
  fi
  exit 0
elif [[ $# -gt 0 ]]; then
  echo "usage: scripts/gpu-check.sh [--stage]" >&2
  exit 2
fi

out="${OUT:-$root/build-gpucheck-out}"
mkdir -p "$out"
build="${GPU_CHECK_BUILD_DIR:-$root/build-gpucheck}"
benches="$build/bench-gpu"  # bench/gpu/, added by src/gpu/CMakeLists.txt
summary="$out/summary.md"
start=$SECONDS
# The whole run's budget (the device tool's timeout, less a margin).
GPU_CHECK_BUDGET_S="${GPU_CHECK_BUDGET_S:-560}"
failed=0

note() { echo "$*" | tee -a "$summary"; }
steps=",${GPU_CHECK_STEPS:-all},"
# True when step $1 was asked for (GPU_CHECK_STEPS).
want() { [[ $steps == *",all,"* || $steps == *",$1,"* ]]; }
elapsed() { echo $((SECONDS - start)); }
# Runs "$@" with a time cap, appending stdout+stderr to a log; returns its status.
capped() {
  local cap="$1" log="$2"
  shift 2
  timeout --kill-after=10 "$cap" "$@" >>"$log" 2>&1
}

: >"$summary"
note "# gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ)"
note ""
{
  echo '```'
  nvidia-smi -L 2>&1 || echo "nvidia-smi: not available"
  nvidia-smi --query-gpu=driver_version,memory.total --format=csv,noheader 2>&1 || true
  uname -m
  nproc
} >>"$summary"

nvcc_bin="$(command -v nvcc || true)"
if [[ -z "$nvcc_bin" && -x /usr/local/cuda/bin/nvcc ]]; then nvcc_bin=/usr/local/cuda/bin/nvcc; fi
if [[ -z "$nvcc_bin" ]]; then
  echo "nvcc: not found" >>"$summary"
  echo '```' >>"$summary"
  note "FAIL: no nvcc on PATH or at /usr/local/cuda/bin"
  exit 1
fi
export CUDACXX="$nvcc_bin"
"$nvcc_bin" --version | tail -n 2 >>"$summary"
cmake --version | head -n 1 >>"$summary"

python_bin="$(command -v python3 || true)"
torch_prefix=""
if [[ -n "$python_bin" ]]; then
  # GPU_CHECK_ANY_TORCH=1 takes a CPU-only torch too: a dry run of the whole
  # script on a machine without a GPU.
  torch_prefix="$("$python_bin" -c 'import os, torch; print(torch.utils.cmake_prefix_path if torch.cuda.is_available() or os.environ.get("GPU_CHECK_ANY_TORCH") == "1" else "")' 2>/dev/null || true)"
  "$python_bin" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())' >>"$summary" 2>&1 || echo "python3: no torch" >>"$summary"
fi
echo '```' >>"$summary"
note ""

# --- 1. configure and build ----------------------------------------------
generator=("-G" "Unix Makefiles")
if command -v ninja >/dev/null 2>&1; then generator=("-G" "Ninja"); fi
common=(-S "$root/src/gpu" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release
        -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER="$nvcc_bin")
if [[ -f "$carry_dir/googletest/CMakeLists.txt" ]]; then
  # The staged copy wins over any installed GTest, so every run builds the same one.
  common+=(-DEPD_GTEST_SOURCE_DIR="$carry_dir/googletest" -DCMAKE_DISABLE_FIND_PACKAGE_GTest=ON)
fi
with_worker_flags=()
if [[ -f "$carry_dir/sysroot/usr/lib/x86_64-linux-gnu/libcrypto.a" ]]; then
  with_worker_flags=(-DEPD_GPU_WITH_WORKER=ON -DEPD_GPU_SYSROOT="$carry_dir/sysroot")
fi
build_log="$out/build.log"
: >"$build_log"
# Most capable first: torch + worker, torch alone, neither.
with_torch=0
with_worker=0
configured=0
if [[ -n "$torch_prefix" ]]; then
  if ((${#with_worker_flags[@]})) &&
     capped 180 "$build_log" cmake "${common[@]}" "${with_worker_flags[@]}" -DEPD_GPU_WITH_TORCH=ON \
       -DCMAKE_PREFIX_PATH="$torch_prefix"; then
    with_torch=1; with_worker=1; configured=1
  else
    rm -rf "$build"
    if capped 180 "$build_log" cmake "${common[@]}" -DEPD_GPU_WITH_TORCH=ON -DCMAKE_PREFIX_PATH="$torch_prefix"; then
      with_torch=1; configured=1
      note "- configure with the worker failed or no sysroot staged (see build.log); no replay benchmark"
    fi
  fi
fi
if [[ $configured == 0 ]]; then
  [[ -n "$torch_prefix" ]] && note "- libtorch's CMake config failed (see build.log); building without the tower"
  rm -rf "$build"
  if ! capped 120 "$build_log" cmake "${common[@]}" -DEPD_GPU_WITH_TORCH=OFF; then
    note "FAIL: configure (see build.log)"
    exit 1
  fi
fi
if ! capped 300 "$build_log" cmake --build "$build" -j "$(nproc)"; then
  note "FAIL: build (see build.log)"
  tail -n 30 "$build_log" >&2
  exit 1
fi
note "- build: ok in $(elapsed) s (tower: $([[ $with_torch == 1 ]] && echo built || echo not built), worker: $([[ $with_worker == 1 ]] && echo built || echo not built))"

# --- 2. tests -----------------------------------------------------------------
test_log="$out/ctest.log"
if ! want tests; then
  note "- tests: not asked for (GPU_CHECK_STEPS=${GPU_CHECK_STEPS:-all})"
elif capped 180 "$test_log" ctest --test-dir "$build" --output-on-failure -j 8; then
  note "- tests: $(grep -oE '[0-9]+% tests passed.*' "$test_log" | tail -n 1)"
else
  note "- tests: FAILED (see ctest.log): $(grep -E 'tests failed|\*\*\*Failed|\(Failed\)' "$test_log" | head -n 5 | tr '\n' ' ')"
  failed=1
fi
# On a GPU machine the CUDA tests must run, not skip.
want tests && { capped 120 "$test_log" "$build/cuda_device_test" || true; }
if want tests && grep -q '\[  SKIPPED \] Cuda/' "$test_log"; then
  note "- cuda_device_test: SKIPPED its device tests: no usable device (see ctest.log)"
  failed=1
fi

# --- 2b. CUDA IPC across two processes -------------------------------------------
# cuda_ipc_check (src/gpu/ipc_two_process_check.cc) exports 2 MiB of device
# rows with Device::ExportIpc, spawns itself as the importer, which maps them
# with cudaIpcOpenMemHandle, waits on the interprocess event and compares the
# bytes; non-zero exit on a mismatch or any CUDA error.
ipc_log="$out/cuda_ipc.log"
if capped 60 "$ipc_log" "$build/cuda_ipc_check" --device cuda --bytes $((2 << 20)); then
  note "- CUDA IPC two-process check: ok ($(grep -m1 'importer (pid' "$ipc_log"))"
else
  note "- CUDA IPC two-process check: FAILED (see cuda_ipc.log): $(grep -m1 'FAIL' "$ipc_log")"
  failed=1
fi
# Again from an L1 entry of the GPU tier, dropped before the importer reads:
# the export source of the server's CUDA IPC delivery (src/server/ipc_delivery.cc).
if capped 60 "$ipc_log" "$build/cuda_ipc_check" --device cuda --bytes $((2 << 20)) --from-l1; then
  note "- CUDA IPC two-process check from an L1 entry: ok"
else
  note "- CUDA IPC two-process check from an L1 entry: FAILED (see cuda_ipc.log): $(grep 'FAIL' "$ipc_log" | tail -n 1)"
  failed=1
fi

# --- 2c. The server's CUDA IPC delivery, from a second process -------------------
# An L1 hit of `epd-encode serve --device cuda` delivered by CUDA IPC to
# cuda_ipc_fetch_check, which compares it with the inline bytes of the same
# image (exit 0 only when they are equal and came by CUDA IPC).
serve_build="${GPU_CHECK_SERVE_BUILD:-}"
serve_log="$out/serve_ipc.log"
ipc_image="$carry_dir/images/astronaut.png"
if ! want serve_ipc; then
  note "- serve CUDA IPC check: not asked for"
elif [[ -z "$serve_build" ]]; then
  note "- serve CUDA IPC check: skipped (set GPU_CHECK_SERVE_BUILD to a build with gRPC and EPD_WITH_CUDA=ON)"
elif [[ ! -x "$serve_build/tools/epd-encode" || ! -x "$serve_build/src/client/cuda_ipc_fetch_check" ]]; then
  note "- serve CUDA IPC check: FAILED: $serve_build lacks tools/epd-encode or src/client/cuda_ipc_fetch_check"
  failed=1
elif [[ ! -f "$ipc_image" ]]; then
  note "- serve CUDA IPC check: FAILED: no $ipc_image (run scripts/gpu-check.sh --stage)"
  failed=1
else
  : >"$serve_log"
  serve_out="$out/serve_ipc.stdout"
  "$serve_build/tools/epd-encode" serve --host 127.0.0.1 --port 0 --device cuda --cache-mb 256 \
    --host-cache-mb 256 --ipc-export-mb 64 >"$serve_out" 2>>"$serve_log" &
  serve_pid=$!
  serve_port=""
  for _ in $(seq 1 240); do  # up to 120 s for the tower to load
    serve_port="$(grep -oE '^READY port=[0-9]+' "$serve_out" 2>/dev/null | cut -d= -f2 || true)"
    [[ -n "$serve_port" ]] && break
    kill -0 "$serve_pid" 2>/dev/null || break
    sleep 0.5
  done
  if [[ -z "$serve_port" ]]; then
    note "- serve CUDA IPC check: FAILED: the server did not become ready (see serve_ipc.log)"
    failed=1
  elif capped 120 "$serve_log" "$serve_build/src/client/cuda_ipc_fetch_check" --server "127.0.0.1:$serve_port" \
         --device cuda --image "$ipc_image"; then
    note "- serve CUDA IPC check: ok ($(grep -m1 '^ipc_bytes=' "$serve_log"))"
  else
    note "- serve CUDA IPC check: FAILED (see serve_ipc.log): $(grep -m1 -E 'ipc_fetch_check:|same_as_inline' "$serve_log")"
    failed=1
  fi
  kill -TERM "$serve_pid" 2>/dev/null || true
  wait "$serve_pid" 2>/dev/null || true
fi

# --- 3. compute-sanitizer -------------------------------------------------------
# The CUDA round trips: upload/offload/onboard byte-exact, the tiered cache's
# demote/promote, and the concurrent put/get readers under churn.
san_log="$out/sanitizer.log"
sanitizer="$(command -v compute-sanitizer || true)"
if [[ -z "$sanitizer" && -x /usr/local/cuda/bin/compute-sanitizer ]]; then
  sanitizer=/usr/local/cuda/bin/compute-sanitizer
fi
if ! want sanitizer; then
  note "- compute-sanitizer: not asked for"
elif [[ -z "$sanitizer" ]]; then
  note "- compute-sanitizer: not found, not run"
elif capped 150 "$san_log" "$sanitizer" --tool memcheck --leak-check full --error-exitcode 1 \
       "$build/cuda_device_test" \
       --gtest_filter='Cuda/DeviceTierContract.*RoundTrip*:Cuda/DeviceTierContract.*ByteExact*:Cuda/DeviceTierContract.Concurrent*:CudaDeviceTest.LargeEntry*'; then
  note "- compute-sanitizer memcheck: clean ($(grep -c '^\[       OK \]' "$san_log") tests)"
else
  note "- compute-sanitizer memcheck: FAILED (see sanitizer.log)"
  failed=1
fi

# --- 4. benchmarks (each skipped when time runs short) --------------------------
note ""
if ! want bench; then
  note "- gpu_tier_bench: not asked for"
elif (($(elapsed) < 240)); then
  if capped 120 "$out/gpu_tier_bench.md" "$benches/gpu_tier_bench" --total-mb 1024 --reps 5 \
       --json "$out/gpu_tier_bench.json"; then
    note "## Tier copies"
    cat "$out/gpu_tier_bench.md" >>"$summary"
  else
    note "- gpu_tier_bench: FAILED (see gpu_tier_bench.md)"
    failed=1
  fi
else
  note "- gpu_tier_bench: skipped, $(elapsed) s spent already"
fi
note ""
models="$build/models"
mkdir -p "$models"
tower_log="$out/tower_gpu_bench.md"
# The GPU tower: ViT-L-like width (1024), 12 blocks, 2048-wide output with
# 2 deepstack taps, about 230M parameters, made deterministically here.
gpu_tower_args=(--embed-dim 1024 --depth 12 --heads 4 --hidden 2048 --deepstack-layers 2)
if want bench && [[ $with_torch == 1 ]] && (($(elapsed) < 270)); then
  if capped 150 "$tower_log" "$python_bin" "$root/scripts/make_default_tower.py" --out "$models/gpu_tower.pt" \
       "${gpu_tower_args[@]}"; then
    note "## Tower on the GPU (items/s by batch size)"
    # 512x512 items with the output copied to host and kept on the device,
    # then 224x224 items (kept on the device), where batching has more to give.
    for variant in "36 host" "36 device" "16 device"; do
      read -r side out_where <<<"$variant"
      flag=()
      [[ $out_where == device ]] && flag=(--output-on-device)
      if ! capped 90 "$tower_log" "$benches/tower_gpu_bench" --model "$models/gpu_tower.pt" --dtype float32 \
           --batches 1,2,4,8,16,32 --iters 10 --side "$side" "${flag[@]}"; then
        note "- tower_gpu_bench (side $side, output in $out_where memory): failed (see tower_gpu_bench.md)"
      fi
    done
    grep -E '^(tower:|\|)' "$tower_log" >>"$summary" || true
  else
    note "- making the GPU tower failed (see tower_gpu_bench.md)"
  fi
else
  note "- tower_gpu_bench: not run (tower not built, or out of time)"
fi
note ""
replay_log="$out/gpu_replay_bench.md"
if want bench && [[ $with_worker == 1 && -f "$models/gpu_tower.pt" && -d "$carry_dir/images" ]] && (($(elapsed) < 330)); then
  if capped 150 "$replay_log" "$benches/gpu_replay_bench" --model "$models/gpu_tower.pt" --images "$carry_dir/images" \
       --requests 600 --zipf 1.0 --seed 1 --window 8 --l1-mb 128 --l2-mb 1024 --decode-threads 12 \
       --json "$out/gpu_replay_bench.json"; then
    note "## Replay on the GPU (L1 in VRAM, L2 pinned) against the tower-only limit"
  else
    note "- gpu_replay_bench: FAILED (see gpu_replay_bench.md)"
    failed=1
  fi
  grep -E '^(device:|tower:|trace:|\|)' "$replay_log" >>"$summary" || true
else
  note "- gpu_replay_bench: not run (worker or tower not built, no staged images, or out of time)"
fi

note ""

# --- 5. the vision tower (issues 11 and 24): scripts/gpu-check-tower.sh -------
# The GPU test of the CUDA tower (kernels, flash varlen, graphs, batch vs
# alone), the real-size checkpoints of the three towers (written here), the
# profile at batch 8, the GEMM microbenchmark, the step-gain table, MFU at
# batch 1 / 8 / mixed sizes, transformers' tower and the bf16-vs-float32
# parity on 4 photos; everything under $OUT/tower/ (tower-gpu.md is the
# summary docs/GPU.md is updated from).
if ! want tower && ! want checkpoint; then
  note "- tower: not asked for"
elif [[ $with_torch == 0 || $with_worker == 0 ]]; then
  note "- tower: not run (needs the torch tower and the worker's sysroot: the checkpoint loader)"
else
  # Built on its own: a profiler API change breaks only this tool.
  capped 240 "$build_log" cmake --build "$build" -j "$(nproc)" --target checkpoint_tower_profile ||
    note "- checkpoint_tower_profile did not build (see build.log); the profile is skipped"
  tower_budget=$((GPU_CHECK_BUDGET_S - $(elapsed) - 15))
  note "## Vision tower (scripts/gpu-check-tower.sh, ${tower_budget} s budget)"
  if "$root/scripts/gpu-check-tower.sh" --build "$build" --out "$out/tower" --device cuda --model 7b \
       --budget-s "$tower_budget" --images "$carry_dir/images" --python "$python_bin"; then
    note "- tower: PASS (see tower/tower-gpu.md)"
  else
    note "- tower: FAIL (see tower/tower-gpu.md)"
    failed=1
  fi
  grep -E '^(\| >=|\| <=|bounds)' "$out/tower/tower-gpu.md" >>"$summary" 2>/dev/null || true
fi

note ""
note "total: $(elapsed) s; $([[ $failed == 0 ]] && echo PASS || echo FAIL)"
exit "$failed"

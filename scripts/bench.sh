#!/usr/bin/env bash
# Runs the benchmark sections and regenerates docs/BENCHMARKS.md and the plots
# in docs/img/ from their results.
#
# Usage: scripts/bench.sh [BUILD_DIR]          (default: build)
#   EPD_BENCH_SECTIONS="core"   run only these sections (space-separated);
#                               results of sections not run are kept and
#                               still reported
#   EPD_REFERENCE_DIR=DIR       the Python reference (default ../shared/reference
#                               from the repository root; skipped if absent)
#   EPD_BENCH_REPORT_ONLY=1     only rebuild the report from existing results
#
# The cache section needs its peer caches (leveldb, RocksDB): it configures
# BUILD_DIR again with EPD_BENCH_REQUIRE_PEERS=ON, so that peers installed
# since the last configure are found and a missing one stops the run with its
# name, and it checks the cache_bench binary for their benchmarks before
# running it. bench/report.py likewise refuses cache results without them.
#
# Results go to BUILD_DIR/bench-results/: one JSON per benchmark binary (Google
# Benchmark's --benchmark_out format), reference.json, and run_SECTION.json
# with the commands a section ran. bench/report.py renders every JSON there.
#
# Adding a section: write a section_NAME function below that runs its
# commands through `run` (so they are recorded) and writes NAME.json into
# "$results", add NAME to SECTIONS, and add a renderer to bench/report.py
# (its docstring says how).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build="${1:-build}"
results="$build/bench-results"
py=/usr/bin/python3
SECTIONS=(core e2e l3 video economics http_edge preprocess)
if [[ -n "${EPD_BENCH_SECTIONS:-}" ]]; then read -r -a SECTIONS <<<"$EPD_BENCH_SECTIONS"; fi
mkdir -p "$results"

commands=()
# Runs a command, echoing it and recording it for the report.
run() {
  echo "+ $*" >&2
  commands+=("$*")
  "$@"
}

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

# Writes run_SECTION.json: what ran, when, and the load around it.
record() {
  local section="$1" start="$2" load0="$3" t0="$4"
  "$py" - "$results/run_$section.json" "$section" "$start" "$(date -u +%FT%TZ)" "$load0" "$(loadavg)" \
    "$(( $(date +%s) - t0 ))" "${commands[@]}" <<'EOF'
import json, sys
out, section, start, end, l0, l1, wall, *cmds = sys.argv[1:]
json.dump({"section": section, "start": start, "end": end, "loadavg_before": l0, "loadavg_after": l1,
           "wall_s": int(wall), "commands": cmds}, open(out, "w"), indent=2)
EOF
}

# The peer caches cache_bench must compare against, and the name of one of
# each peer's benchmarks (bench/cache_bench.cc).
PEERS=("leveldb:hit/leveldb_lru/" "RocksDB LRUCache:hit/rocksdb_lru/" "RocksDB HyperClockCache:hit/rocksdb_hcc/")

# Fails naming each peer cache the cache_bench binary was built without.
check_peers() {
  local listed missing=()
  listed="$("$build/bench/cache_bench" --benchmark_list_tests)"
  for p in "${PEERS[@]}"; do
    if ! grep -q "^${p#*:}" <<<"$listed"; then missing+=("${p%%:*}"); fi
  done
  if ((${#missing[@]} > 0)); then
    echo "bench.sh: $build/bench/cache_bench was built without the peer cache(s): ${missing[*]}" \
         "(install them with scripts/install-deps.sh bench); no report is written" >&2
    exit 1
  fi
}

# Cache and scheduler microbenchmarks, and the Python reference on the same
# workloads (about 5 minutes on 2 cores).
section_core() {
  # Configure again, so that peers installed since the last configure are
  # found (find_library retries a NOTFOUND only when CMake runs; `cmake
  # --build` alone does not re-run it), and so that a missing peer stops here
  # with its name (EPD_BENCH_REQUIRE_PEERS, bench/peers.cmake).
  run cmake -S . -B "$build" -DEPD_BUILD_BENCH=ON -DEPD_BENCH_REQUIRE_PEERS=ON
  run cmake --build "$build" --target cache_bench scheduler_bench
  check_peers
  mkdir -p "$results/streams"
  run "$build/bench/cache_bench" --dump_streams="$results/streams"
  run "$build/bench/cache_bench" --benchmark_out="$results/cache_bench.json" --benchmark_out_format=json
  run "$build/bench/scheduler_bench" --benchmark_out="$results/scheduler_bench.json" --benchmark_out_format=json
  local ref_args=(--streams "$results/streams" --out "$results/reference.json")
  if [[ -n "${EPD_REFERENCE_DIR:-}" ]]; then ref_args+=(--reference "$EPD_REFERENCE_DIR"); fi
  run "$py" bench/reference_bench.py "${ref_args[@]}"
}

# End to end: `epd-encode replay` against the Python reference worker, replay
# --no-cache and the tower-time limit on three traces over the demo's photos,
# and a cache-size sweep (bench/e2e_bench.py; about 4 minutes on 2 cores).
# Writes e2e.json, docs/BENCHMARKS-e2e.md and docs/img/e2e_*.png.
section_e2e() {
  run cmake --build "$build" --target epd-encode
  # The demo fetches and derives the photographs (reused when present).
  if ! compgen -G "$build/demo-data/images/*.png" >/dev/null; then run scripts/demo.sh "$build"; fi
  local e2e_args=(--build "$build")
  if [[ -n "${EPD_REFERENCE_DIR:-}" ]]; then e2e_args+=(--reference "$EPD_REFERENCE_DIR"); fi
  run "$py" bench/e2e_bench.py "${e2e_args[@]}"
}

# The L3 tier and the cluster (issue 14): bench/l3_bench against a
# redis-server of its own, entry sizes through the server, and the cluster
# trace (3 servers behind nginx, a scale event, a same-image burst) without
# L3, with L3 and with L3 + single flight (bench/cluster_bench.py; about 5
# minutes on 2 cores). Writes l3.json and docs/BENCHMARKS-l3.json.
section_l3() {
  run cmake --build "$build" --target epd-encode l3_bench epd_python_stubs epd_python_files epd_python_core
  run "$py" bench/cluster_bench.py --build "$build"
}

# Videos: overlapping clips (a sliding window, a growing stream's prefixes)
# through replay with chunk caching, whole-video caching only, and the limit
# (bench/video_bench.py; about a minute). Writes docs/BENCHMARKS-video.md.
section_video() {
  run cmake --build "$build" --target epd-encode
  run "$py" bench/video_bench.py --build "$build"
}

# Cache economics (issue 26): GDSF against LRU on whole traces, the
# doorkeeper, GDSF get/put costs, and `epd-encode plan` on a 10^7-request
# trace (bench/economics_bench.py; generating that trace takes most of the
# ~25 minutes on 2 shared cores, and is reused when present), and plan
# against a live worker and Redis (bench/plan_live_bench.py). Writes
# plan_live.json, economics.json, docs/BENCHMARKS-economics.md and
# docs/img/plan_production.png.
section_economics() {
  run cmake --build "$build" --target epd-encode eviction_bench
  # plan against a live worker and a memory-capped Redis (about 3 minutes), reported with the rest.
  run "$py" bench/plan_live_bench.py --build "$build"
  run "$py" bench/economics_bench.py --build "$build"
}

# The HTTP edge (issue 40): a cached hit beside 200 slow-body connections,
# RSS under two 600 MiB chunked uploads, scrapes beside slow POST /metrics,
# and Boost.Beast against libmicrohttpd (bench/http_edge_bench.py,
# bench/http_server_compare.cc; about 5 minutes on 2 cores). Writes
# http_edge.json; docs/SERVER.md, "HTTP edge", has the figures.
section_http_edge() {
  run cmake -S . -B "$build" -DEPD_BUILD_BENCH=ON
  run cmake --build "$build" --target epd-encode tiny_tower http_server_compare
  run "$py" bench/http_edge_bench.py --build "$build" --out "$results/http_edge.json"
}

# Preprocessing against the JPEG-decode floor (issue 42): DecodeAndPreprocess,
# its decode and its preprocess apart, Pillow + numpy, torchvision and
# TurboJPEG decode alone, one thread each, interleaved over four photographs
# per size, and DecodeAndPreprocess on 1 and 2 threads
# (bench/preprocess_bench.py; about 5 minutes on 2 cores). Writes
# preprocess.json and its copy docs/BENCHMARKS-preprocess.json.
section_preprocess() {
  run cmake -S . -B "$build" -DEPD_BUILD_BENCH=ON
  run cmake --build "$build" --target preprocess_bench
  run "$py" bench/preprocess_bench.py --build "$build" --out "$results/preprocess.json"
  run cp "$results/preprocess.json" docs/BENCHMARKS-preprocess.json
}

if [[ -z "${EPD_BENCH_REPORT_ONLY:-}" ]]; then
  for s in "${SECTIONS[@]}"; do
    if ! declare -F "section_$s" >/dev/null; then
      echo "bench.sh: unknown section '$s'" >&2
      exit 2
    fi
    commands=()
    start="$(date -u +%FT%TZ)"; load0="$(loadavg)"; t0="$(date +%s)"
    "section_$s"
    record "$s" "$start" "$load0" "$t0"
  done
fi

"$py" bench/report.py --results "$results" --build "$build" --out docs/BENCHMARKS.md --img docs/img

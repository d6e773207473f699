#!/bin/sh
# Runs the C++ checkpoint towers and the Python reference back to back on the
# tiny checkpoints and prints the side-by-side table of docs/BENCHMARKS.md
# ("Checkpoint towers: C++ against the Python reference").
#
#   bench/checkpoint_bench.sh [BUILD_DIR] [REPEATS]
#
# BUILD_DIR (default build) must hold the targets checkpoint_tower_bench and
# tiny_checkpoints. Order: C++ (1 and 2 threads), Python (1 thread), Python
# (2 threads), C++ again, so drift in the machine's load between the two sides
# shows as a difference between the two C++ runs. The JSON files and the load
# averages before and after each step go to BUILD_DIR/ckbench/.
set -eu
build=${1:-build}
repeats=${2:-21}
root=$(cd "$(dirname "$0")/.." && pwd)
out=$build/ckbench
mkdir -p "$out"
bench=$build/src/tower/checkpoint_tower_bench
python=/usr/bin/python3
log() { echo "$(date -u +%FT%TZ) $1 load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/load.txt"; }
: > "$out/load.txt"
log start
"$bench" --models "$build/models" --repeats "$repeats" --threads 1,2 --json "$out/cpp_a.json"
log "after C++ (first)"
for t in 1 2; do
  "$python" "$root/bench/checkpoint_reference_bench.py" --models "$build/models" --repeats "$repeats" \
      --threads "$t" --dtypes f32 --json "$out/py_t$t.json"
  log "after Python ($t thread(s))"
done
"$bench" --models "$build/models" --repeats "$repeats" --threads 1,2 --json "$out/cpp_b.json"
log "after C++ (second)"
echo
"$python" "$root/bench/checkpoint_compare.py" --cpp "$out/cpp_a.json" "$out/cpp_b.json" \
    --python "$out/py_t1.json" "$out/py_t2.json"

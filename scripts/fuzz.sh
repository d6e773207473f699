#!/usr/bin/env bash
# Runs every libFuzzer target of a fuzz build for a set time, from its seed
# corpus, and prints one summary line per target (docs/FUZZING.md).
#
# Usage: scripts/fuzz.sh BUILD_DIR [SECONDS_PER_TARGET]   (default 60)
# The targets and their corpora come from BUILD_DIR/CMakeCache.txt
# (EPD_FUZZ_TARGETS, fuzz/CMakeLists.txt). New inputs libFuzzer finds go to
# BUILD_DIR/fuzz-work/<target>/, so the repository's corpus stays as
# committed; a crash leaves its reproducer in BUILD_DIR/fuzz-work/ (add it to
# the corpus once fixed, so every `make test` replays it).
# Exit status: 0 when no target crashed.
set -euo pipefail

build="${1:?usage: scripts/fuzz.sh BUILD_DIR [SECONDS]}"
seconds="${2:-60}"
targets=$(sed -n 's/^EPD_FUZZ_TARGETS:INTERNAL=//p' "$build/CMakeCache.txt" | tr ';' ' ')
if [[ -z "${targets// /}" ]]; then
  echo "fuzz.sh: no fuzz targets in $build (configure it with -DEPD_WITH_FUZZ=ON and clang)" >&2
  exit 2
fi

failed=0
printf '%-16s %8s %12s %10s %8s %8s %8s\n' target seconds runs execs/s cov ft corpus
for entry in $targets; do
  name="${entry%%=*}"
  seeds="${entry#*=}"
  bin="$build/fuzz/$name"
  work="$build/fuzz-work/$name"
  mkdir -p "$work"
  log="$work.log"
  # -artifact_prefix keeps crash files beside the work corpus.
  if ! "$bin" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$work/" \
      "$work" "$seeds" >"$log" 2>&1; then
    failed=1
    echo "fuzz.sh: $name FAILED; see $log" >&2
  fi
  runs=$(sed -n 's/^Done \([0-9]*\) runs in.*/\1/p' "$log" | tail -1)
  secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
  execs=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<<"$last")
  printf '%-16s %8s %12s %10s %8s %8s %8s\n' "$name" "${secs:-?}" "${runs:-?}" "${execs:-?}" "${cov:-?}" \
    "${ft:-?}" "${corp:-?}"
done
exit $failed

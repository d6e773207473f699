#!/usr/bin/env bash
# Server benchmarks behind docs/BENCHMARKS-server.md: one `epd-encode serve`
# on loopback with the default tower, loaded by `epd-encode bench-server`.
# Each run appends one JSON line (with a "run" label) to OUT/results.jsonl.
#
# Usage: src/server/bench_server.sh [BUILD_DIR] [OUT_DIR] [MIXED_SECONDS]
#   defaults: build, BUILD_DIR/bench-server, 300
set -euo pipefail

build="${1:-build}"
out="${2:-$build/bench-server}"
mixed_s="${3:-300}"
bin="$build/tools/epd-encode"
mkdir -p "$out"
results="$out/results.jsonl"
: >"$results"

server_pid=""
port=""
stop_server() {
  if [[ -n "$server_pid" ]]; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
  fi
}
trap stop_server EXIT
trap "exit 1" TERM INT

# start_server PORT ARGS... : starts serve, waits for READY.
start_server() {
  port="$1"; shift
  "$bin" serve --host 127.0.0.1 --port "$port" "$@" >"$out/serve-$port.out" 2>"$out/serve-$port.err" &
  server_pid=$!
  for _ in $(seq 1 600); do
    grep -q '^READY ' "$out/serve-$port.out" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "server on $port did not start" >&2
  exit 1
}

rss_mb() { awk '/^VmRSS:/ { printf "%.1f", $2 / 1024 }' "/proc/$1/status"; }

# run LABEL BENCH_ARGS... : one bench-server run, labelled, appended.
run() {
  local label="$1"; shift
  local line
  line="$("$bin" bench-server --json --server "127.0.0.1:$port" --server-pid "$server_pid" "$@")" || true
  echo "{\"run\": \"$label\", \"load_avg\": \"$(cut -d' ' -f1-3 /proc/loadavg)\", \"result\": $line}" | tee -a "$results"
}

# 1. Hit-only, 512x512 JPEG, float32 (2.0 MB per response).
start_server 50251 --threads 2 --cache-mb 1024 --host-cache-mb 1024
echo "{\"run\": \"idle_rss_f32\", \"rss_mb\": $(rss_mb "$server_pid")}" | tee -a "$results"
run hit_f32_c1 --hit-only --synthetic 32 --concurrency 1 --duration-s 10
run hit_f32_c8 --hit-only --synthetic 32 --concurrency 8 --duration-s 15
run hit_f32_open500 --hit-only --synthetic 32 --concurrency 32 --rate 500 --duration-s 20
run hit_f32_open200 --hit-only --synthetic 32 --concurrency 32 --rate 200 --duration-s 20
# Server overhead with a small embedding (112x112: 16 tokens, 96 KiB).
run hit_small_c1 --hit-only --synthetic 32 --image-size 112 --concurrency 1 --duration-s 10
run hit_small_open500 --hit-only --synthetic 32 --image-size 112 --concurrency 32 --rate 500 --duration-s 20
stop_server

# 2. Hit-only, bfloat16 (1.0 MB per response).
start_server 50252 --threads 2 --dtype bfloat16 --cache-mb 1024 --host-cache-mb 1024
run hit_bf16_c1 --hit-only --synthetic 32 --concurrency 1 --duration-s 10
run hit_bf16_open500 --hit-only --synthetic 32 --concurrency 32 --rate 500 --duration-s 20
stop_server

# 3. Mixed: Zipf(1.0) over 300 distinct 512x512 images, open loop at 3 req/s,
#    caches smaller than the set (64 MB L1 + 128 MB L2 = ~96 embeddings of
#    2 MB), so entries are demoted, promoted and evicted; the queue is bounded
#    (--max-queue 32: each queued miss holds ~6 MB of patches); RSS sampled.
start_server 50253 --threads 2 --cache-mb 64 --host-cache-mb 128 --max-queue 32
echo "{\"run\": \"idle_rss_mixed\", \"rss_mb\": $(rss_mb "$server_pid")}" | tee -a "$results"
run mixed_zipf1_rate3 --zipf 1.0 --synthetic 300 --rate 3 --concurrency 64 --duration-s "$mixed_s" --timeout-s 60
echo "{\"run\": \"after_rss_mixed\", \"rss_mb\": $(rss_mb "$server_pid")}" | tee -a "$results"
stop_server

#!/usr/bin/env bash
# Payload-path benchmark behind docs/BENCHMARKS-server.md ("Shared memory and
# Unix sockets"): one `epd-encode serve` (default tower, float32, 512x512
# images, so 2.0 MB per hit) with a TCP port, a Unix socket and a 256 MiB
# shared-memory arena, loaded hit-only by `epd-encode bench-server` on the
# same machine, three ways: inline over TCP, inline over the Unix socket, and
# shared memory (over the Unix socket). Closed loop at 1, 8 and 32 callers,
# open loop at 500 and 2000 req/s. Every caller reads every row it receives
# (bench_server_command.cc), whichever the delivery.
#
# Usage: src/server/bench_shm.sh [BUILD_DIR] [OUT_DIR] [SECONDS_PER_RUN]
#   defaults: build, BUILD_DIR/bench-shm, 8
set -euo pipefail
build="${1:-build}"
out="${2:-$build/bench-shm}"
secs="${3:-8}"
bin="$build/tools/epd-encode"
mkdir -p "$out"
results="$out/results.jsonl"
: >"$results"
sock="$out/epd.sock"
rm -f "$sock"
port=50261

"$bin" serve --host 127.0.0.1 --port "$port" --listen "unix:$sock" --threads 2 --cache-mb 1024 \
  --host-cache-mb 1024 --shm-arena-mb 256 --shm-lease-ms 5000 >"$out/serve.out" 2>"$out/serve.err" &
server_pid=$!
trap 'kill -TERM "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; rm -f "$sock"' EXIT
for _ in $(seq 1 600); do
  grep -q '^READY ' "$out/serve.out" 2>/dev/null && break
  sleep 0.1
done
grep -q '^READY ' "$out/serve.out" || { echo "server did not start" >&2; cat "$out/serve.err" >&2; exit 1; }

# run LABEL TARGET BENCH_ARGS...
run() {
  local label="$1" target="$2"; shift 2
  local line
  line="$("$bin" bench-server --json --server "$target" --server-pid "$server_pid" --hit-only --synthetic 32 \
          --duration-s "$secs" "$@")" || true
  echo "{\"run\": \"$label\", \"load_avg\": \"$(cut -d' ' -f1-3 /proc/loadavg)\", \"result\": $line}" | tee -a "$results"
}

for mode in tcp uds shm; do
  case "$mode" in
    tcp) target="127.0.0.1:$port"; extra=() ;;
    uds) target="unix:$sock"; extra=() ;;
    shm) target="unix:$sock"; extra=(--shm) ;;
  esac
  for c in 1 8 32; do run "${mode}_c$c" "$target" --concurrency "$c" "${extra[@]}"; done
  for r in 500 2000; do run "${mode}_open$r" "$target" --concurrency 32 --rate "$r" "${extra[@]}"; done
done

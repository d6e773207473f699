#!/usr/bin/env bash
# Runs N epd-encode servers on loopback behind nginx (hash affinity on the
# x-epd-route header), all state under one directory; never touches the
# system nginx configuration, pid or logs.
#
# Usage:
#   deploy/nginx/run-local.sh start [options] [-- SERVE_ARGS...]
#       --dir DIR          state directory [${TMPDIR:-/tmp}/epd-local]
#       --servers N        encoders [3]
#       --base-port P      encoder i listens on P+i (i = 0..N-1) [50061]
#       --front-port P     nginx affinity front [50050]
#       --rr-port P        nginx round-robin front, for comparisons [50049]
#       SERVE_ARGS         passed to every `epd-encode serve` (e.g. --threads 1)
#   deploy/nginx/run-local.sh stop-server I [--dir DIR]    SIGTERM encoder I, wait
#   deploy/nginx/run-local.sh start-server I [--dir DIR]   start encoder I again
#   deploy/nginx/run-local.sh stop [--dir DIR]             stop everything
#   deploy/nginx/run-local.sh status [--dir DIR]
#
# The binary is $EPD_ENCODE_BIN, else build/tools/epd-encode. Encoder i has
# server id "encoder-i" (reported in every EncodedItem) and logs to
# DIR/logs/server-i.log. `start` returns once every encoder printed READY and
# nginx answers.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
bin="${EPD_ENCODE_BIN:-$repo/build/tools/epd-encode}"
nginx_bin="${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}"

cmd="${1:-}"
[[ -n "$cmd" ]] && shift
dir="${TMPDIR:-/tmp}/epd-local"
servers=3
base_port=50061
front_port=50050
rr_port=50049
index=""
serve_args=()

while (($#)); do
  case "$1" in
    --dir) dir="$2"; shift 2 ;;
    --servers) servers="$2"; shift 2 ;;
    --base-port) base_port="$2"; shift 2 ;;
    --front-port) front_port="$2"; shift 2 ;;
    --rr-port) rr_port="$2"; shift 2 ;;
    --) shift; serve_args=("$@"); break ;;
    [0-9]*) index="$1"; shift ;;
    *) echo "run-local.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done

die() { echo "run-local.sh: $*" >&2; exit 1; }

start_server() {
  local i="$1"
  local port; port="$(cat "$dir/port-$i")"
  local log="$dir/logs/server-$i.log"
  : >"$log"
  # shellcheck disable=SC2046
  "$bin" serve --host 127.0.0.1 --port "$port" --server-id "encoder-$i" $(cat "$dir/serve-args") \
    >>"$log" 2>&1 &
  echo $! >"$dir/server-$i.pid"
}

wait_ready() {
  local i="$1"
  local log="$dir/logs/server-$i.log"
  for _ in $(seq 1 600); do
    grep -q '^READY ' "$log" 2>/dev/null && return 0
    if ! kill -0 "$(cat "$dir/server-$i.pid")" 2>/dev/null; then
      cat "$log" >&2
      die "encoder $i exited during startup (log above)"
    fi
    sleep 0.1
  done
  die "encoder $i not ready after 60 s (see $log)"
}

stop_pid_file() {
  local f="$1"
  [[ -f "$f" ]] || return 0
  local pid; pid="$(cat "$f")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  fi
  rm -f "$f"
}

case "$cmd" in
  start)
    [[ -x "$bin" ]] || die "no epd-encode binary at $bin (build it, or set EPD_ENCODE_BIN)"
    [[ -e "$dir/nginx.pid" ]] && die "$dir already runs a deployment; stop it first"
    mkdir -p "$dir/logs" "$dir/tmp"
    printf '%s ' "${serve_args[@]}" >"$dir/serve-args"
    upstreams=""
    for ((i = 0; i < servers; i++)); do
      echo $((base_port + i)) >"$dir/port-$i"
      upstreams+="    server 127.0.0.1:$((base_port + i)) max_fails=1 fail_timeout=10s;"$'\n'
    done
    echo "$servers" >"$dir/servers"
    user_line=""
    [[ $(id -u) -eq 0 ]] && user_line="user root root;"
    # The upstream lines go in through a file: sed cannot take newlines in a
    # replacement portably.
    printf '%s' "$upstreams" >"$dir/upstreams"
    sed -e "s|@RUN_DIR@|$dir|g" -e "s|@USER_LINE@|$user_line|" -e "s|@FRONT_PORT@|$front_port|" \
        -e "s|@RR_PORT@|$rr_port|" "$here/nginx.conf.template" |
      awk -v f="$dir/upstreams" '/^@SERVERS@$/ { while ((getline l < f) > 0) print l; close(f); next } { print }' \
        >"$dir/nginx.conf"
    for ((i = 0; i < servers; i++)); do start_server "$i"; done
    for ((i = 0; i < servers; i++)); do wait_ready "$i"; done
    "$nginx_bin" -p "$dir" -c "$dir/nginx.conf" -e "$dir/logs/error.log" -t -q || die "nginx rejected $dir/nginx.conf"
    "$nginx_bin" -p "$dir" -c "$dir/nginx.conf" -e "$dir/logs/error.log"
    for _ in $(seq 1 100); do [[ -s "$dir/nginx.pid" ]] && break; sleep 0.05; done
    echo "front 127.0.0.1:$front_port (affinity), 127.0.0.1:$rr_port (round robin); $servers encoders from port $base_port; state in $dir"
    ;;
  stop-server)
    [[ -n "$index" ]] || die "stop-server needs an encoder index"
    stop_pid_file "$dir/server-$index.pid"
    ;;
  start-server)
    [[ -n "$index" ]] || die "start-server needs an encoder index"
    [[ -f "$dir/port-$index" ]] || die "no encoder $index in $dir"
    start_server "$index"
    wait_ready "$index"
    ;;
  stop)
    if [[ -f "$dir/nginx.pid" ]]; then
      "$nginx_bin" -p "$dir" -c "$dir/nginx.conf" -e "$dir/logs/error.log" -s quit 2>/dev/null || true
      for _ in $(seq 1 100); do [[ -f "$dir/nginx.pid" ]] || break; sleep 0.05; done
      stop_pid_file "$dir/nginx.pid"
    fi
    for f in "$dir"/server-*.pid; do [[ -e "$f" ]] && stop_pid_file "$f"; done
    true
    ;;
  status)
    n="$(cat "$dir/servers" 2>/dev/null || echo 0)"
    for ((i = 0; i < n; i++)); do
      state=stopped
      [[ -f "$dir/server-$i.pid" ]] && kill -0 "$(cat "$dir/server-$i.pid")" 2>/dev/null && state=running
      echo "encoder-$i 127.0.0.1:$(cat "$dir/port-$i") $state"
    done
    if [[ -f "$dir/nginx.pid" ]] && kill -0 "$(cat "$dir/nginx.pid")" 2>/dev/null; then echo "nginx running"; else echo "nginx stopped"; fi
    ;;
  *)
    sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac

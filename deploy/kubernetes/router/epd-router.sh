#!/bin/sh
# The routing tier's entry point (image target "router", deploy/oci/Containerfile):
# nginx with content-key affinity over the encoders that exist right now.
#
# nginx hashes each call's x-epd-route header (the content key, set by the
# C++ and Python clients) onto a consistent ring (`hash ... consistent`), as
# deploy/nginx/nginx.conf.template does on one host. Debian's nginx 1.22
# resolves an upstream's server names only when it loads its configuration
# (re-resolving them, `server ... resolve`, is not in the open-source nginx
# of Debian 12), and a variable in grpc_pass would pick one address without
# the ring. So this script re-resolves the encoders' headless Service every
# EPD_REFRESH_S seconds, rewrites the upstream when the set of addresses
# changed and reloads nginx gracefully (calls in flight finish on the old
# workers). A key moves only when the server that owned it comes or goes.
#
# Environment:
#   EPD_ENCODERS     DNS name whose A records are the encoders (a headless
#                    Service: epd-encoder-headless.<namespace>.svc.cluster.local)
#   EPD_ENCODER_PORT the encoders' gRPC port [50051]
#   EPD_ROUTER_PORT  the port clients call (HTTP/2 cleartext, gRPC) [8080]
#   EPD_HEALTH_PORT  plain HTTP port answering GET /healthz [8081]
#   EPD_REFRESH_S    seconds between resolutions [5]
#   EPD_RUN_DIR      configuration, pid and temp files [/tmp/epd-router]
set -eu

encoders="${EPD_ENCODERS:?EPD_ENCODERS must name the encoders (a headless Service DNS name)}"
port="${EPD_ENCODER_PORT:-50051}"
router_port="${EPD_ROUTER_PORT:-8080}"
health_port="${EPD_HEALTH_PORT:-8081}"
refresh="${EPD_REFRESH_S:-5}"
run="${EPD_RUN_DIR:-/tmp/epd-router}"
mkdir -p "$run/tmp"

servers() {  # one "server ADDR:PORT" line per address, sorted, or a placeholder
  addrs=$(getent ahostsv4 "$encoders" 2>/dev/null | awk '{print $1}' | sort -u)
  if [ -z "$addrs" ]; then
    echo "    server 127.0.0.1:1 down;  # no encoder resolved yet"
    return
  fi
  for a in $addrs; do echo "    server $a:$port max_fails=1 fail_timeout=5s;"; done
}

render() {  # writes $run/nginx.conf for the server lines in $1
  cat >"$run/nginx.conf.new" <<CONF
worker_processes 1;
pid $run/nginx.pid;
error_log stderr warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $run/tmp/body;
  proxy_temp_path $run/tmp/proxy;
  fastcgi_temp_path $run/tmp/fastcgi;
  uwsgi_temp_path $run/tmp/uwsgi;
  scgi_temp_path $run/tmp/scgi;
  client_max_body_size 64m;
  keepalive_requests 1000000;
  upstream epd_encoders {
    hash \$http_x_epd_route consistent;
$1
    keepalive 64;
  }
  server {
    listen $router_port http2;
    location / {
      grpc_pass grpc://epd_encoders;
      grpc_next_upstream error timeout non_idempotent;
      grpc_next_upstream_tries 3;
      grpc_connect_timeout 2s;
      grpc_read_timeout 300s;
      grpc_send_timeout 300s;
    }
  }
  server {
    listen $health_port;
    location = /healthz { return 200 "ok\n"; }
  }
}
CONF
  mv "$run/nginx.conf.new" "$run/nginx.conf"
}

current=$(servers)
render "$current"
nginx -e stderr -c "$run/nginx.conf" -g 'daemon off;' &
nginx_pid=$!
echo "epd-router: nginx on :$router_port over $(echo "$current" | grep -c 'server ') address(es) of $encoders" >&2

# SIGTERM: stop resolving, let nginx finish the calls in flight (QUIT).
trap 'kill -QUIT $nginx_pid 2>/dev/null; wait $nginx_pid; exit 0' TERM INT
while kill -0 "$nginx_pid" 2>/dev/null; do
  sleep "$refresh" &
  wait $! || true
  next=$(servers)
  if [ "$next" != "$current" ]; then
    current="$next"
    render "$current"
    kill -HUP "$nginx_pid"
    echo "epd-router: encoders now: $(echo "$current" | awk '{print $2}' | tr '\n' ' ')" >&2
  fi
done
wait "$nginx_pid"

#!/usr/bin/env bash
# Installs the Debian packages epd-encode needs, skipping those already present.
# Idempotent: a second run installs nothing and makes no network call.
#
# Usage: scripts/install-deps.sh [build|bench|all]   (default: build)
#   build  what `make demo` and `make test` need (compilers, libraries, torch, gRPC, nginx, Redis, fuzzer)
#   bench  build, plus the peer caches and plotting used by `make bench`
set -euo pipefail

group="${1:-build}"

build_pkgs=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-dev pybind11-dev python3-pytest python3-numpy python3-pil python3-skimage
  libtorch-dev libopenblas0-openmp python3-torch
  libssl-dev libjpeg62-turbo-dev libturbojpeg0-dev libpng-dev libstb-dev libxxhash-dev
  libwebp-dev libgif-dev libjpeg-turbo-progs
  libavformat-dev libavcodec-dev libswscale-dev libavutil-dev ffmpeg
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libgrpc++-dev libabsl-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  python3-grpcio python3-protobuf prometheus-cpp-dev nginx curl openssl
  libhiredis-dev redis-server stunnel4 python3-xxhash python3-cryptography
  libcpp-httplib-dev libcurl4-openssl-dev libsimdjson-dev
  clang libclang-rt-14-dev clang-format clang-tidy
)
bench_pkgs=(libleveldb-dev librocksdb-dev python3-pil gnuplot-nox)

case "$group" in
  build) pkgs=("${build_pkgs[@]}") ;;
  bench|all) pkgs=("${build_pkgs[@]}" "${bench_pkgs[@]}") ;;
  *) echo "install-deps.sh: unknown group '$group' (expected build, bench or all)" >&2; exit 2 ;;
esac

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "install-deps.sh: installing ${#missing[@]} missing package(s): ${missing[*]}" >&2
sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

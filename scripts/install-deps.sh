#!/usr/bin/env bash
# Installs the Debian packages epd-encode needs, skipping those already present.
# Idempotent: a second run installs nothing and makes no network call.
#
# Usage: scripts/install-deps.sh [demo|build|image|bench|all]   (default: build)
#   demo   what configuring the build and `make demo` need: compilers, the libraries every target links
#          (libtorch, gRPC, FFmpeg, ...), numpy and Pillow for the default model and the demo's images,
#          and ffmpeg for its video. A new machine installs about 80 MB less than `build` and almost no
#          Python, whose byte-compiling was a third of apt's time there (README, "First minutes").
#   build  demo, plus what `make test` needs beyond it: torch in Python (the scripted towers and the
#          reference models), scikit-image, pytest, the Python gRPC client's packages, Redis, stunnel,
#          nginx, clang with its format and tidy tools, and gnuplot (plan --plot's quoting is tested)
#   image  what `make image` and the ctests of deploy/ (docs/DEPLOY.md) need: podman with runc and
#          catatonit, mmdebstrap, the Kubernetes Python client and kubectl (Debian's kubernetes-client,
#          unless a kubectl is on PATH already: the two packages both own /usr/bin/kubectl); in build too
#   bench  build, plus the peer caches used by `make bench`, libmicrohttpd, the HTTP edge's
#          comparison peer (bench/http_server_compare.cc), and torchvision, the preprocessing
#          benchmark's fast-processor peer (bench/preprocess_bench.py)
set -euo pipefail

group="${1:-build}"

demo_pkgs=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-dev pybind11-dev python3-numpy python3-pil
  libtorch-dev libopenblas0-openmp
  libssl-dev libjpeg62-turbo-dev libturbojpeg0-dev libpng-dev libstb-dev libxxhash-dev
  libwebp-dev libgif-dev
  libavformat-dev libavcodec-dev libswscale-dev libavutil-dev ffmpeg
  nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev
  libgrpc++-dev libabsl-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  prometheus-cpp-dev openssl libhiredis-dev
  libcpp-httplib-dev libboost-dev libcurl4-openssl-dev libsimdjson-dev
)
test_pkgs=(
  python3-torch python3-skimage python3-pytest python3-grpcio python3-protobuf python3-xxhash python3-cryptography
  libjpeg-turbo-progs nginx curl redis-server stunnel4
  clang libclang-rt-14-dev clang-format clang-tidy gnuplot-nox
)
image_pkgs=(podman runc catatonit conmon uidmap slirp4netns fuse-overlayfs containernetworking-plugins mmdebstrap
  python3-kubernetes python3-yaml)
command -v kubectl >/dev/null || image_pkgs+=(kubernetes-client)
bench_pkgs=(libleveldb-dev librocksdb-dev libmicrohttpd-dev python3-torchvision)

case "$group" in
  demo) pkgs=("${demo_pkgs[@]}") ;;
  build) pkgs=("${demo_pkgs[@]}" "${test_pkgs[@]}" "${image_pkgs[@]}") ;;
  image) pkgs=("${image_pkgs[@]}") ;;
  bench|all) pkgs=("${demo_pkgs[@]}" "${test_pkgs[@]}" "${image_pkgs[@]}" "${bench_pkgs[@]}") ;;
  *) echo "install-deps.sh: unknown group '$group' (expected demo, build, image, bench or all)" >&2; exit 2 ;;
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

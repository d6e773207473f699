#!/usr/bin/env bash
# Builds epd-encode's OCI images with podman from deploy/oci/Containerfile,
# on a Debian 12 base made by scripts/oci-base.sh (mmdebstrap, no registry):
#   localhost/epd-encode:<version>   the encoder (<version>: project(VERSION) in CMakeLists.txt)
#   localhost/epd-router:<version>   the routing tier (deploy/kubernetes/router/epd-router.sh)
#   localhost/epd-redis:<version>    the trial overlay's in-cluster Redis
#
# Usage:
#   scripts/image.sh full [BUILD_DIR]       `make image`: the two-stage build, compiling in
#                                           the builder stage; BUILD_DIR (build) holds the base tarball
#   scripts/image.sh prebuilt BUILD_DIR     packages BUILD_DIR's already built epd-encode and default
#                                           model (cmake --install --component cli) into the runtime
#                                           stage, without compiling (the ctest oci_k8s_test)
# Environment: CONTAINERS_CONF (default deploy/oci/containers.conf), IMAGE_TARGETS
#   (default "runtime router redis"; the encoder's target is runtime or runtime-prebuilt).
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mode="${1:-full}"
build="${2:-build}"
case "$mode" in
  full|prebuilt) ;;
  *) echo "image.sh: unknown mode '$mode' (expected full or prebuilt)" >&2; exit 2 ;;
esac
for tool in podman mmdebstrap; do
  command -v "$tool" >/dev/null || { echo "image.sh: $tool not found; run scripts/install-deps.sh image" >&2; exit 2; }
done
export CONTAINERS_CONF="${CONTAINERS_CONF:-$repo/deploy/oci/containers.conf}"
version="$(sed -n 's/^project(epd_encode VERSION \([0-9.]*\).*/\1/p' "$repo/CMakeLists.txt")"
[[ -n "$version" ]] || { echo "image.sh: no project(epd_encode VERSION ...) in CMakeLists.txt" >&2; exit 2; }

"$repo/scripts/oci-base.sh" "$build/oci"

# --format docker: the OCI image configuration has no field for HEALTHCHECK,
# and podman drops it from an OCI-format image (with a warning).
common=(--file "$repo/deploy/oci/Containerfile" --ignorefile "$repo/deploy/oci/containerignore"
        --format docker --network host --layers)
encoder_args=()
if [[ "$mode" == prebuilt ]]; then
  [[ -x "$build/tools/epd-encode" ]] || { echo "image.sh: $build/tools/epd-encode not built" >&2; exit 2; }
  tree="$build/oci/prebuilt"
  rm -rf "$tree"
  cmake --install "$build" --prefix "$tree" --component cli --strip >/dev/null
  rm -f "$tree"/share/epd/models/*.pt  # the scripted towers: the image runs the default checkpoint
  encoder_args=(--target runtime-prebuilt --build-context "prebuilt=$tree")
fi

for target in ${IMAGE_TARGETS:-runtime router redis}; do
  start=$(date +%s)
  case "$target" in
    runtime) name=epd-encode; args=("${encoder_args[@]}") ;;
    *) name="epd-$target"; args=(--target "$target") ;;
  esac
  podman build "${common[@]}" "${args[@]}" --tag "localhost/$name:$version" "$repo" >&2
  size=$(podman image inspect --format '{{.Size}}' "localhost/$name:$version")
  echo "image.sh: localhost/$name:$version, $((size / 1000000)) MB, built in $(($(date +%s) - start)) s" >&2
done

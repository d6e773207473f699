#!/usr/bin/env bash
# Makes the Debian 12 root file system every stage of the epd-encode image
# starts from (deploy/oci/Containerfile), with mmdebstrap from the apt
# sources this machine is configured with, and imports it into podman as
# localhost/epd-debian:bookworm. Nothing is pulled from a registry.
#
# The tarball is cached: a second run reuses OUT_DIR/debian-bookworm.tar
# (delete it to refresh the base) and only imports it when podman lacks the
# image. docs/DEPLOY.md says how long each step took here.
#
# Usage: scripts/oci-base.sh OUT_DIR
# Environment: CONTAINERS_CONF (deploy/oci/containers.conf is what
#   scripts/image.sh passes), OCI_BASE_IMAGE (default localhost/epd-debian:bookworm).
set -euo pipefail

out="${1:?usage: scripts/oci-base.sh OUT_DIR}"
image="${OCI_BASE_IMAGE:-localhost/epd-debian:bookworm}"
tarball="$out/debian-bookworm.tar"
mkdir -p "$out"

# The enabled apt sources of this machine, one-line or deb822 files alike;
# files renamed to anything else (e.g. *.disabled) are not apt's and are skipped.
sources=()
if [[ -s /etc/apt/sources.list ]] && grep -q '^[[:space:]]*deb' /etc/apt/sources.list; then
  sources+=(/etc/apt/sources.list)
fi
for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  [[ -f "$f" ]] && sources+=("$f")
done
if ((${#sources[@]} == 0)); then
  echo "oci-base.sh: no apt sources in /etc/apt/sources.list or /etc/apt/sources.list.d/" >&2
  exit 2
fi

if [[ ! -s "$tarball" ]]; then
  echo "oci-base.sh: mmdebstrap bookworm (minbase) from ${sources[*]} -> $tarball" >&2
  start=$(date +%s)
  # --skip=output/dev: podman import rejects device nodes; the runtime mounts its own /dev.
  mmdebstrap --quiet --format=tar --variant=minbase --include=ca-certificates \
    --skip=output/dev --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    bookworm "$tarball.part" "${sources[@]}"
  mv "$tarball.part" "$tarball"
  echo "oci-base.sh: mmdebstrap took $(($(date +%s) - start)) s" >&2
fi

if ! podman image exists "$image"; then
  podman import --quiet "$tarball" "$image" >/dev/null
  echo "oci-base.sh: imported $tarball as $image" >&2
fi

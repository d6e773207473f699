#!/usr/bin/env bash
# `make demo`: replays ~200 requests over real photographs through
# epd-encode with the default model (the small random Qwen2.5-VL checkpoint
# the build writes to <build>/models/default-qwen2_5_vl, read by the real
# checkpoint loader) and prints the summary.
#
# Photographs come from Debian's python3-skimage package, downloaded with
# `apt-get download` (no install, no root needed when the apt lists are
# present) and unpacked with `dpkg -x` into <build>/demo-data. Only images
# that scikit-image documents as public domain or CC0 are used (see
# docs/REPLAY.md). From each, a few crops and rescales are derived
# deterministically (python3-pil), so the trace has many distinct images and
# a realistic miss rate. A second run reuses everything under demo-data.
#
# The replay honours the trace's arrival times (--realtime, 15 requests/s,
# so later requests find earlier images cached) and gives L1 only 4 MB, so
# the summary shows every path: L1 hits, L2 hits (promotions), in-flight
# joins and misses.
#
# Usage: scripts/demo.sh [BUILD_DIR]   (default: build)
#        scripts/demo.sh --images-only DIR
#          only prepares the same images, into DIR (nothing is built or
#          replayed; the download and originals go to $DEMO_DATA, default
#          ${TMPDIR:-/tmp}/epd-demo-data). scripts/gpu-check.sh --stage uses it.
# Environment: DEMO_REQUESTS (200), DEMO_ZIPF (1.0), DEMO_SEED (42),
#              DEMO_RATE (15 requests/s), DEMO_CACHE_MB (4, L1),
#              DEMO_VARIANTS (6 derived images per photograph).
set -euo pipefail

images_only=0
if [[ "${1:-}" == "--images-only" ]]; then
  images_only=1
  images="${2:?usage: scripts/demo.sh --images-only DIR}"
  data="${DEMO_DATA:-${TMPDIR:-/tmp}/epd-demo-data}"
  build=""
else
  build="${1:-build}"
  data="$build/demo-data"
  images="$data/images"
fi
bin="$build/tools/epd-encode"
requests="${DEMO_REQUESTS:-200}"
zipf="${DEMO_ZIPF:-1.0}"
seed="${DEMO_SEED:-42}"
rate="${DEMO_RATE:-15}"
cache_mb="${DEMO_CACHE_MB:-4}"
variants="${DEMO_VARIANTS:-6}"
py=/usr/bin/python3
script_start=$(date +%s.%N)

if [[ $images_only == 0 && ! -x "$bin" ]]; then
  echo "demo.sh: $bin not found; run 'make build' first" >&2
  exit 1
fi

# Public-domain / CC0 photographs of scikit-image's data folder.
photos=(astronaut.png camera.png chelsea.png coffee.png rocket.jpg retina.jpg
        hubble_deep_field.jpg brick.png grass.png gravel.png clock_motion.png)

fetch_photos() {
  local debs="$data/debs" src="$data/originals"
  mkdir -p "$debs" "$src"
  if ! compgen -G "$debs/python3-skimage_*.deb" >/dev/null; then
    echo "demo.sh: downloading python3-skimage (photographs only, nothing is installed)" >&2
    if ! (cd "$debs" && apt-get download -qq python3-skimage 2>/dev/null); then
      local sudo=""
      [[ $(id -u) -ne 0 ]] && sudo="sudo"
      echo "demo.sh: apt-get download failed; refreshing the apt lists and retrying" >&2
      $sudo apt-get update -qq >/dev/null 2>&1 || true
      (cd "$debs" && apt-get download -qq python3-skimage 2>/dev/null) || return 1
    fi
  fi
  local tmp
  tmp=$(mktemp -d)
  dpkg -x "$(compgen -G "$debs/python3-skimage_*.deb" | head -n 1)" "$tmp"
  local dir
  dir=$(dirname "$(find "$tmp" -path '*/skimage/data/astronaut.png' | head -n 1)")
  for p in "${photos[@]}"; do cp "$dir/$p" "$src/"; done
  rm -rf "$tmp"
}

# Writes the originals plus $variants derived images each into $images.
derive_images() {
  "$py" - "$data/originals" "$images" "$variants" <<'EOF'
import os
import sys

from PIL import Image

src, dst, variants = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.makedirs(dst, exist_ok=True)
# Crop boxes as fractions of (width, height), and output sides (pixels).
boxes = [(0.0, 0.0, 0.7, 0.7), (0.3, 0.3, 1.0, 1.0), (0.1, 0.2, 0.9, 0.8), (0.0, 0.25, 1.0, 0.75),
         (0.25, 0.0, 0.75, 1.0), (0.15, 0.15, 0.85, 0.85), (0.0, 0.0, 1.0, 1.0), (0.4, 0.1, 0.95, 0.6)]
sides = [224, 280, 336, 392, 448, 504]
for k, name in enumerate(sorted(os.listdir(src))):
    stem, ext = os.path.splitext(name)
    with open(os.path.join(src, name), "rb") as f:
        data = f.read()
    with open(os.path.join(dst, name), "wb") as f:  # the original, byte for byte
        f.write(data)
    img = Image.open(os.path.join(src, name))
    img.load()
    w, h = img.size
    for v in range(variants):
        x0, y0, x1, y1 = boxes[(k + v) % len(boxes)]
        crop = img.crop((int(x0 * w), int(y0 * h), int(x1 * w), int(y1 * h)))
        side = sides[(2 * k + v) % len(sides)]
        scale = side / max(crop.size)
        out = crop.resize((max(28, round(crop.size[0] * scale)), max(28, round(crop.size[1] * scale))),
                          Image.BICUBIC)
        path = os.path.join(dst, f"{stem}_v{v}")
        if v % 2 == 0:
            out.save(path + ".jpg", quality=90)
        else:
            out.save(path + ".png", optimize=False)
EOF
}

# Offline fallback: synthetic images, so `make demo` still runs (with a warning).
synthetic_images() {
  "$py" - "$images" <<'EOF'
import os
import sys

from PIL import Image

dst = sys.argv[1]
os.makedirs(dst, exist_ok=True)
for k in range(60):
    w, h = 224 + 28 * (k % 6), 224 + 28 * ((k // 6) % 5)
    img = Image.new("RGB", (w, h))
    img.putdata([((x * (k + 3)) % 256, (y * (k + 5)) % 256, ((x + y) * 7 + k) % 256)
                 for y in range(h) for x in range(w)])
    img.save(os.path.join(dst, f"synthetic_{k:02d}.png"))
EOF
}

mkdir -p "$data"
marker="$images/.complete-v$variants"
if [[ ! -f "$marker" ]]; then
  rm -rf "$images"
  if fetch_photos; then
    derive_images
  else
    echo "demo.sh: WARNING: could not download python3-skimage; using synthetic images instead" >&2
    synthetic_images
  fi
  touch "$marker"
fi

count=$(find "$images" -maxdepth 1 -type f \( -name '*.jpg' -o -name '*.png' \) | wc -l)
if [[ $images_only == 1 ]]; then
  echo "demo: $count images in $images"
  exit 0
fi
echo "demo: $requests requests (Zipf $zipf, seed $seed, $rate/s) over $count images in $images"
start=$(date +%s.%N)
"$bin" replay --images "$images" --generate "$requests" --zipf "$zipf" --seed "$seed" \
  --realtime --rate "$rate" --cache-mb "$cache_mb" \
  --write-trace "$data/trace.jsonl" --out "$data/embeddings.safetensors"
end=$(date +%s.%N)
echo "demo: trace in $data/trace.jsonl, embeddings in $data/embeddings.safetensors (which image is which key: $data/embeddings.manifest.jsonl)"
"$py" -c "print('demo: replay %.1f s, whole demo %.1f s' % ($end - $start, $end - $script_start))"

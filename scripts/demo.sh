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
# The replay honours the trace's arrival times (--realtime, so later requests
# find earlier images cached) and gives L1 only 4 MB, so the summary shows
# every path: L1 hits, L2 hits (promotions), in-flight joins and misses.
# The arrival rate is one this machine serves: a first pass replays the same
# trace all at once (no output kept) and measures the tower's seconds; the
# rate then spreads that tower time over twice as long (at most 15/s), so
# the tower is busy about half of the replay and requests queue only behind
# the cold start's misses. DEMO_RATE=N sets it instead.
#
# One short video is made from two of the photographs with Debian's ffmpeg
# (a slow zoom over one, then a pan across another: 4 s, 10 fps, 448x448,
# H.264 in MP4, or MPEG-4 part 2 when this ffmpeg has no libx264), into
# $DEMO_VIDEOS (default <demo-data>/videos/pan.mp4). Without ffmpeg the demo
# runs without it (a warning).
#
# Usage: scripts/demo.sh [BUILD_DIR]   (default: build)
#        scripts/demo.sh --images-only DIR
#          only prepares the same images, into DIR (nothing is built or
#          replayed; the download and originals go to $DEMO_DATA, default
#          ${TMPDIR:-/tmp}/epd-demo-data). scripts/gpu-check.sh --stage uses it.
# Environment: DEMO_REQUESTS (200), DEMO_ZIPF (1.0), DEMO_SEED (42),
#              DEMO_VIDEOS (where pan.mp4 goes),
#              DEMO_RATE (requests/s; default: calibrated, see above),
#              DEMO_CACHE_MB (4, L1),
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
rate="${DEMO_RATE:-auto}"
cache_mb="${DEMO_CACHE_MB:-4}"
variants="${DEMO_VARIANTS:-6}"
videos="${DEMO_VIDEOS:-$data/videos}"
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

# The demo video: ~4 s at 10 fps, 448x448. Each photograph is cropped to a
# centred square and upscaled to 896x896 so the zoompan window moves
# smoothly; the first is zoomed into (1.0 -> 1.4), the second panned left to
# right at zoom 1.5; the two 20-frame clips are concatenated. Deterministic
# for a given ffmpeg build. Prints its path; returns non-zero without ffmpeg.
make_video() {
  local out="$videos/pan.mp4"
  [[ -s "$out" ]] && return 0
  command -v ffmpeg >/dev/null || return 1
  local a b codec
  if [[ -f "$data/originals/astronaut.png" && -f "$data/originals/coffee.png" ]]; then
    a="$data/originals/astronaut.png"
    b="$data/originals/coffee.png"
  else  # the synthetic fallback: any two images
    a=$(find "$images" -maxdepth 1 -name '*.png' | sort | sed -n 1p)
    b=$(find "$images" -maxdepth 1 -name '*.png' | sort | sed -n 2p)
  fi
  [[ -n "$a" && -n "$b" ]] || return 1
  local encoders
  encoders=$(ffmpeg -hide_banner -encoders 2>/dev/null || true)  # no grep -q under pipefail: SIGPIPE
  if [[ "$encoders" == *" libx264 "* ]]; then
    codec=(-c:v libx264 -preset medium -crf 23 -pix_fmt yuv420p)
  else
    codec=(-c:v mpeg4 -q:v 4 -pix_fmt yuv420p)
  fi
  mkdir -p "$videos"
  local square="crop='min(iw,ih)':'min(iw,ih)',scale=896:896,setsar=1"
  ffmpeg -v error -nostdin -y -i "$a" -i "$b" -filter_complex \
    "[0:v]$square,zoompan=z='1+0.4*on/19':x='iw/2-iw/zoom/2':y='ih/2-ih/zoom/2':d=20:s=448x448:fps=10[z];
     [1:v]$square,zoompan=z=1.5:x='(iw-iw/zoom)*on/19':y='ih/2-ih/zoom/2':d=20:s=448x448:fps=10[p];
     [z][p]concat=n=2:v=1:a=0,format=yuv420p[v]" \
    -map '[v]' -frames:v 40 -r 10 "${codec[@]}" -movflags +faststart "$out.tmp.mp4" &&
    mv "$out.tmp.mp4" "$out"
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

if make_video; then
  echo "demo: video in $videos/pan.mp4"
else
  echo "demo.sh: WARNING: ffmpeg missing or failed; no demo video" >&2
fi

count=$(find "$images" -maxdepth 1 -type f \( -name '*.jpg' -o -name '*.png' \) | wc -l)
if [[ $images_only == 1 ]]; then
  echo "demo: $count images in $images"
  exit 0
fi
# The calibration pass: the same trace, all at once; its tower seconds.
if [[ "$rate" == auto ]]; then
  tower_s=$("$bin" replay --images "$images" --generate "$requests" --zipf "$zipf" --seed "$seed" \
    --cache-mb "$cache_mb" --json 2>/dev/null | "$py" -c 'import json, sys; print(json.load(sys.stdin)["tower_s"])')
  rate=$("$py" -c "print(max(1, min(15, int(0.5 * $requests / max($tower_s, 1e-3)))))")
  echo "demo: calibrated: the trace's misses take ${tower_s} s of tower time here, so $rate requests/s keep the tower about half busy"
fi
echo "demo: $requests requests (Zipf $zipf, seed $seed, $rate/s) over $count images in $images"
start=$(date +%s.%N)
"$bin" replay --images "$images" --generate "$requests" --zipf "$zipf" --seed "$seed" \
  --realtime --rate "$rate" --cache-mb "$cache_mb" \
  --write-trace "$data/trace.jsonl" --out "$data/embeddings.safetensors"
end=$(date +%s.%N)
echo "demo: trace in $data/trace.jsonl, embeddings in $data/embeddings.safetensors (which image is which key: $data/embeddings.manifest.jsonl)"

# Videos (docs/VIDEO.md). pan.mp4 re-encoded losslessly (H.264 -qp 0, every
# frame a keyframe) and its first 2 s encoded the same way, so both decode to
# the same pixels; the trace sends the video, the same file again 4 s later
# (a whole-video hit, no decode) and the 2 s prefix (its first temporal chunk
# is the full video's first: a chunk hit).
if [[ -f "$videos/pan.mp4" ]] && command -v ffmpeg >/dev/null &&
  ffmpeg -y -loglevel error -i "$videos/pan.mp4" -c:v libx264 -preset ultrafast -qp 0 -g 1 \
    "$videos/pan_lossless.mp4" &&
  ffmpeg -y -loglevel error -i "$videos/pan.mp4" -frames:v 20 -c:v libx264 -preset ultrafast -qp 0 -g 1 \
    "$videos/pan_lossless_first2s.mp4"; then
  cat >"$data/video_trace.jsonl" <<EOT
{"id": "video-full", "arrival_ms": 0, "videos": ["pan_lossless.mp4"]}
{"id": "video-again", "arrival_ms": 4000, "videos": ["pan_lossless.mp4"]}
{"id": "video-prefix", "arrival_ms": 5000, "videos": ["pan_lossless_first2s.mp4"]}
EOT
  echo "demo: 3 video requests (a video, the same again, its first 2 s) from $data/video_trace.jsonl"
  "$bin" replay --trace "$data/video_trace.jsonl" --images "$videos" --realtime
fi
end=$(date +%s.%N)
"$py" -c "print('demo: replay %.1f s, whole demo %.1f s' % ($end - $start, $end - $script_start))"

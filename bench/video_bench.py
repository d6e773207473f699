#!/usr/bin/python3
"""Video chunk caching benchmark (docs/VIDEO.md "Caching", docs/BENCHMARKS.md).

Two traces of overlapping clips cut from one stream, replayed through
`epd-encode replay` with the default model:
  sliding   clips of --window frames starting every --step frames;
  prefixes  a growing live stream: its first --step*2, --step*4, ... frames.
Each trace runs three ways, and the report puts their tower time (seconds
inside VisionTower::Encode, replay's tower_s) side by side:
  chunks    chunk caching (the default);
  whole     --no-video-chunk-cache: each clip encoded and cached whole;
  limit     the whole stream once as one video through the chunk path, i.e.
            every distinct chunk encoded exactly once (no clip can need less).
Target: chunks within 1.15x of limit.

The stream: --frames frames of a pan across a photograph (the demo's
astronaut.png when present, else a synthetic gradient), 336x252, at 2 fps.
Each clip is encoded by Debian's ffmpeg as lossless H.264 (-qp 0, yuv444p),
so equal source frames decode to equal pixels in every clip, and 2 fps
sampling of a 2 fps clip takes every frame: a clip starting at an even
frame shares its chunks with the stream exactly.

Usage: bench/video_bench.py [--build build] [--repeats 3] [--out-md docs/BENCHMARKS-video.md]
Writes the markdown section and a JSON copy next to it (docs/BENCHMARKS-video.json).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time


def make_frames(dst, n, photo):
    from PIL import Image

    w, h = 336, 252
    if photo and os.path.isfile(photo):
        src = Image.open(photo).convert("RGB")
        src = src.resize((w * 2, h * 2), Image.BICUBIC)
    else:
        src = Image.new("RGB", (w * 2, h * 2))
        src.putdata([((x * 3) % 256, (y * 5) % 256, ((x + y) * 2) % 256) for y in range(h * 2) for x in range(w * 2)])
    step = max(1, (src.size[0] - w) // max(1, n - 1))
    for i in range(n):
        x = min(i * step, src.size[0] - w)
        y = (i * 3) % (src.size[1] - h)
        src.crop((x, y, x + w, y + h)).save(os.path.join(dst, f"frame_{i:04d}.png"))


def encode_clip(ffmpeg, frames_dir, start, count, out):
    subprocess.run([ffmpeg, "-y", "-loglevel", "error", "-framerate", "2", "-start_number", str(start),
                    "-i", os.path.join(frames_dir, "frame_%04d.png"), "-frames:v", str(count),
                    "-c:v", "libx264", "-preset", "ultrafast", "-qp", "0", "-pix_fmt", "yuv444p", out], check=True)


def replay(binary, trace, extra):
    cmd = [binary, "replay", "--trace", trace, "--json", "--threads", "1"] + extra
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1]), " ".join(cmd)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--frames", type=int, default=48)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--step", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ffmpeg", default="/usr/bin/ffmpeg")
    ap.add_argument("--out-md", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                    "docs", "BENCHMARKS-video.md"))
    args = ap.parse_args()
    if args.step % 2 or args.window % 2:
        sys.exit("--step and --window must be even (temporal patch 2)")
    binary = os.path.join(args.build, "tools", "epd-encode")
    photo = os.path.join(args.build, "demo-data", "originals", "astronaut.png")
    work = tempfile.mkdtemp(prefix="epd-video-bench-")
    frames_dir = os.path.join(work, "frames")
    os.makedirs(frames_dir)
    make_frames(frames_dir, args.frames, photo)

    def clip(start, count):
        path = os.path.join(work, f"clip_{start:04d}_{count:04d}.mp4")
        if not os.path.exists(path):
            encode_clip(args.ffmpeg, frames_dir, start, count, path)
        return path

    traces = {
        "sliding": [(s, args.window) for s in range(0, args.frames - args.window + 1, args.step)],
        "prefixes": [(0, n) for n in range(2 * args.step, args.frames + 1, 2 * args.step)],
    }
    full = clip(0, args.frames)
    results = {"frames": args.frames, "window": args.window, "step": args.step, "repeats": args.repeats,
               "photo": os.path.basename(photo) if os.path.isfile(photo) else "synthetic", "traces": {},
               "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "loadavg": open("/proc/loadavg").read().split()[:3]}
    commands = []
    for name, clips in traces.items():
        trace = os.path.join(work, f"{name}.jsonl")
        with open(trace, "w") as f:
            for k, (s, n) in enumerate(clips):
                f.write(json.dumps({"id": f"{name}-{k}", "videos": [clip(s, n)]}) + "\n")
        limit_trace = os.path.join(work, "limit.jsonl")
        with open(limit_trace, "w") as f:
            f.write(json.dumps({"id": "stream", "videos": [full]}) + "\n")
        row = {"clips": len(clips), "clip_chunks": sum(n // 2 for _, n in clips),
               "distinct_chunks": len({c for s, n in clips for c in range(s // 2, (s + n) // 2)})}
        modes = (("chunks", trace, []), ("whole", trace, ["--no-video-chunk-cache"]), ("limit", limit_trace, []))
        all_runs = {mode: [] for mode, _, _ in modes}
        # Modes interleaved within each repeat, so a load change on the shared
        # machine hits all three alike.
        for _ in range(args.repeats):
            for mode, tr, extra in modes:
                j, cmd = replay(binary, tr, extra)
                all_runs[mode].append(j)
                if cmd not in commands:
                    commands.append(cmd)
        for mode, _, _ in modes:
            runs = all_runs[mode]
            row[mode] = {"tower_s": min(r["tower_s"] for r in runs),
                         "tower_s_median": statistics.median(r["tower_s"] for r in runs),
                         "tower_s_runs": [r["tower_s"] for r in runs],
                         "tower_items": runs[0]["tower_items"], "tower_tokens": runs[0]["tower_tokens"],
                         "tower_batches": [r["tower_batches"] for r in runs],
                         "chunk_hits": runs[0].get("chunk_hits", 0), "chunk_joins": runs[0].get("chunk_joins", 0),
                         "chunk_misses": runs[0].get("chunk_misses", 0), "failed_items": runs[0]["failed_items"]}
        row["chunks_over_limit"] = row["chunks"]["tower_s"] / row["limit"]["tower_s"]
        row["whole_over_limit"] = row["whole"]["tower_s"] / row["limit"]["tower_s"]
        results["traces"][name] = row
    results["commands"] = commands
    write(results, args.out_md)
    print(open(args.out_md).read())


def write(r, out_md):
    with open(os.path.splitext(out_md)[0] + ".json", "w") as f:
        json.dump(r, f, indent=2)
    lines = ["## Video: chunk caching on overlapping clips", "",
             f"Measured {r['measured']} (load average {' '.join(r['loadavg'])}) by `bench/video_bench.py` "
             f"(`make bench`, section `video`): a {r['frames']}-frame stream at 2 fps (a pan over "
             f"{r['photo']}, 336x252, lossless H.264), clips of {r['window']} frames every {r['step']} frames "
             f"(sliding) and prefixes growing by {2 * r['step']} frames (prefixes), replayed with the default "
             f"model, 1 tower thread. Tower time is the least of {r['repeats']} runs of replay's `tower_s` (the machine is shared: the "
             "least-disturbed run; medians in the second table). "
             "*limit* encodes the whole stream once (every distinct chunk once); *whole* is "
             "`--no-video-chunk-cache` (each clip encoded and cached whole, as engines do).", "",
             "| trace | clips | chunks in clips | distinct chunks | tower s, chunk caching | tower s, whole-video only "
             "| tower s, limit | chunks / limit | whole / limit | target (chunks <= 1.15x limit) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, t in r["traces"].items():
        met = "met" if t["chunks_over_limit"] <= 1.15 else "NOT met"
        lines.append(f"| {name} | {t['clips']} | {t['clip_chunks']} | {t['distinct_chunks']} | "
                     f"{t['chunks']['tower_s']:.3f} | {t['whole']['tower_s']:.3f} | {t['limit']['tower_s']:.3f} | "
                     f"{t['chunks_over_limit']:.2f}x | {t['whole_over_limit']:.2f}x | {met} |")
    lines += ["", "| trace | median tower s, chunks | median, whole | median, limit |", "| --- | --- | --- | --- |"]
    for name, t in r["traces"].items():
        lines.append(f"| {name} | {t['chunks']['tower_s_median']:.3f} | {t['whole']['tower_s_median']:.3f} | "
                     f"{t['limit']['tower_s_median']:.3f} |")
    lines += ["", "Tower items (chunks sent to the tower) per mode: " + "; ".join(
        f"{name}: chunks {t['chunks']['tower_items']} (hits {t['chunks']['chunk_hits']}, joins "
        f"{t['chunks']['chunk_joins']}, misses {t['chunks']['chunk_misses']}; {t['chunks']['tower_tokens']} tokens in "
        f"{'/'.join(map(str, t['chunks']['tower_batches']))} batches), whole {t['whole']['tower_items']} videos "
        f"({t['whole']['tower_tokens']} tokens), limit {t['limit']['tower_items']} ({t['limit']['tower_tokens']} tokens "
        f"in {'/'.join(map(str, t['limit']['tower_batches']))} batches)" for name, t in r["traces"].items()) + ".", "",
              ] + [
        f"{name}: chunk caching sent the tower " + ("exactly the limit's work (the same items and tokens)"
                                                   if t["chunks"]["tower_tokens"] == t["limit"]["tower_tokens"]
                                                   and t["chunks"]["tower_items"] == t["limit"]["tower_items"]
                                                   else "more than the limit's work") +
        f"; whole-video caching {t['whole']['tower_tokens'] / t['limit']['tower_tokens']:.2f}x the limit's tokens."
        for name, t in r["traces"].items()] + ["",
              "Where the work is equal, a time ratio away from 1.00x is measurement noise (every run's time is in "
              "the JSON beside this file).", "",
              "Commands: " + "; ".join(f"`{c}`" for c in dict.fromkeys(r["commands"])), ""]
    with open(out_md, "w") as f:
        f.write("\n".join(lines))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--render":  # re-render a saved JSON: --render FILE.json
        write(json.load(open(sys.argv[2])), os.path.splitext(sys.argv[2])[0] + ".md")
    else:
        main()

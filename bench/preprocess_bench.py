#!/usr/bin/python3
"""Preprocessing against the JPEG-decode floor (issue 42): images/s per core.

For each size (256, 512, 1024 and 2048 pixels square), one thread each,
interleaved in one run:
  epd          epd::DecodeAndPreprocess, the product's path (bytes -> patch rows);
  dct          the same with PreprocessConfig::jpeg_dct_scaling on (DCT-scaled
               JPEG decode where the target is at most half the image; off
               by default: not Pillow's pixels, see docs/KEYS_AND_PREPROCESSING.md);
  decode       its decode alone (epd::DecodeImage);
  preprocess   its preprocess alone (epd::Preprocess on an image decoded beforehand);
  pillow       the Pillow + numpy pipeline of bench/reference_pipeline.py
               (Hugging Face's slow Qwen2-VL processor's steps);
  torchvision  the fast processor's path: torchvision.io.decode_jpeg, resize
               with antialiased bicubic, rescale and normalise fused into one
               normalize (mean and std scaled by 255), patchify as
               Qwen2VLImageProcessorFast does;
  turbojpeg    tjDecompress2 to RGB8 alone, one reused handle and buffer (the floor).
  probe        epd::ProbeItems on a one-image request (issue 42 section 5):
               the content key plus the header grid, no decode;
  probe_header epd::ProbeGrid alone, the header grid.
The C++ contenders run in build/bench/preprocess_bench (-DEPD_BUILD_BENCH=ON),
a child process that times them on request; the Python ones run here with
torch.set_num_threads(1).

Images: four photographs of Debian's scikit-image data (astronaut, coffee,
chelsea, rocket), each centre-cropped to a square, resized with Pillow's
LANCZOS to each size and saved as JPEG quality 90 (Pillow's default 4:2:0
subsampling), in --images (reused when present).

A round runs, for each size, every contender for --seconds of wall time after
one untimed pass over the four images; the contenders' order rotates from
round to round, so a load drift hits all of them alike. Rates are images per
CPU-second of the process that ran them (time.process_time, and
CLOCK_PROCESS_CPUTIME_ID in the child): images/s per core, whatever else the
machine runs. The figures are medians over --rounds rounds, ratios are ratios
of those medians. The threads table runs DecodeAndPreprocess (and the floor)
on 1 and 2 threads in the same rounds and reports combined images per second
of wall time.

Before timing, the grids of epd, Pillow + numpy and torchvision are compared
for every image (they must be equal).

Output: the JSON result on --out (schema "epd-bench-preprocess/1") and the
markdown tables on stdout and --md. bench/report.py renders the same tables
(render_body, targets) in docs/BENCHMARKS.md.

Usage: bench/preprocess_bench.py [--build build] [--rounds 5] [--seconds 1.0]
           [--sizes 256,512,1024,2048] [--images DIR] [--out FILE] [--md FILE]
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCHEMA = "epd-bench-preprocess/1"
PHOTOS = ("astronaut", "coffee", "chelsea", "rocket")
SINGLE = ("epd", "dct", "decode", "preprocess", "pillow", "torchvision", "turbojpeg", "probe", "probe_header")
CPP = ("epd", "dct", "decode", "preprocess", "turbojpeg", "probe", "probe_header")
THREADED = ("epd", "turbojpeg")
LABEL = {
    "epd": "epd-encode, `DecodeAndPreprocess`",
    "dct": "... with `jpeg_dct_scaling` (off by default: not Pillow's pixels)",
    "decode": "... its decode alone (`DecodeImage`)",
    "preprocess": "... its preprocess alone (`Preprocess`)",
    "pillow": "Pillow + numpy (Hugging Face's slow Qwen2-VL processor's steps)",
    "torchvision": "torchvision (the fast processor's path)",
    "turbojpeg": "TurboJPEG decode alone (the floor)",
    "probe": "the header probe, `ProbeItems` (content key + grid, no decode)",
    "probe_header": "... its header grid alone (`ProbeGrid`)",
}
# Issue 42 section 5: the probe at least this many times DecodeAndPreprocess, at this size.
PROBE_GOAL = (100.0, "1024")
# Issue 42's targets: DecodeAndPreprocess at least this many times each peer, at every size.
GOALS = (("turbojpeg", 0.4, "the TurboJPEG decode floor"), ("pillow", 3.0, "Pillow + numpy"),
         ("torchvision", 2.0, "torchvision"))


def loadavg() -> list[str]:
    with open("/proc/loadavg") as f:
        return f.read().split()[:3]


def make_images(folder: str, sizes: list[int]) -> dict[int, list[str]]:
    """Writes (or reuses) folder/<photo>_<size>.jpg; returns the paths by size."""
    os.makedirs(folder, exist_ok=True)
    out: dict[int, list[str]] = {}
    photos = None
    for s in sizes:
        out[s] = []
        for name in PHOTOS:
            path = os.path.join(folder, f"{name}_{s}.jpg")
            if not os.path.isfile(path):
                if photos is None:
                    import skimage.data
                    from PIL import Image

                    photos = {}
                    for n in PHOTOS:
                        img = Image.fromarray(getattr(skimage.data, n)()).convert("RGB")
                        side = min(img.size)
                        left, top = (img.width - side) // 2, (img.height - side) // 2
                        photos[n] = img.crop((left, top, left + side, top + side))
                from PIL import Image

                photos[name].resize((s, s), Image.LANCZOS).save(path, "JPEG", quality=90)
            out[s].append(path)
    return out


class Cpp:
    """The C++ contenders: build/bench/preprocess_bench, driven over its pipes."""

    def __init__(self, binary: str):
        self.proc = subprocess.Popen([binary], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, line: str) -> dict:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        reply = json.loads(self.proc.stdout.readline())
        if "error" in reply:
            raise RuntimeError(f"preprocess_bench: {line.split()[0]}: {reply['error']}")
        return reply

    def close(self) -> None:
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()


def python_pipelines():
    """(pillow, torchvision): bytes -> (rows, grid) each, one thread."""
    import torch
    import torchvision.transforms.functional as F
    from torchvision.io import decode_jpeg
    from torchvision.transforms import InterpolationMode

    sys.path.insert(0, os.path.join(REPO, "bench"))
    import reference_pipeline as ref

    torch.set_num_threads(1)
    mean = [m * 255 for m in ref.MEAN]  # rescale fused into normalize, as the fast processor does
    std = [s * 255 for s in ref.STD]
    P, M, T = ref.PATCH, ref.MERGE, ref.TEMPORAL

    def pillow(data):
        return ref.preprocess(data, ref.MAX_PIXELS)

    def tv(data):
        img = decode_jpeg(data)  # [3, H, W] uint8
        h, w = img.shape[-2:]
        hb, wb = ref.smart_resize(h, w, ref.MAX_PIXELS)
        img = F.resize(img, [hb, wb], interpolation=InterpolationMode.BICUBIC, antialias=True)
        x = F.normalize(img.to(torch.float32), mean, std)
        x = x[None, None].repeat(1, T, 1, 1, 1)  # [1, T, 3, H, W]: the image repeated to the temporal patch
        gh, gw = hb // P, wb // P
        x = x.view(1, 1, T, 3, gh // M, M, P, gw // M, M, P).permute(0, 1, 4, 7, 5, 8, 3, 2, 6, 9)
        return x.reshape(gh * gw, 3 * T * P * P), (1, gh, gw)

    return pillow, tv, torch


def time_python(fn, inputs: list, seconds: float) -> dict:
    for x in inputs:  # warm-up
        fn(x)
    n, i = 0, 0
    w0, c0 = time.perf_counter(), time.process_time()
    deadline = w0 + seconds
    while True:
        fn(inputs[i])
        n += 1
        i = (i + 1) % len(inputs)
        if time.perf_counter() >= deadline:
            break
    return {"images": n, "wall_s": time.perf_counter() - w0, "cpu_s": time.process_time() - c0}


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarise(d: dict) -> None:
    """Adds d["median"][contender][size] (images per CPU-second) and
    d["threads_median"][contender][threads][size] (images per wall second)."""
    med: dict = {}
    for c in SINGLE:
        med[c] = {}
        for s in d["sizes"]:
            rates = [r[c][str(s)]["images"] / r[c][str(s)]["cpu_s"] for r in d["rounds"] if str(s) in r.get(c, {})]
            med[c][str(s)] = median(rates)
    d["median"] = med
    tm: dict = {}
    for c in THREADED:
        tm[c] = {}
        for n in d["threads"]:
            tm[c][str(n)] = {}
            for s in d["sizes"]:
                runs = [r["threads"][c][str(n)][str(s)] for r in d["rounds"]
                        if str(s) in r.get("threads", {}).get(c, {}).get(str(n), {})]
                tm[c][str(n)][str(s)] = {
                    "wall": median([x["images"] / x["wall_s"] for x in runs]),
                    "cpu": median([x["images"] / x["cpu_s"] for x in runs]),
                }
    d["threads_median"] = tm


def fnum(x) -> str:
    if x is None:
        return "-"
    if x >= 1000:
        return f"{x:,.0f}"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def ratio(a, b) -> float | None:
    return None if a is None or not b else a / b


def render_body(d: dict) -> str:
    """The markdown of a result (also used by bench/report.py)."""
    sizes = [str(s) for s in d["sizes"]]
    med = d["median"]
    head = "| images/s per core | " + " | ".join(f"{s}²" for s in sizes) + " |"
    sep = "|---|" + "---|" * len(sizes)
    lines = [
        f"Measured {d['date']} on {d['machine']} by `{d['command']}`: {len(d['rounds'])} rounds, "
        f"{d['config']['seconds']} s per contender and size in each, one thread each. The machine was shared "
        f"with other builds and tests (load average {' '.join(d['loadavg_before'])} before, "
        f"{' '.join(d['loadavg_after'])} after, on {d['cpus']} cores), so the absolute rates are low and noisy; "
        "the ratios, between contenders interleaved in the same rounds, are what this measures. Rates are images "
        "per CPU-second of the process that ran them (medians over the rounds); ratios are ratios of the medians.",
        "",
        f"Images: four photographs of Debian's scikit-image {d['versions'].get('skimage', '?')} data "
        f"({', '.join(PHOTOS)}), centre-cropped to squares, resized with Pillow's LANCZOS and saved as JPEG "
        "quality 90 (4:2:0). Resized by smart_resize (max_pixels 1,003,520) to: "
        + ", ".join(f"{s}² → {d['resized'][s]}" for s in sizes) + ". The grids of epd, Pillow + numpy and "
        "torchvision were equal on every image.",
        "",
        head,
        sep,
    ]
    for c in SINGLE:
        lines.append(f"| {LABEL[c]} | " + " | ".join(fnum(med[c][s]) for s in sizes) + " |")
    rows = [
        ("**epd / Pillow + numpy**", "epd", "pillow"),
        ("**epd / torchvision**", "epd", "torchvision"),
        ("**epd / the decode floor**", "epd", "turbojpeg"),
        ("epd with `jpeg_dct_scaling` / the decode floor", "dct", "turbojpeg"),
        ("epd's decode / the decode floor", "decode", "turbojpeg"),
        ("**probe (`ProbeItems`) / `DecodeAndPreprocess`**", "probe", "epd"),
        ("`ProbeGrid` / `DecodeAndPreprocess`", "probe_header", "epd"),
    ]
    for label, a, b in rows:
        lines.append(f"| {label} | " + " | ".join(
            "-" if ratio(med[a][s], med[b][s]) is None else f"{ratio(med[a][s], med[b][s]):.2f}" for s in sizes) + " |")
    share = []
    for s in sizes:
        e, p = med["epd"][s], med["preprocess"][s]
        share.append("-" if not e or not p else f"{100 * e / p:.0f} %")
    lines.append("| preprocess's share of `DecodeAndPreprocess`'s time | " + " | ".join(share) + " |")
    tm = d["threads_median"]
    busy = max(float(x) for x in d["loadavg_before"][:1] + d["loadavg_after"][:1]) >= d["cpus"]
    lines += ["", "With N threads, each running the same loop over the four images (combined images per second of "
              "wall time, medians over the same rounds; the second figure is per CPU-second, i.e. per core busy)"
              + (". The load average was at or above the core count, so a second thread found no idle core: these "
                 "rows show what the machine's load left, not how the path scales on idle cores" if busy else "")
              + ":", "", "| images/s, wall (per core) | " + " | ".join(f"{s}²" for s in sizes) + " |", sep]
    for c in THREADED:
        for n in d["threads"]:
            cells = [f"{fnum(tm[c][str(n)][s]['wall'])} ({fnum(tm[c][str(n)][s]['cpu'])})" for s in sizes]
            name = "`DecodeAndPreprocess`" if c == "epd" else "TurboJPEG decode"
            lines.append(f"| {name}, {n} thread{'s' if n > 1 else ''} | " + " | ".join(cells) + " |")
        if len(d["threads"]) > 1:
            lo, hi = str(d["threads"][0]), str(d["threads"][-1])
            lines.append(f"| ... {hi} threads / {lo}, wall | " + " | ".join(
                "-" if ratio(tm[c][hi][s]["wall"], tm[c][lo][s]["wall"]) is None
                else f"{ratio(tm[c][hi][s]['wall'], tm[c][lo][s]['wall']):.2f}" for s in sizes) + " |")
    v = d["versions"]
    lines += ["", f"Versions: Pillow {v.get('pillow')}, numpy {v.get('numpy')}, torch {v.get('torch')}, torchvision "
              f"{v.get('torchvision')}, libjpeg-turbo {v.get('libjpeg-turbo')}, Python {v.get('python')}."]
    return "\n".join(lines) + "\n"


def targets(d: dict) -> list[tuple]:
    """(what, goal, value, met, margin) for issue 42's ratio targets."""
    out = []
    sizes = [str(s) for s in d["sizes"]]
    for peer, goal, name in GOALS:
        rs = [ratio(d["median"]["epd"][s], d["median"][peer][s]) for s in sizes]
        if any(r is None for r in rs):
            continue
        worst = min(rs)
        out.append((f"issue 42: DecodeAndPreprocess against {name}, images/s per core at "
                    f"{'/'.join(s + '²' for s in sizes)}", f">= {goal}x at every size",
                    ", ".join(f"{r:.2f}x" for r in rs), worst >= goal,
                    f"worst {worst:.2f}x, {'met' if worst >= goal else f'{goal / worst:.1f}x short'}"))
    goal, size = PROBE_GOAL
    r = ratio(d["median"].get("probe", {}).get(size), d["median"]["epd"].get(size))
    if r is not None:
        out.append((f"issue 42 section 5: the probe (`ProbeItems`) against DecodeAndPreprocess, images/s per core "
                    f"at {size}²", f">= {goal:.0f}x", f"{r:.0f}x", r >= goal,
                    "met" if r >= goal else f"{goal / r:.1f}x short"))
    return out


def versions(torch) -> dict:
    import numpy
    import PIL
    import skimage
    import torchvision

    lib = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "libturbojpeg0"], capture_output=True, text=True)
    return {"pillow": PIL.__version__, "numpy": numpy.__version__, "torch": torch.__version__,
            "torchvision": torchvision.__version__, "skimage": skimage.__version__,
            "libjpeg-turbo": lib.stdout.strip() or "?", "python": platform.python_version()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=1.0, help="wall time per contender, size and round")
    ap.add_argument("--sizes", default="256,512,1024,2048")
    ap.add_argument("--threads", default="1,2", help="thread counts of the threads table")
    ap.add_argument("--images", default="", help="folder of the JPEGs (default BUILD/preprocess-bench-images)")
    ap.add_argument("--out", default="")
    ap.add_argument("--md", default="")
    a = ap.parse_args()
    binary = os.path.join(a.build, "bench", "preprocess_bench")
    if not os.access(binary, os.X_OK):
        print(f"preprocess_bench.py: {binary} is not built (configure with -DEPD_BUILD_BENCH=ON)", file=sys.stderr)
        return 1
    sizes = [int(s) for s in a.sizes.split(",")]
    threads = [int(n) for n in a.threads.split(",")]
    paths = make_images(a.images or os.path.join(a.build, "preprocess-bench-images"), sizes)
    blobs = {s: [open(p, "rb").read() for p in ps] for s, ps in paths.items()}

    pillow, tv, torch = python_pipelines()
    tv_inputs = {s: [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in bs] for s, bs in blobs.items()}
    d = {"schema": SCHEMA, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
         "machine": f"{platform.node()} ({os.cpu_count()} CPUs, {platform.platform()})", "cpus": os.cpu_count(),
         "command": ("bench/preprocess_bench.py " + " ".join(sys.argv[1:])).strip(), "config": vars(a),
         "sizes": sizes, "threads": threads, "images": {str(s): [os.path.basename(p) for p in ps]
                                                         for s, ps in paths.items()},
         "versions": versions(torch), "loadavg_before": loadavg(), "rounds": [], "resized": {}}
    cpp = Cpp(binary)
    try:
        for s in sizes:
            grids = cpp.ask(f"load {s} " + " ".join(paths[s]))["grids"]
            for i, data in enumerate(blobs[s]):
                g_pil = list(pillow(data)[1])
                g_tv = list(tv(tv_inputs[s][i])[1])
                if not grids[i] == g_pil == g_tv:
                    raise RuntimeError(f"{paths[s][i]}: grids differ: epd {grids[i]}, Pillow {g_pil}, "
                                       f"torchvision {g_tv}")
            gh, gw = grids[0][1], grids[0][2]
            d["resized"][str(s)] = f"{gh * 14}×{gw * 14} ({gh * gw // 4} tokens)"
        for r in range(a.rounds):
            rd: dict = {"loadavg": loadavg(), "threads": {c: {str(n): {} for n in threads} for c in THREADED}}
            order = SINGLE[r % len(SINGLE):] + SINGLE[:r % len(SINGLE)]
            for s in sizes:
                for c in order:
                    if c in CPP:
                        m = cpp.ask(f"run {c} {s} {a.seconds} 1")
                    elif c == "pillow":
                        m = time_python(pillow, blobs[s], a.seconds)
                    else:
                        m = time_python(tv, tv_inputs[s], a.seconds)
                    rd.setdefault(c, {})[str(s)] = {k: m[k] for k in ("images", "wall_s", "cpu_s")}
                for c in THREADED:
                    for n in (threads if r % 2 == 0 else threads[::-1]):
                        m = cpp.ask(f"run {c} {s} {a.seconds} {n}")
                        rd["threads"][c][str(n)][str(s)] = {k: m[k] for k in ("images", "wall_s", "cpu_s")}
            d["rounds"].append(rd)
            print(f"preprocess_bench.py: round {r + 1} of {a.rounds} done (load {' '.join(loadavg())})",
                  file=sys.stderr)
    finally:
        cpp.close()
    d["loadavg_after"] = loadavg()
    summarise(d)
    text = render_body(d)
    print(text)
    for t in targets(d):
        print("target", "MET   " if t[3] else "MISSED", t[0], "|", t[2], "|", t[4])
    if a.out:
        with open(a.out, "w") as f:
            json.dump(d, f, indent=1)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())

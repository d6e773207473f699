"""Video sampling against Qwen's reference pipeline, qwen-vl-utils.

The reference's arithmetic is re-implemented here from its source
(qwen-vl-utils/src/qwen_vl_utils/vision_process.py in QwenLM/Qwen3-VL:
smart_nframes, fetch_video's max_pixels budget, smart_resize, and the frame
indices torch.linspace(0, total - 1, nframes).round()), sharing no code with
the C++ side. Videos of several lengths, frame rates and sizes are made with
Debian's ffmpeg at test time; ffprobe counts their frames (decord's
len(VideoReader)) and reads their frame rate (get_avg_fps). The sampling that
build/src/video/epd_video_dump prints must equal the reference exactly: frame
count, indices (through the timestamps), resized size, grid, sample fps and
seconds per temporal step.

Pixels: a sampled frame must equal ffmpeg's own decode of the same frame
(`-vf select=eq(n,IDX)`, read by PIL) at the source size, and match it after
PIL's BICUBIC resize within the resampler tolerance that
test_sampled_frame_pixels_match_ffmpeg justifies.
"""

import math
import os
import pathlib
import shutil
import subprocess
from fractions import Fraction

import numpy as np
import pytest
import torch
from PIL import Image

BUILD = pathlib.Path(os.environ.get("EPD_BUILD_DIR", pathlib.Path(__file__).resolve().parents[2] / "build"))
DUMP = BUILD / "src" / "video" / "epd_video_dump"
FFMPEG = shutil.which("ffmpeg")
FFPROBE = shutil.which("ffprobe")

pytestmark = pytest.mark.skipif(
    not DUMP.exists() or FFMPEG is None or FFPROBE is None,
    reason="needs build/src/video/epd_video_dump (EPD_WITH_VIDEO) and Debian's ffmpeg/ffprobe",
)

# --- the reference (qwen-vl-utils, vision_process.py) -------------------------
FRAME_FACTOR = 2
FPS = 2.0
FPS_MIN_FRAMES = 4
FPS_MAX_FRAMES = 768
SPATIAL_MERGE_SIZE = 2
VIDEO_MIN_TOKEN_NUM = 128
VIDEO_MAX_TOKEN_NUM = 768
MODEL_SEQ_LEN = 128000
IMAGE_MIN_TOKEN_NUM = 4
IMAGE_MAX_TOKEN_NUM = 16384
MAX_RATIO = 200


def round_by_factor(n, f):
    return round(n / f) * f


def ceil_by_factor(n, f):
    return math.ceil(n / f) * f


def floor_by_factor(n, f):
    return math.floor(n / f) * f


def smart_resize(height, width, factor, min_pixels, max_pixels):
    assert max(height, width) / min(height, width) <= MAX_RATIO
    h_bar = max(factor, round_by_factor(height, factor))
    w_bar = max(factor, round_by_factor(width, factor))
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, floor_by_factor(height / beta, factor))
        w_bar = max(factor, floor_by_factor(width / beta, factor))
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = ceil_by_factor(height * beta, factor)
        w_bar = ceil_by_factor(width * beta, factor)
    return h_bar, w_bar


def smart_nframes(ele, total_frames, video_fps):
    if "nframes" in ele:
        nframes = round_by_factor(ele["nframes"], FRAME_FACTOR)
    else:
        fps = ele.get("fps", FPS)
        min_frames = ceil_by_factor(ele.get("min_frames", FPS_MIN_FRAMES), FRAME_FACTOR)
        max_frames = floor_by_factor(ele.get("max_frames", min(FPS_MAX_FRAMES, total_frames)), FRAME_FACTOR)
        nframes = total_frames / video_fps * fps
        nframes = min(min(max(nframes, min_frames), max_frames), total_frames)
        nframes = floor_by_factor(nframes, FRAME_FACTOR)
    assert FRAME_FACTOR <= nframes <= total_frames
    return int(nframes)


def reference(ele, total_frames, video_fps, height, width, patch=14):
    """What fetch_video(ele, image_patch_size=patch) chooses for a video."""
    factor = patch * SPATIAL_MERGE_SIZE
    nframes = smart_nframes(ele, total_frames, video_fps)
    idx = torch.linspace(0, total_frames - 1, nframes).round().long().tolist()
    sample_fps = nframes / max(total_frames, 1e-6) * video_fps
    if "resized_height" in ele:
        rh, rw = smart_resize(ele["resized_height"], ele["resized_width"], factor,
                              IMAGE_MIN_TOKEN_NUM * factor**2, IMAGE_MAX_TOKEN_NUM * factor**2)
    else:
        min_pixels = ele.get("min_pixels", VIDEO_MIN_TOKEN_NUM * factor * factor)
        total_pixels = ele.get("total_pixels", MODEL_SEQ_LEN * factor * factor * 0.9)
        max_pixels = max(min(VIDEO_MAX_TOKEN_NUM * factor * factor, total_pixels / nframes * FRAME_FACTOR),
                         int(min_pixels * 1.05))
        max_pixels = min(ele.get("max_pixels", max_pixels), max_pixels)
        rh, rw = smart_resize(height, width, factor, min_pixels, max_pixels)
    return {
        "frames": nframes,
        "indices": idx,
        "resized": (rh, rw),
        "grid": (nframes // 2, rh // patch, rw // patch),
        "sample_fps": sample_fps,
        "seconds_per_grid_t": 2 / sample_fps,
    }


# --- the videos ---------------------------------------------------------------
# name: (lavfi source, frames, codec args, container suffix)
VIDEOS = {
    "1s_30fps": ("testsrc=size=160x120:rate=30", 30, ["-c:v", "libx264"], "mp4"),
    "7.3s_24fps": ("testsrc=size=224x168:rate=24", 175, ["-c:v", "libx264"], "mp4"),
    "20s_10fps": ("testsrc=size=128x96:rate=10", 200, ["-c:v", "libx264"], "mp4"),
    "portrait_1080x1920": ("testsrc=size=1080x1920:rate=5", 10, ["-c:v", "libx264"], "mp4"),
    "64x64_vp9": ("testsrc=size=64x64:rate=8", 24, ["-c:v", "libvpx-vp9", "-b:v", "200k"], "webm"),
    "400s_2fps": ("testsrc=size=48x32:rate=2", 800, ["-c:v", "libx264"], "mp4"),
    "29.97fps": ("testsrc=size=96x64:rate=30000/1001", 90, ["-c:v", "mpeg4", "-q:v", "4"], "avi"),
}


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    out = tmp_path_factory.mktemp("videos")
    made = {}
    for name, (src, frames, codec, suffix) in VIDEOS.items():
        path = out / f"{name}.{suffix}"
        extra = ["-preset", "ultrafast", "-pix_fmt", "yuv420p"] if "libx264" in codec else []
        subprocess.run([FFMPEG, "-v", "error", "-nostdin", "-y", "-f", "lavfi", "-i", src, "-frames:v", str(frames),
                        *codec, *extra, str(path)], check=True)
        made[name] = path
    return made


def probe(path):
    """(packets, avg fps, height, width) as ffprobe counts and reads them."""
    out = subprocess.run([FFPROBE, "-v", "error", "-select_streams", "v:0", "-count_packets", "-show_entries",
                          "stream=nb_read_packets,avg_frame_rate,width,height", "-of", "default=nw=1", str(path)],
                         check=True, capture_output=True, text=True).stdout
    kv = dict(line.split("=", 1) for line in out.split())
    return int(kv["nb_read_packets"]), float(Fraction(kv["avg_frame_rate"])), int(kv["height"]), int(kv["width"])


def dump(path, *args, out_dir=None):
    cmd = [str(DUMP), *args]
    if out_dir is not None:
        cmd += ["--out-dir", str(out_dir)]
    res = subprocess.run(cmd + [str(path)], capture_output=True, text=True)
    fields = {}
    for line in res.stdout.splitlines():
        key, _, rest = line.partition(" ")
        fields[key] = rest.split()
    assert res.returncode == 0, res.stdout + res.stderr
    return fields


# ele (qwen-vl-utils' per-video options) -> the dump's flags
def flags(ele, patch):
    f = ["--patch", str(patch)] if patch != 14 else []
    names = {"fps": "--fps", "nframes": "--nframes", "min_frames": "--min-frames", "max_frames": "--max-frames",
             "min_pixels": "--min-pixels", "total_pixels": "--total-pixels"}
    for k, v in ele.items():
        if k in names:
            f += [names[k], str(v)]
    if "resized_height" in ele:
        f += ["--resized", str(ele["resized_height"]), str(ele["resized_width"])]
    return f


CASES = [(name, {}, 14) for name in VIDEOS] + [
    ("7.3s_24fps", {"fps": 1.0}, 14),
    ("7.3s_24fps", {"nframes": 7}, 14),
    ("20s_10fps", {"min_frames": 9}, 14),
    ("20s_10fps", {"max_frames": 10}, 14),
    ("20s_10fps", {"min_pixels": 3136, "total_pixels": 200000}, 14),  # the total budget binds
    ("portrait_1080x1920", {"resized_height": 100, "resized_width": 200}, 14),
    ("portrait_1080x1920", {}, 16),  # Qwen3-VL
    ("1s_30fps", {}, 16),
]


@pytest.mark.parametrize("name,ele,patch", CASES, ids=[f"{n}-{e}-p{p}" for n, e, p in CASES])
def test_sampling_matches_qwen_vl_utils(videos, name, ele, patch):
    total, fps, height, width = probe(videos[name])
    assert total == VIDEOS[name][1]  # ffmpeg wrote what we asked for
    want = reference(ele, total, fps, height, width, patch)
    got = dump(videos[name], *flags(ele, patch))

    assert int(got["source_frames"][0]) == total
    assert float(got["source_fps"][0]) == pytest.approx(fps, rel=1e-12)
    assert int(got["frames"][0]) == want["frames"]
    assert tuple(map(int, got["resized"])) == want["resized"]
    assert tuple(map(int, got["grid"])) == want["grid"]
    assert float(got["sample_fps"][0]) == pytest.approx(want["sample_fps"], rel=1e-12)
    assert float(got["seconds_per_grid_t"][0]) == pytest.approx(want["seconds_per_grid_t"], rel=1e-12)
    # The timestamps are PTS; every test video has constant frame rate, so
    # frame i is at i / fps up to the container's time base (ms in AVI/WebM),
    # far below the 1 / fps between neighbours: rounding recovers the index.
    stamps = [float(t) for t in got["timestamps"]]
    assert [round(t * fps) for t in stamps] == want["indices"]
    for t, i in zip(stamps, want["indices"]):
        assert t == pytest.approx(i / fps, abs=1e-3)


def ffmpeg_frame(path, index, tmp_path):
    """Frame `index` as ffmpeg decodes it, converted to RGB24 with the same
    swscale settings as epd::video (bicubic chroma, accurate rounding)."""
    png = tmp_path / f"frame{index}.png"
    subprocess.run([FFMPEG, "-v", "error", "-nostdin", "-y", "-i", str(path), "-sws_flags", "bicubic+accurate_rnd",
                    "-vf", f"select=eq(n\\,{index})", "-frames:v", "1", "-pix_fmt", "rgb24", str(png)], check=True)
    return Image.open(png).convert("RGB")


def test_sampled_frame_pixels_match_ffmpeg(videos, tmp_path):
    """At the source size the frame must equal ffmpeg's exactly: same decoder,
    same YUV -> RGB conversion. After the resize the one difference could be
    the resampler: epd::ResizeRgb against PIL's BICUBIC, which the
    reference's processors use. ResizeRgb now reimplements Pillow's and
    equals it byte for byte (tests/python/test_resample_parity.py); the
    bounds are kept from when it was stb_image_resize, which differed at
    borders: at most 1 inside a 2-pixel margin (the resize here is an
    upscale, scale < 2), at most 7 anywhere."""
    path = videos["7.3s_24fps"]  # 224x168: both multiples of 28
    total, fps, height, width = probe(path)
    want = reference({}, total, fps, height, width)
    k = 5
    idx = want["indices"][k]
    ref = ffmpeg_frame(path, idx, tmp_path)

    # Source size: resized_height/width equal to it, so no resampling at all.
    got = dump(path, "--resized", str(height), str(width), out_dir=tmp_path / "raw")
    assert tuple(map(int, got["resized"])) == (height, width)
    ours = np.fromfile(tmp_path / "raw" / f"frame_{k:03d}.rgb", dtype=np.uint8).reshape(height, width, 3)
    assert np.array_equal(ours, np.asarray(ref))

    # Default sampling: resized as the reference would, with PIL BICUBIC.
    got = dump(path, out_dir=tmp_path / "resized")
    rh, rw = want["resized"]
    assert tuple(map(int, got["resized"])) == (rh, rw)
    ours = np.fromfile(tmp_path / "resized" / f"frame_{k:03d}.rgb", dtype=np.uint8).reshape(rh, rw, 3)
    theirs = np.asarray(ref.resize((rw, rh), Image.BICUBIC), dtype=int)
    diff = np.abs(ours.astype(int) - theirs)
    assert diff[2:-2, 2:-2].max() <= 1, diff[2:-2, 2:-2].max()
    assert diff.max() <= 7, diff.max()
    # And it is the right frame: the frame 12 later differs far more.
    other = np.asarray(ffmpeg_frame(path, idx + 12, tmp_path).resize((rw, rh), Image.BICUBIC), dtype=int)
    assert np.abs(ours.astype(int) - other).mean() > 10 * diff.mean() + 1


def test_bad_inputs_are_refused_by_name(tmp_path):
    audio = tmp_path / "audio.wav"
    subprocess.run([FFMPEG, "-v", "error", "-nostdin", "-y", "-f", "lavfi", "-i", "sine=duration=1", str(audio)],
                   check=True)
    res = subprocess.run([str(DUMP), str(audio)], capture_output=True, text=True)
    assert res.returncode == 1
    assert res.stdout.startswith("error 3 ") and "no video stream" in res.stdout, res.stdout

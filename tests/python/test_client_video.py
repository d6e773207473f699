"""Videos through a real `epd-encode serve` process (docs/VIDEO.md): the
Python client sends an MP4 made here with Debian's ffmpeg and gets the grid,
the timing and vLLM's video inputs back; a repeat is a whole-video hit; the
Python video key equals the key the C++ server derived; the CLI client sends a
video file recognised by its magic bytes.

Independent values: the MP4 is 2 s of 160x120 at 10 fps, so qwen-vl-utils
samples 4 frames at 2 fps (2 s * 2 fps, at least FPS_MIN_FRAMES 4): 2
temporal patches, sample rate 2 fps, 1 s per temporal patch, at source frames
round(linspace(0, 19, 4)) = 0, 6, 13, 19, i.e. 0, 0.6, 1.3, 1.9 s."""

import os
import shutil
import subprocess
import tempfile

import pytest

import child_process
import server_harness as h

reason = h.missing_reason()
if reason:
    pytest.skip(reason, allow_module_level=True)
if shutil.which("ffmpeg") is None:
    pytest.skip("ffmpeg CLI not found", allow_module_level=True)
try:
    from epd import client as ec
except ImportError as e:
    pytest.skip(f"epd.client is not importable ({e})", allow_module_level=True)


@pytest.fixture(scope="module")
def mp4():
    d = tempfile.mkdtemp(prefix="epd-video-client-")
    path = os.path.join(d, "clip.mp4")
    subprocess.run(["ffmpeg", "-y", "-loglevel", "error", "-f", "lavfi", "-i", "testsrc=size=160x120:rate=10",
                    "-frames:v", "20", "-pix_fmt", "yuv420p", path], check=True)
    yield path
    shutil.rmtree(d)


@pytest.fixture(scope="module")
def server():
    proc, port, _ = h.start_server(h.tiny_serve_args() + ["--server-id", "py-video"])
    yield f"127.0.0.1:{port}"
    assert h.stop_server(proc) == 0


def test_video_comes_back_with_grid_timing_and_vllm_inputs(server, mp4):
    data = open(mp4, "rb").read()
    with ec.EncodeClient(server, timeout=60) as c:
        [r] = c.encode([ec.Item(video=data)])
        assert r.ok and r.source == "miss"
        t, gh, gw = r.grid_thw
        assert t == 2
        assert r.tokens == t * gh * gw // 4
        assert r.sample_fps == 2.0 and r.seconds_per_grid_t == 1.0
        assert len(r.timestamps_s) == 4
        for got, want in zip(r.timestamps_s, [0, 0.6, 1.3, 1.9]):
            assert abs(got - want) <= 1e-6
        info = c.health()
        assert r.key == ec.video_key(info.model_id, info.preprocess, ec.VideoSampling(), video=data)
        assert r.key == c.key_for(ec.Item(video=data))
        mm = r.to_vllm()
        assert set(mm) == {"video_embeds", "video_grid_thw", "second_per_grid_ts"}
        assert list(mm["video_grid_thw"][0]) == [t, gh, gw]
        assert float(mm["second_per_grid_ts"][0]) == 1.0

        [again] = c.encode([ec.Item(video=data)])
        assert again.source == "l1" and again.main == r.main
        assert again.timestamps_s == r.timestamps_s
        stats = c.stats()
        assert stats["video_items"] == 2 and stats["video_decodes"] == 1


def test_other_sampling_is_another_key(server, mp4):
    data = open(mp4, "rb").read()
    with ec.EncodeClient(server, timeout=60) as c:
        [r] = c.encode([ec.Item(video=data, sampling=ec.VideoSampling(fps=4.0))])
        assert r.ok and r.grid_thw[0] == 4  # 2 s at 4 fps: 8 frames
        info = c.health()
        assert r.key == ec.video_key(info.model_id, info.preprocess, ec.VideoSampling(fps=4.0), video=data)


def test_a_rotated_video_is_portrait_unless_the_request_turns_rotation_off(server, mp4):
    # The same stream with a 90-degree display matrix: 120x160 shown, so the
    # grid's h and w swap; with rotation off it is the stored landscape one,
    # and each has its own key (tag 0x49), which the Python key matches.
    rotated = mp4 + ".rot90.mp4"
    child_process.run(["ffmpeg", "-y", "-loglevel", "error", "-i", mp4, "-c", "copy", "-metadata:s:v", "rotate=90",
                       rotated], check=True)
    data = open(rotated, "rb").read()
    with ec.EncodeClient(server, timeout=60) as c:
        info = c.health()
        [plain] = c.encode([ec.Item(video=open(mp4, "rb").read())])
        [portrait] = c.encode([ec.Item(video=data)])
        off_sampling = ec.VideoSampling(apply_rotation=False)
        [stored] = c.encode([ec.Item(video=data, sampling=off_sampling)])
        t, gh, gw = plain.grid_thw
        assert gh != gw and tuple(portrait.grid_thw) == (t, gw, gh)
        assert tuple(stored.grid_thw) == tuple(plain.grid_thw) and stored.main == plain.main
        assert portrait.main != plain.main
        assert portrait.key == ec.video_key(info.model_id, info.preprocess, ec.VideoSampling(), video=data)
        assert stored.key == ec.video_key(info.model_id, info.preprocess, off_sampling, video=data)
        assert stored.key != portrait.key


def test_cli_client_sends_a_video_file(server, mp4):
    out = subprocess.run([h.encode_binary(), "client", "--server", server, mp4], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert any(line.startswith("index=0 grid=2x") and "frames=4" in line for line in lines), out.stdout


def test_truncated_video_is_invalid_argument(server, mp4):
    data = open(mp4, "rb").read()
    with ec.EncodeClient(server, timeout=60) as c:
        with pytest.raises(ec.EncodeError) as e:
            c.encode([ec.Item(video=data[: len(data) // 3])])
        assert e.value.code.name == "INVALID_ARGUMENT"
        [ok] = c.encode([h.png(56, 56, 5)])  # still serving
        assert ok.ok

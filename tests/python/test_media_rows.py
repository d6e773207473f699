"""The rows of the media-parity issue, end to end: each input, sent through the
Python client, the `epd-encode client` CLI and `epd-encode replay`, must give
the embedding of the image Pillow produces from it, i.e. the same embedding
as a plain 8-bit RGB PNG of Pillow's pixels
(ImageOps.exif_transpose + vLLM's rgba_to_rgb / convert("RGB")).

The server runs the tiny tower with one item per batch (a batch's float
results can differ in the last bit with its composition), so equal pixels
give equal embeddings bit for bit, and different pixels (the old behaviours: sideways,
black transparency, gamma-converted, rounded 16-bit) give different ones.
Token counts are Qwen2-VL's smart_resize, computed here."""

import io
import json
import os
import struct
import subprocess
import tempfile

import numpy as np
import pytest
from PIL import Image, ImageOps

import child_process
import server_harness as h
from test_pillow_parity import exif_bytes, png_chunk, qwen2vl_tokens, write_png

reason = h.missing_reason()
if reason:
    pytest.skip(reason, allow_module_level=True)
try:
    from epd import client as ec
except ImportError as e:
    pytest.skip(f"epd.client is not importable ({e})", allow_module_level=True)

PHOTOS = "/usr/lib/python3/dist-packages/skimage/data"


def photo(size):
    return Image.open(os.path.join(PHOTOS, "astronaut.png")).convert("RGB").resize(size, Image.Resampling.BICUBIC)


def save(im, fmt, **kw):
    b = io.BytesIO()
    im.save(b, fmt, **kw)
    return b.getvalue()


def pillow_png(data, background=(255, 255, 255), exif=True):
    """The reference: Pillow's RGB for `data`, as a plain PNG."""
    im = Image.open(io.BytesIO(data))
    if exif:
        im = ImageOps.exif_transpose(im)
    if im.mode == "RGBA" and background is not None:
        out = Image.new("RGB", im.size, background)
        out.paste(im, mask=im.split()[3])
        im = out
    return save(im.convert("RGB"), "PNG")


def rows():
    """name -> (input bytes, expected tokens)."""
    shot = photo((128, 96))
    rgba = np.dstack([np.asarray(photo((64, 48))), np.zeros((48, 64), np.uint8)])
    rgba[:, 32:, 3] = 255
    rgba[:, :32, :3] = 0  # the transparent half holds black
    rgb = np.asarray(photo((64, 48)))
    cmyk = photo((64, 48)).convert("CMYK")
    frames = [photo((64, 48)), photo((64, 48)).rotate(180)]
    return {
        "webp_screenshot.webp": (save(shot, "WEBP", quality=80), 15),
        "frames.gif": (save(frames[0].quantize(64), "GIF", save_all=True,
                            append_images=[frames[1].quantize(64)]), qwen2vl_tokens(64, 48)),
        "photo.bmp": (save(photo((64, 48)), "BMP"), qwen2vl_tokens(64, 48)),
        "cmyk_adobe.jpg": (save(cmyk, "JPEG", quality=90), qwen2vl_tokens(64, 48)),
        "phone_exif6.jpg": (save(photo((280, 140)), "JPEG", quality=90, exif=exif_bytes(6)),
                            qwen2vl_tokens(140, 280)),
        "transparent_half.png": (save(Image.fromarray(rgba, "RGBA"), "PNG"), qwen2vl_tokens(64, 48)),
        "gamma1.png": (write_png(rgb, 2, extra=[png_chunk(b"gAMA", struct.pack(">I", 100000))]),
                       qwen2vl_tokens(64, 48)),
        "rgb16.png": (write_png(rgb.astype(np.uint16) * 256 + 255, 2), qwen2vl_tokens(64, 48)),
    }


@pytest.fixture(scope="module")
def server():
    proc, port, _ = h.start_server(h.tiny_serve_args() + ["--server-id", "media-rows", "--max-items-per-batch", "1"])
    yield f"127.0.0.1:{port}"
    assert h.stop_server(proc) == 0


def test_every_row_gives_pillows_result_through_the_python_client(server):
    with ec.EncodeClient(server, timeout=60) as c:
        for name, (data, tokens) in rows().items():
            got, ref = c.encode([data, pillow_png(data)])
            assert got.ok and ref.ok, (name, got, ref)
            assert got.tokens == ref.tokens == tokens, (name, got.tokens, ref.tokens, tokens)
            assert got.main == ref.main, f"{name}: embedding differs from Pillow's image's"
            assert got.key == c.key_for(data), name  # the client derives the server's key


def test_every_row_gives_pillows_result_through_the_cli_client(server):
    with tempfile.TemporaryDirectory() as d:
        for name, (data, tokens) in rows().items():
            paths = [os.path.join(d, name), os.path.join(d, name + ".ref.png")]
            for p, b in zip(paths, [data, pillow_png(data)]):
                with open(p, "wb") as f:
                    f.write(b)
            out = os.path.join(d, "emb.safetensors")
            r = subprocess.run([h.encode_binary(), "client", "--server", server, "--out", out, *paths],
                               capture_output=True, text=True, timeout=120)
            assert r.returncode == 0, (name, r.stderr)
            lines = {int(kv["index"]): kv for kv in
                     (dict(x.split("=", 1) for x in ln.split()) for ln in r.stdout.splitlines())}
            assert lines[0]["tokens"] == lines[1]["tokens"] == str(tokens), (name, lines)
            tensors = read_safetensors(out)
            assert tensors[lines[0]["key"]] == tensors[lines[1]["key"]], f"{name}: embedding differs"


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    return {k: blob[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
            for k, v in header.items() if k != "__metadata__"}


def replay(images, trace_lines, *flags):
    with tempfile.TemporaryDirectory() as d:
        trace = os.path.join(d, "t.jsonl")
        with open(trace, "w") as f:
            f.write("".join(json.dumps(t) + "\n" for t in trace_lines))
        out = os.path.join(d, "emb.safetensors")
        r = child_process.run([h.encode_binary(), "replay", "--model", h.tiny_tower(), "--threads", "1", "--trace",
                               trace, "--images", images, "--json", "--out", out, "--max-items-per-batch", "1", *flags],
                              capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout), read_safetensors(out)


@pytest.mark.parametrize("policy", [("white", "on"), ("none", "off")])
def test_every_row_gives_pillows_result_through_replay(policy):
    background, exif = policy
    cfg = ec.PreprocessConfig(apply_exif_orientation=exif == "on", rgba_composite=background != "none")
    with tempfile.TemporaryDirectory() as images:
        trace = []
        pairs = {}
        for name, (data, _) in rows().items():
            ref = pillow_png(data, None if background == "none" else (255, 255, 255), exif == "on")
            for n, b in [(name, data), (name + ".ref.png", ref)]:
                with open(os.path.join(images, n), "wb") as f:
                    f.write(b)
            trace.append({"id": name, "images": [name, name + ".ref.png"]})
            # Keys as the Python client derives them for these flags (the
            # replay's C++ keys must match, decode options included).
            pairs[name] = (ec.content_key("tiny_tower.pt", cfg, data), ec.content_key("tiny_tower.pt", cfg, ref))
        summary, tensors = replay(images, trace, "--rgba-background", background, "--exif-orientation", exif)
        assert summary["failed_items"] == 0, summary
        for name, (k, kref) in pairs.items():
            assert k.hex() in tensors, f"{name}: the replay's key is not the one Python derives"
            assert tensors[k.hex()] == tensors[kref.hex()], f"{name}: embedding differs from Pillow's image's"


def test_108_megapixel_jpeg_encodes_with_1230_tokens(server):
    """The issue's 12000x9000 phone photo, over the old 64 M limit."""
    data = save(photo((64, 48)).resize((12000, 9000), Image.Resampling.BILINEAR), "JPEG", quality=80)
    with ec.EncodeClient(server, timeout=300) as c:
        [r] = c.encode([data])
    assert r.ok, r
    assert r.tokens == qwen2vl_tokens(12000, 9000) == 1230

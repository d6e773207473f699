"""Differential test: our decoder against Pillow, as Pillow-based engines use it.

The corpus is generated at test time from the photographs in Debian's
python3-skimage (the demo's photos), saved by Pillow or written here byte by
byte where Pillow cannot write the variant (16-bit colour PNG, interlaced PNG,
gAMA chunks, arithmetic-coded JPEG via jpegtran, YCCK JPEG via TurboJPEG,
BMP bit-field layouts). Each file is decoded by build/src/media/epd_decode_dump
(the C++ decode path) and by Pillow 9.4 the way vLLM and transformers do it:

    im = ImageOps.exif_transpose(Image.open(f))
    rgb = paste onto the background with alpha as mask if im.mode == "RGBA"
          and the policy composites (vLLM's rgba_to_rgb), else im.convert("RGB")

and the RGB bytes must be equal. Token counts must equal Qwen2-VL's
smart_resize on Pillow's (transposed) size, from the header alone and from the
decoded image. Truncated and corrupt variants of every format, and lying
headers, must come back as INVALID_ARGUMENT naming the problem.
"""

import ctypes
import io
import math
import os
import pathlib
import shutil
import struct
import subprocess
import zlib

import numpy as np
import pytest
from PIL import Image, ImageCms, ImageOps

BUILD = pathlib.Path(os.environ.get("EPD_BUILD_DIR", pathlib.Path(__file__).resolve().parents[2] / "build"))
DUMP = BUILD / "src" / "media" / "epd_decode_dump"
PHOTOS = pathlib.Path("/usr/lib/python3/dist-packages/skimage/data")

# Pixels each corpus photo is cut to: odd sizes, so 4:2:0 chroma, BMP row
# padding and the interlace passes all hit their edge cases.
SIZE = (173, 131)


# --- Qwen2-VL's token count (the reference processor) ----------------------
# transformers/models/qwen2_vl/image_processing_qwen2_vl.py, smart_resize,
# with the processor defaults (patch 14, merge 2: factor 28, min_pixels 56*56,
# max_pixels 28*28*1280).
def smart_resize(height, width, factor=28, min_pixels=56 * 56, max_pixels=28 * 28 * 1280):
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def qwen2vl_tokens(width, height):
    h, w = smart_resize(height, width)
    return (h // 28) * (w // 28)


# --- Pillow's side -----------------------------------------------------------
def pillow_rgb(data, background=(255, 255, 255), exif=True):
    """RGB the way a Pillow-based engine gets it; background None = drop alpha."""
    im = Image.open(io.BytesIO(data))
    im.load()
    if exif:
        im = ImageOps.exif_transpose(im)
    if im.mode == "RGBA" and background is not None:  # vLLM's rgba_to_rgb
        out = Image.new("RGB", im.size, background)
        out.paste(im, mask=im.split()[3])
        return out
    return im.convert("RGB")


# --- byte-level writers for what Pillow cannot write --------------------------
def png_chunk(kind, body):
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


ADAM7 = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2)]


def write_png(arr, color_type, interlace=False, extra=()):
    """arr: H x W x C uint8 or uint16 (samples big-endian in the file)."""
    arr = np.ascontiguousarray(arr)
    depth = 16 if arr.dtype == np.uint16 else 8
    h, w = arr.shape[:2]
    sample = arr.astype(">u2") if depth == 16 else arr

    def rows(a):
        return b"".join(b"\x00" + a[y].tobytes() for y in range(a.shape[0]))

    if interlace:
        raw = b"".join(rows(sample[y0::dy, x0::dx]) for x0, y0, dx, dy in ADAM7
                       if sample[y0::dy, x0::dx].size)
    else:
        raw = rows(sample)
    ihdr = struct.pack(">IIBBBBB", w, h, depth, color_type, 0, 0, 1 if interlace else 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + b"".join(extra) +
            png_chunk(b"IDAT", zlib.compress(raw, 6)) + png_chunk(b"IEND", b""))


def write_png_packed(values, bits, color_type=0, plte=b""):
    """Low-bit-depth gray or palette PNG: `values` H x W of 0 .. 2**bits - 1, packed MSB first."""
    h, w = values.shape
    rows = b""
    for y in range(h):
        acc, n, row = 0, 0, bytearray()
        for v in values[y]:
            acc, n = (acc << bits) | int(v), n + bits
            if n == 8:
                row.append(acc)
                acc, n = 0, 0
        if n:
            row.append(acc << (8 - n))
        rows += b"\x00" + bytes(row)
    ihdr = struct.pack(">IIBBBBB", w, h, bits, color_type, 0, 0, 0)
    extra = png_chunk(b"PLTE", plte) if plte else b""
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + extra + png_chunk(b"IDAT", zlib.compress(rows)) +
            png_chunk(b"IEND", b""))


def write_bmp(arr_bytes_rows, width, height, bits, compression=0, masks=None, header_size=40, top_down=False,
              palette=b""):
    """A BMP from already-packed rows (bottom-up unless top_down), rows padded here."""
    stride = ((width * bits + 31) >> 3) & ~3
    pixels = b"".join(r.ljust(stride, b"\x00") for r in arr_bytes_rows)
    info = struct.pack("<IiiHHIIiiII", header_size, width, -height if top_down else height, 1, bits, compression,
                       len(pixels), 2835, 2835, len(palette) // 4, 0)
    if header_size >= 56:
        info += struct.pack("<4I", *(masks or (0, 0, 0, 0)))
        info = info.ljust(header_size, b"\x00")
        mask_bytes = b""
    else:
        mask_bytes = struct.pack("<3I", *masks[:3]) if masks else b""
    offset = 14 + len(info) + len(mask_bytes) + len(palette)
    head = b"BM" + struct.pack("<IHHI", offset + len(pixels), 0, 0, offset)
    return head + info + mask_bytes + palette + pixels


def exif_bytes(orientation):
    e = Image.Exif()
    e[0x0112] = orientation
    return e.tobytes()


def turbojpeg_ycck(cmyk):
    """YCCK JPEG: TurboJPEG's tjCompress2 stores CMYK input as YCCK."""
    tj = ctypes.CDLL("libturbojpeg.so.0")
    tj.tjInitCompress.restype = ctypes.c_void_p
    handle = ctypes.c_void_p(tj.tjInitCompress())
    h, w = cmyk.shape[:2]
    buf = ctypes.POINTER(ctypes.c_ubyte)()
    size = ctypes.c_ulong(0)
    src = np.ascontiguousarray(cmyk, dtype=np.uint8)
    TJPF_CMYK, TJSAMP_420 = 11, 2
    rc = tj.tjCompress2(handle, src.ctypes.data_as(ctypes.c_void_p), w, 0, h, TJPF_CMYK, ctypes.byref(buf),
                        ctypes.byref(size), TJSAMP_420, 90, 0)
    assert rc == 0, "tjCompress2 failed"
    out = ctypes.string_at(buf, size.value)
    tj.tjFree(buf)
    tj.tjDestroy(handle)
    return out


def save(im, fmt, **kw):
    b = io.BytesIO()
    im.save(b, fmt, **kw)
    return b.getvalue()


def photo(name, size=SIZE):
    im = Image.open(PHOTOS / name)
    im.load()
    return im.convert("RGB").resize(size, Image.Resampling.BICUBIC)


def make_corpus():
    """name -> encoded bytes, covering every format and every PIL mode that converts to RGB."""
    rgb = photo("astronaut.png")
    arr = np.asarray(rgb)
    gray = photo("camera.png").convert("L")
    g = np.asarray(gray)
    alpha = np.zeros(arr.shape[:2], np.uint8)
    alpha[:, SIZE[0] // 2:] = np.linspace(0, 255, SIZE[0] - SIZE[0] // 2).astype(np.uint8)
    alpha[: SIZE[1] // 3, SIZE[0] // 2:] = 255
    rgba_arr = np.dstack([arr, alpha])
    rgba_arr[alpha == 0, :3] = 0  # the fully transparent half holds black, as in the issue
    rgba = Image.fromarray(rgba_arr, "RGBA")
    la = Image.fromarray(np.dstack([g, alpha]), "LA")
    pal = photo("chelsea.png").quantize(64)
    c = {}
    # PNG: every mode.
    c["png_rgb.png"] = save(rgb, "PNG")
    c["png_rgba.png"] = save(rgba, "PNG")
    c["png_l.png"] = save(gray, "PNG")
    c["png_la.png"] = save(la, "PNG")
    c["png_1.png"] = save(gray.convert("1"), "PNG")
    c["png_p.png"] = save(pal, "PNG")
    c["png_p_trns.png"] = save(pal, "PNG", transparency=3)
    c["png_l_trns.png"] = save(gray, "PNG", transparency=0)
    c["png_rgb_trns.png"] = save(rgb, "PNG", transparency=(0, 0, 0))
    i16 = (g.astype(np.uint16) * 3)  # 0..765: clipped by Pillow above 255
    c["png_i16.png"] = save(Image.fromarray(i16, "I;16"), "PNG")
    noise = np.random.default_rng(7).integers(0, 256, arr.shape, dtype=np.uint16)
    c["png_rgb16.png"] = write_png(arr.astype(np.uint16) * 256 + noise, 2)
    c["png_rgba16.png"] = write_png(rgba_arr.astype(np.uint16) * 256 + np.dstack([noise, noise[..., :1]]), 6)
    c["png_la16.png"] = write_png(np.dstack([g, alpha]).astype(np.uint16) * 257, 4)
    c["png_gray2.png"] = write_png_packed(g >> 6, 2)
    c["png_gray4.png"] = write_png_packed(g >> 4, 4)
    c["png_p4.png"] = save(photo("chelsea.png").quantize(16), "PNG")  # Pillow writes 4-bit indices
    # 2-bit palette with only 3 entries: index 3 is past PLTE (libpng and Pillow must agree).
    c["png_p2.png"] = write_png_packed(g >> 6, 2, 3, bytes([200, 10, 10, 10, 200, 10, 10, 10, 200]))
    c["png_interlaced.png"] = write_png(arr, 2, interlace=True)
    c["png_interlaced_rgba.png"] = write_png(rgba_arr, 6, interlace=True)
    c["png_gamma1.png"] = write_png(arr, 2, extra=[png_chunk(b"gAMA", struct.pack(">I", 100000))])
    c["png_srgb.png"] = write_png(arr, 2, extra=[png_chunk(b"sRGB", b"\x00")])
    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("LAB")).tobytes()
    c["png_iccp.png"] = save(rgb, "PNG", icc_profile=icc)
    for o in range(1, 9):
        c[f"png_exif{o}.png"] = save(rgb, "PNG", exif=exif_bytes(o))
    # JPEG: sampling, progressive, arithmetic, gray, CMYK, YCCK, EXIF.
    c["jpeg_420.jpg"] = save(rgb, "JPEG", quality=90)
    c["jpeg_444.jpg"] = save(rgb, "JPEG", quality=90, subsampling=0)
    c["jpeg_422.jpg"] = save(rgb, "JPEG", quality=90, subsampling=1)
    c["jpeg_progressive.jpg"] = save(rgb, "JPEG", quality=85, progressive=True)
    c["jpeg_l.jpg"] = save(gray, "JPEG", quality=90)
    c["jpeg_cmyk.jpg"] = save(rgb.convert("CMYK"), "JPEG", quality=90)
    c["jpeg_ycck.jpg"] = turbojpeg_ycck(np.asarray(rgb.convert("CMYK")))
    for o in range(1, 9):
        c[f"jpeg_exif{o}.jpg"] = save(rgb, "JPEG", quality=90, exif=exif_bytes(o))
    # WebP: lossy, lossless, alpha, animation, EXIF.
    c["webp_lossy.webp"] = save(rgb, "WEBP", quality=80)
    c["webp_lossless.webp"] = save(rgb, "WEBP", lossless=True)
    c["webp_lossy_rgba.webp"] = save(rgba, "WEBP", quality=80)
    c["webp_lossless_rgba.webp"] = save(rgba, "WEBP", lossless=True)
    frames = [rgb, photo("coffee.png"), photo("chelsea.png")]
    c["webp_animated.webp"] = save(frames[0], "WEBP", save_all=True, append_images=frames[1:], duration=100)
    c["webp_exif6.webp"] = save(rgb, "WEBP", quality=80, exif=exif_bytes(6))
    # GIF: palette, transparency, grey ramp, animation.
    c["gif_p.gif"] = save(pal, "GIF")
    c["gif_trns.gif"] = save(pal, "GIF", transparency=5)
    c["gif_l.gif"] = save(gray, "GIF")
    c["gif_grey_ramp.gif"] = save(gray, "GIF", optimize=False)  # identity palette: Pillow mode L
    c["gif_animated.gif"] = save(frames[0].quantize(128), "GIF", save_all=True,
                                 append_images=[f.quantize(128) for f in frames[1:]], duration=100)
    c["gif_interlaced.gif"] = save(pal, "GIF", interlace=True)
    # BMP: Pillow's writer, then layouts written by hand.
    c["bmp_rgb.bmp"] = save(rgb, "BMP")
    c["bmp_p.bmp"] = save(pal, "BMP")
    c["bmp_l.bmp"] = save(gray, "BMP")
    c["bmp_1.bmp"] = save(gray.convert("1"), "BMP")
    c["bmp_rgba_bi_rgb.bmp"] = save(rgba, "BMP")  # 32-bit BI_RGB: Pillow ignores the 4th byte
    h, w = arr.shape[:2]
    up = list(range(h - 1, -1, -1))
    r5, g6, b5 = arr[..., 0] >> 3, arr[..., 1] >> 2, arr[..., 2] >> 3
    p565 = (r5.astype(np.uint16) << 11) | (g6.astype(np.uint16) << 5) | b5
    p555 = (r5.astype(np.uint16) << 10) | ((arr[..., 1] >> 3).astype(np.uint16) << 5) | b5
    c["bmp_565.bmp"] = write_bmp([p565[y].astype("<u2").tobytes() for y in up], w, h, 16, 3,
                                 (0xF800, 0x7E0, 0x1F))
    c["bmp_555.bmp"] = write_bmp([p555[y].astype("<u2").tobytes() for y in up], w, h, 16)
    bgra = rgba_arr[..., [2, 1, 0, 3]]
    c["bmp_bgra_v5.bmp"] = write_bmp([bgra[y].tobytes() for y in up], w, h, 32, 3,
                                     (0xFF0000, 0xFF00, 0xFF, 0xFF000000), header_size=124)
    c["bmp_topdown.bmp"] = write_bmp([arr[y, :, ::-1].tobytes() for y in range(h)], w, h, 24, top_down=True)
    return c


# --- running our side ---------------------------------------------------------
def run_dump(tmp, files, *flags):
    out = tmp / "out"
    out.mkdir(exist_ok=True)
    res = subprocess.run([str(DUMP), "--out-dir", str(out), *flags, *map(str, files)], capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    rows = {}
    for line in res.stdout.splitlines():
        parts = line.split("\t")
        name = pathlib.Path(parts[0]).name
        if parts[1] == "ok":
            w, h, orientation, header_tokens, tokens = map(int, parts[2:7])
            pixels = (out / (name + ".rgb")).read_bytes()
            rows[name] = dict(ok=True, w=w, h=h, orientation=orientation, header_tokens=header_tokens,
                              tokens=tokens, pixels=pixels)
        else:
            rows[name] = dict(ok=False, code=parts[2], message=parts[3])
    return rows


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    if not DUMP.is_file():
        pytest.fail(f"{DUMP} is not built (cmake --build build --target epd_decode_dump)")
    if not (PHOTOS / "astronaut.png").is_file():
        pytest.fail(f"no photographs in {PHOTOS}: install python3-skimage (scripts/install-deps.sh)")
    tmp = tmp_path_factory.mktemp("parity")
    files = {}
    for name, data in make_corpus().items():
        (tmp / name).write_bytes(data)
        files[name] = data
    # Arithmetic coding: Pillow cannot write it; jpegtran (libjpeg-turbo-progs) recodes losslessly.
    jpegtran = shutil.which("jpegtran")
    if jpegtran is None:
        pytest.fail("jpegtran not found: install libjpeg-turbo-progs (scripts/install-deps.sh)")
    for src, dst in [("jpeg_420.jpg", "jpeg_arith.jpg"), ("jpeg_progressive.jpg", "jpeg_arith_progressive.jpg")]:
        extra = ["-progressive"] if "progressive" in dst else []
        subprocess.run([jpegtran, "-arithmetic", *extra, "-outfile", str(tmp / dst), str(tmp / src)], check=True)
        files[dst] = (tmp / dst).read_bytes()
    return tmp, files


def max_diff(a, b):
    return int(np.abs(np.frombuffer(a, np.uint8).astype(int) - np.frombuffer(b, np.uint8).astype(int)).max())


@pytest.mark.parametrize("policy", ["white", "none", "10,20,30"])
def test_decoded_rgb_equals_pillow(corpus, policy):
    tmp, files = corpus
    background = None if policy == "none" else (255, 255, 255) if policy == "white" else (10, 20, 30)
    ours = run_dump(tmp, [tmp / n for n in sorted(files)], "--rgba-background", policy)
    failures = []
    for name, data in sorted(files.items()):
        ref = pillow_rgb(data, background)
        got = ours[name]
        if not got["ok"]:
            failures.append(f"{name}: we failed: {got['code']} {got['message']}")
            continue
        if (got["w"], got["h"]) != ref.size:
            failures.append(f"{name}: size {got['w']}x{got['h']} != Pillow's {ref.size[0]}x{ref.size[1]}")
            continue
        if got["pixels"] != ref.tobytes():
            failures.append(f"{name}: pixels differ from Pillow's by up to {max_diff(got['pixels'], ref.tobytes())}")
        want = qwen2vl_tokens(*ref.size)
        if got["header_tokens"] != want or got["tokens"] != want:
            failures.append(f"{name}: tokens header {got['header_tokens']} / decoded {got['tokens']} != {want}")
    assert not failures, "\n".join(failures)


def test_every_exif_orientation_matches_exif_transpose(corpus):
    tmp, files = corpus
    names = [n for n in files if "exif" in n]
    assert len(names) == 17
    ours = run_dump(tmp, [tmp / n for n in names])
    for name in names:
        o = int(name.split("exif")[1][0])
        assert ours[name]["orientation"] == o, name
        ref = pillow_rgb(files[name])
        assert (ours[name]["w"], ours[name]["h"]) == ref.size, name
        assert ours[name]["pixels"] == ref.tobytes(), name
        # Orientations 5-8 swap the sides, and the header-only count knows it.
        stored = Image.open(io.BytesIO(files[name])).size
        assert ref.size == (stored[::-1] if o >= 5 else stored), name
        assert ours[name]["header_tokens"] == qwen2vl_tokens(*ref.size), name


def test_exif_orientation_can_be_turned_off(corpus):
    tmp, files = corpus
    names = ["jpeg_exif6.jpg", "png_exif8.png", "webp_exif6.webp"]
    ours = run_dump(tmp, [tmp / n for n in names], "--no-exif-orientation")
    for name in names:
        ref = pillow_rgb(files[name], exif=False)
        assert (ours[name]["w"], ours[name]["h"]) == ref.size, name
        assert ours[name]["pixels"] == ref.tobytes(), name
        assert ours[name]["header_tokens"] == qwen2vl_tokens(*ref.size), name


def corrupt_variants(files):
    """Truncated and corrupted copies of one file per format, and lying headers."""
    out = {}
    for name in ["png_rgb.png", "png_interlaced.png", "jpeg_420.jpg", "jpeg_progressive.jpg", "webp_lossy.webp",
                 "webp_lossless.webp", "gif_p.gif", "bmp_rgb.bmp", "bmp_565.bmp"]:
        data = files[name]
        stem, ext = name.rsplit(".", 1)
        out[f"trunc_{stem}.{ext}"] = data[: len(data) * 2 // 3]
        mangled = bytearray(data)
        # BMP pixels and WebP bitstreams carry no check (Pillow decodes such
        # damage to some image too), so their corrupt variants damage the
        # headers instead: BMP's info header, WebP's chunk and frame headers.
        if ext == "bmp":
            span = range(14, 40, 3)
        elif ext == "webp":
            span = range(12, 36, 3)
        else:
            span = range(len(data) // 3, len(data) - 16, 7)
        for i in span:
            mangled[i] ^= 0x5A
        out[f"mangled_{stem}.{ext}"] = bytes(mangled)
    # A GIF whose logical screen claims 65535x65535 (the largest GIF can say).
    gif = bytearray(files["gif_p.gif"])
    gif[6:10] = struct.pack("<HH", 65535, 65535)
    out["lying_gif.gif"] = bytes(gif)
    # A WebP whose VP8X canvas claims 100000x100000.
    webp = bytearray(files["webp_exif6.webp"])
    assert webp[12:16] == b"VP8X"
    webp[24:27] = (100000 - 1).to_bytes(3, "little")
    webp[27:30] = (100000 - 1).to_bytes(3, "little")
    out["lying_webp.webp"] = bytes(webp)
    return out


def test_truncated_corrupt_and_lying_files_are_invalid_argument(corpus):
    tmp, files = corpus
    bad = corrupt_variants(files)
    for name, data in bad.items():
        (tmp / name).write_bytes(data)
    ours = run_dump(tmp, [tmp / n for n in sorted(bad)])
    failures = []
    for name in sorted(bad):
        got = ours[name]
        fmt = {"png": "PNG", "jpg": "JPEG", "webp": "WebP", "gif": "GIF", "bmp": "BMP"}[name.rsplit(".", 1)[1]]
        want = "too many pixels" if name.startswith("lying") else fmt
        if got["ok"]:
            failures.append(f"{name}: decoded")
        elif got["code"] != "INVALID_ARGUMENT" or want not in got["message"]:
            failures.append(f"{name}: {got['code']} {got['message']!r}, wanted INVALID_ARGUMENT naming {want!r}")
    assert not failures, "\n".join(failures)


def test_108_megapixel_photo_decodes_like_pillow(tmp_path):
    """The issue's 12000x9000 phone photo: over the old 64 M limit, under Pillow's."""
    if not DUMP.is_file():
        pytest.fail(f"{DUMP} is not built")
    big = photo("coffee.png", (12000, 9000))
    data = save(big, "JPEG", quality=80)
    del big
    f = tmp_path / "big.jpg"
    f.write_bytes(data)
    ours = run_dump(tmp_path, [f])["big.jpg"]
    assert ours["ok"], ours
    assert (ours["w"], ours["h"]) == (12000, 9000)
    assert ours["header_tokens"] == ours["tokens"] == qwen2vl_tokens(12000, 9000) == 1230
    assert ours["pixels"] == pillow_rgb(data).tobytes()
    # And the limit is a flag: one pixel less refuses it by name.
    low = run_dump(tmp_path, [f], "--max-decode-pixels", str(12000 * 9000 - 1))["big.jpg"]
    assert not low["ok"] and "too many pixels" in low["message"] and "12000x9000" in low["message"]

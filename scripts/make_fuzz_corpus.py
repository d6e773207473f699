#!/usr/bin/python3
"""Writes the decoder fuzzer's seed corpus to fuzz/corpus/.

Run once by hand (needs PIL: Debian python3-pil) and commit the output; the
build never runs it. Seeds cover each decode path (PNG: RGB, RGBA, gray,
16-bit gray, palette with transparency, interlaced, gAMA, eXIf orientation;
JPEG: baseline 4:2:0, progressive, grayscale, CMYK, EXIF orientation 6;
WebP: lossy, lossless with alpha, animated, EXIF; GIF: static, transparent,
animated, interlaced; BMP: 24-bit, 8-bit palette, 1-bit, 32-bit BI_RGB) and
each rejection path (truncated JPEG, PNG, WebP, GIF and BMP; PNG, WebP and GIF
headers claiming more pixels than the limit; garbage, empty, aspect ratio >
200).

Usage: /usr/bin/python3 scripts/make_fuzz_corpus.py
"""
import io
import os
import random
import struct
import zlib

from PIL import Image

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fuzz", "corpus")


def pattern(mode, w, h):
    img = Image.new("RGB", (w, h))
    img.putdata([((x * 37 + y * 11) % 256, (x * 5 + y * 67) % 256, (x * y * 3) % 256)
                 for y in range(h) for x in range(w)])
    return img.convert(mode)


def encode(img, fmt, **kw):
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


def set_png_size(png, w, h):
    ihdr = bytearray(png[12:29])  # type + 13 data bytes
    ihdr[4:12] = struct.pack(">II", w, h)
    return png[:12] + bytes(ihdr) + struct.pack(">I", zlib.crc32(bytes(ihdr))) + png[33:]


def chunk(kind, body):
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def exif(orientation):
    e = Image.Exif()
    e[0x0112] = orientation
    return e.tobytes()


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = random.Random(1234)
    jpeg = encode(pattern("RGB", 24, 16), "JPEG", quality=85)
    png = encode(pattern("RGB", 12, 9), "PNG")
    pal = pattern("RGB", 10, 10).convert("P", palette=Image.ADAPTIVE, colors=8)
    pal.info["transparency"] = 0
    gray16 = Image.new("I;16", (7, 5))
    gray16.putdata([(i * 4099) % 65536 for i in range(35)])
    gif = encode(pattern("RGB", 7, 5).convert("P"), "GIF")
    webp_exif = encode(pattern("RGB", 10, 6), "WEBP", quality=70, exif=exif(6))
    assert webp_exif[12:16] == b"VP8X"
    webp_lying = webp_exif[:24] + (99999).to_bytes(3, "little") * 2 + webp_exif[30:]
    bmp = encode(pattern("RGB", 7, 3), "BMP")
    # An Adam7-interlaced 5x5 RGB PNG (Pillow cannot write one).
    rgb5 = pattern("RGB", 5, 5).tobytes()
    raw = b""
    for x0, y0, dx, dy in [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2),
                           (0, 1, 1, 2)]:
        for y in range(y0, 5, dy):
            xs = range(x0, 5, dx)
            if xs:
                raw += b"\0" + b"".join(rgb5[(y * 5 + x) * 3:(y * 5 + x) * 3 + 3] for x in xs)
    interlaced = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 5, 5, 8, 2, 0, 0, 1)) +
                  chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    seeds = {
        "rgb.png": png,
        "rgba.png": encode(pattern("RGBA", 9, 7), "PNG"),
        "gray.png": encode(pattern("L", 11, 6), "PNG"),
        "gray16.png": encode(gray16, "PNG"),
        "palette_trns.png": encode(pal, "PNG", transparency=0),
        "baseline.jpg": jpeg,
        "progressive.jpg": encode(pattern("RGB", 20, 20), "JPEG", quality=75, progressive=True),
        "gray.jpg": encode(pattern("L", 16, 8), "JPEG", quality=80),
        "cmyk.jpg": encode(pattern("CMYK", 8, 8), "JPEG", quality=80),
        "aspect_200.png": encode(pattern("RGB", 200, 1), "PNG"),
        "aspect_201.png": encode(pattern("RGB", 201, 1), "PNG"),
        "truncated.jpg": jpeg[: len(jpeg) // 2],
        "truncated.png": png[: len(png) // 2],
        "bomb_100000x100000.png": set_png_size(png, 100000, 100000),
        "gif.gif": gif,
        "gif_trns.gif": encode(pal, "GIF", transparency=0),
        "gif_animated.gif": encode(pattern("RGB", 6, 5).convert("P"), "GIF", save_all=True,
                                   append_images=[pattern("RGB", 6, 5).rotate(90).convert("P")]),
        "gif_interlaced.gif": encode(pattern("RGB", 9, 9).convert("P"), "GIF", interlace=True),
        "gif_lying_65535x65535.gif": gif[:6] + struct.pack("<HH", 65535, 65535) + gif[10:],
        "truncated.gif": gif[: len(gif) // 2],
        "webp_lossy.webp": encode(pattern("RGB", 17, 11), "WEBP", quality=70),
        "webp_lossless_rgba.webp": encode(pattern("RGBA", 9, 7), "WEBP", lossless=True),
        "webp_animated.webp": encode(pattern("RGB", 8, 8), "WEBP", save_all=True,
                                     append_images=[pattern("RGB", 8, 8).rotate(90)], lossless=True),
        "webp_exif6.webp": webp_exif,
        "webp_lying_100000x100000.webp": webp_lying,
        "truncated.webp": webp_exif[: len(webp_exif) // 2],
        "bmp24.bmp": bmp,
        "bmp8.bmp": encode(pal, "BMP"),
        "bmp1.bmp": encode(pattern("L", 9, 3).convert("1"), "BMP"),
        "bmp32.bmp": encode(pattern("RGBA", 5, 3), "BMP"),
        "truncated.bmp": bmp[: len(bmp) // 2],
        "png_interlaced.png": interlaced,
        "png_gamma.png": png[:33] + chunk(b"gAMA", struct.pack(">I", 100000)) + png[33:],
        "png_exif8.png": encode(pattern("RGB", 5, 3), "PNG", exif=exif(8)),
        "jpeg_exif6.jpg": encode(pattern("RGB", 14, 7), "JPEG", quality=80, exif=exif(6)),
        "garbage.bin": bytes(rng.randrange(256) for _ in range(64)),
        "empty.bin": b"",
    }
    for name, data in sorted(seeds.items()):
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
        print(f"{name}: {len(data)} bytes")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
"""Writes the decoder fuzzer's seed corpus to fuzz/corpus/.

Run once by hand (needs PIL: Debian python3-pil) and commit the output; the
build never runs it. Seeds cover each decode path (PNG: RGB, RGBA, gray,
16-bit gray, palette with transparency; JPEG: baseline 4:2:0, progressive,
grayscale, CMYK) and each rejection path (truncated JPEG and PNG, a PNG
header claiming 100000x100000, GIF, garbage, empty, aspect ratio > 200).

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


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = random.Random(1234)
    jpeg = encode(pattern("RGB", 24, 16), "JPEG", quality=85)
    png = encode(pattern("RGB", 12, 9), "PNG")
    pal = pattern("RGB", 10, 10).convert("P", palette=Image.ADAPTIVE, colors=8)
    pal.info["transparency"] = 0
    gray16 = Image.new("I;16", (7, 5))
    gray16.putdata([(i * 4099) % 65536 for i in range(35)])
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
        "magic.gif": encode(pattern("RGB", 4, 4), "GIF"),
        "garbage.bin": bytes(rng.randrange(256) for _ in range(64)),
        "empty.bin": b"",
    }
    for name, data in sorted(seeds.items()):
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)
        print(f"{name}: {len(data)} bytes")


if __name__ == "__main__":
    main()

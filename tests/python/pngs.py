"""PNG images for the tests and benchmarks, written with zlib and struct alone
(no imaging library), so every harness that needs an image makes it the same
way.

encode_png(width, height, rows) wraps raw 8-bit RGB scanlines (each led by its
filter byte, 0) in a PNG; the makers below are the patterns the tests use.
"""
import random
import struct
import zlib


def encode_png(width: int, height: int, rows: bytes) -> bytes:
    """An 8-bit RGB, non-interlaced PNG of `rows`: height scanlines, each
    b"\\0" + width * 3 bytes."""
    if len(rows) != height * (1 + 3 * width):
        raise ValueError(f"encode_png: {len(rows)} bytes of rows for {width}x{height} (want {height * (1 + 3 * width)})")

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


def rows_of(width: int, height: int, pixel) -> bytes:
    """Scanlines whose pixel (x, y) is the 3-tuple pixel(x, y)."""
    out = bytearray()
    for y in range(height):
        out.append(0)
        for x in range(width):
            out += bytes(pixel(x, y))
    return bytes(out)


def pattern_png(width: int, height: int, seed: int) -> bytes:
    """Pixels that depend on seed (distinct seeds below 256, distinct bytes)."""
    return encode_png(width, height, rows_of(
        width, height, lambda x, y: ((x * 7 + y * 3 + seed * 31) & 255, (x * y + seed * 11) & 255, (x ^ y ^ seed) & 255)))


def random_png(width: int, height: int, seed: int) -> bytes:
    """Seeded random pixels: distinct for every seed."""
    pixels = random.Random(seed).randbytes(width * height * 3)
    rows = b"".join(b"\0" + pixels[y * width * 3:(y + 1) * width * 3] for y in range(height))
    return encode_png(width, height, rows)


def striped_png(width: int, height: int, seed: int) -> bytes:
    """Repeated rows under a first row that spells seed (distinct seeds,
    distinct images), quick to make and small at any size."""
    row = b"\x00" + bytes((x * 7 + seed * 31) & 255 for x in range(width * 3))
    first = b"\x00" + (seed.to_bytes(4, "big") * (width * 3 // 4 + 1))[:width * 3]
    return encode_png(width, height, first + row * (height - 1))

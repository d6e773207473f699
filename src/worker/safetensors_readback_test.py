#!/usr/bin/env python3
"""Reads write_safetensors_fixture's file with json + numpy only (an
independent reader of the safetensors layout) and checks every value.

Usage: safetensors_readback_test.py WRITER OUT.safetensors
"""
import json
import struct
import subprocess
import sys

import numpy as np


def main() -> int:
    writer, path = sys.argv[1], sys.argv[2]
    subprocess.run([writer, path], check=True)
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    body = data[8 + n:]
    assert (8 + n) % 8 == 0, "data section not 8-byte aligned"

    ka, kb = "11" * 32, "22" * 32
    assert header["__metadata__"] == {"model_id": "fixture"}, header["__metadata__"]
    assert sorted(header) == sorted(["__metadata__", ka, ka + ".deepstack", ka + ".grid_thw", kb]), sorted(header)

    def tensor(name, dtype):
        h = header[name]
        begin, end = h["data_offsets"]
        raw = body[begin:end]
        if dtype == "BF16":
            # bf16 is the high half of a float32.
            u16 = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            return u16.view(np.float32).reshape(h["shape"])
        return np.frombuffer(raw, dtype="<f4").reshape(h["shape"])

    assert header[ka]["dtype"] == "F32" and header[ka]["shape"] == [3, 4]
    main_a = tensor(ka, "F32")
    want = np.array([[t * 10 + c for c in range(4)] for t in range(3)], dtype=np.float32)
    assert np.array_equal(main_a, want), main_a

    assert header[ka + ".deepstack"]["shape"] == [3, 8]
    deep_a = tensor(ka + ".deepstack", "F32")
    want = -np.array([[t * 100 + j for j in range(8)] for t in range(3)], dtype=np.float32)
    assert np.array_equal(deep_a, want), deep_a

    # The grid: I64 [3], little-endian, (t, h, w) = (3, 2, 2); its patches
    # t * h * w = 12 fold 2x2 into the 3 tokens of the main tensor.
    assert header[ka + ".grid_thw"]["dtype"] == "I64" and header[ka + ".grid_thw"]["shape"] == [3]
    begin, end = header[ka + ".grid_thw"]["data_offsets"]
    assert end - begin == 24, (begin, end)
    grid_a = np.frombuffer(body[begin:end], dtype="<i8")
    assert grid_a.tolist() == [3, 2, 2], grid_a
    assert int(np.prod(grid_a)) // 4 == header[ka]["shape"][0]
    # Key b has no recorded grid: no tensor at all rather than zeros.
    assert kb + ".grid_thw" not in header

    assert header[kb]["dtype"] == "BF16" and header[kb]["shape"] == [2, 3]
    main_b = tensor(kb, "BF16")
    want = np.array([[t + c / 2 for c in range(3)] for t in range(2)], dtype=np.float32)
    assert np.array_equal(main_b, want), main_b

    # The tensors tile the data section exactly, without gaps.
    spans = sorted(tuple(v["data_offsets"]) for k, v in header.items() if k != "__metadata__")
    assert spans[0][0] == 0 and spans[-1][1] == len(body), spans
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), spans
    print("safetensors readback: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

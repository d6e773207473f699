#!/usr/bin/env python3
"""End-to-end test of `epd-encode replay` with the default model.

The default model (no --model) is the random Qwen2.5-VL checkpoint the build
writes to DEFAULT_MODEL_DIR (scripts/make_tiny_checkpoint.py --size default):
out_hidden_size 512, no deepstack, patch 14 and merge 2 from its
preprocessor_config.json. The dims the test expects are read from that
directory's JSON files, not from epd-encode.

Writes a few PNGs (by hand: zlib + struct, no imaging library), replays a
generated trace and hand-written ones, and checks the JSON summary and the
safetensors output against counts computed here from the trace alone.

Usage: replay_e2e_test.py EPD_ENCODE WORK_DIR DEFAULT_MODEL_DIR
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys

# The test helpers' launcher: `replay` dies with this test even when ctest
# kills it.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "python"))
import child_process  # noqa: E402
import pngs  # noqa: E402


def png(path, width, height, seed):
    rows = pngs.rows_of(width, height, lambda x, y: ((x * 7 + seed * 31) % 256, (y * 5 + seed * 17) % 256,
                                                     (x * y + seed) % 256))
    with open(path, "wb") as f:
        f.write(pngs.encode_png(width, height, rows))


def run(binary, *args, timeout=None):
    p = child_process.run([binary, "replay", "--threads", "2", *args], capture_output=True, text=True,
                          timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def main():
    binary, work, model_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    shutil.rmtree(work, ignore_errors=True)
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    with open(os.path.join(model_dir, "preprocessor_config.json")) as f:
        processor = json.load(f)
    check(config["model_type"] == "qwen2_5_vl", f"default model is {config['model_type']}")
    out_hidden = config["vision_config"]["out_hidden_size"]
    factor = processor["patch_size"] * processor["merge_size"]
    check(factor == 28, f"patch x merge = {factor}; the image sides below assume 28")
    # The model id in the keys: the one `inspect-model` reports for the
    # default directory, in the documented form `<model_type>:<32 hex>`.
    p = subprocess.run([binary, "inspect-model", model_dir], capture_output=True, text=True)
    check(p.returncode == 0, f"inspect-model failed ({p.returncode}): {p.stderr}")
    m = re.search(r"^model id:\s+(\S+)$", p.stdout, re.M)
    check(m is not None, f"no model id line in: {p.stdout}")
    want_model_id = m.group(1)
    check(re.fullmatch(r"qwen2_5_vl:[0-9a-f]{32}", want_model_id) is not None, f"model id {want_model_id}")
    images = os.path.join(work, "images")
    os.makedirs(images)
    # Sides are multiples of 28 within Qwen2-VL's pixel bounds, so SmartResize
    # keeps them and tokens = width * height / 28^2.
    sizes = {"a.png": (56, 56), "b.png": (84, 56), "c.png": (112, 84), "d.png": (56, 112), "e.png": (140, 140)}
    tokens = {}
    for i, (name, (w, h)) in enumerate(sorted(sizes.items())):
        png(os.path.join(images, name), w, h, i + 1)
        tokens[name] = w * h // 784

    # 1. A generated trace.
    trace = os.path.join(work, "trace.jsonl")
    out = os.path.join(work, "emb.safetensors")
    rc, stdout, stderr = run(binary, "--images", images, "--generate", "25", "--seed", "5",
                             "--write-trace", trace, "--json", "--out", out)
    check(rc == 0, f"replay failed ({rc}): {stderr}")
    j = json.loads(stdout)
    reqs = [json.loads(line) for line in open(trace)]
    names = [os.path.basename(p) for r in reqs for p in r["images"]]
    check(j["requests"] == 25 == len(reqs), f"requests {j['requests']}")
    check(j["items"] == len(names), f"items {j['items']} vs {len(names)}")
    distinct = set(names)
    check(j["distinct_keys"] == len(distinct), f"distinct_keys {j['distinct_keys']} vs {len(distinct)}")
    check(j["hits_l1"] + j["hits_l2"] + j["joins"] + j["misses"] == j["items"], f"hit/miss accounting {j}")
    check(j["misses"] == j["tower_items"] == len(distinct), f"each distinct image encoded once: {j}")
    check(j["tower_tokens"] == sum(tokens[n] for n in distinct), f"tower_tokens {j['tower_tokens']}")
    check(abs(j["mean_batch_tokens"] - j["tower_tokens"] / j["tower_batches"]) < 1e-9, "mean_batch_tokens")
    check(0 < j["latency_ms_p50"] <= j["latency_ms_p99"], "latency percentiles")
    check(j["wall_s"] > 0 and 0 < j["tower_s"] <= j["wall_s"] and j["items_per_s"] > 0, "times")
    for key in ("requests", "items", "distinct_keys", "hits_l1", "hits_l2", "joins", "tower_batches",
                "tower_items", "mean_batch_tokens", "latency_ms_p50", "latency_ms_p99", "items_per_s",
                "wall_s", "tower_s"):
        check(key in j, f"missing JSON key {key}")

    with open(out, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    mains = {k: v for k, v in header.items() if k != "__metadata__" and "." not in k}
    check(len(mains) == len(distinct), f"{len(mains)} embeddings in the file")
    check(sorted(v["shape"][0] for v in mains.values()) == sorted(tokens[n] for n in distinct), "token rows")
    check(all(v["dtype"] == "F32" and v["shape"][1] == out_hidden for v in mains.values()),
          f"hidden {out_hidden}, F32")
    # Qwen2.5-VL has no deepstack: a main tensor and its grid per key, nothing else.
    check(not any(k.endswith(".deepstack") for k in header), "no deepstack for Qwen2.5-VL")
    check(len(header) == 1 + 2 * len(mains), f"main and grid_thw per key, nothing else: {sorted(header)}")
    check(header["__metadata__"]["model_id"] == want_model_id, header["__metadata__"])

    def grid_in_file(key):
        g = header[key + ".grid_thw"]
        check(g["dtype"] == "I64" and g["shape"] == [3], f"{key}.grid_thw is {g}")
        b, e = g["data_offsets"]
        return list(struct.unpack("<3q", body[b:e]))

    # The manifest beside it: one line per (request, item), naming the key,
    # the grid (by hand: sides / patch 14, t = 1) and the file.
    manifest = [json.loads(line) for line in open(os.path.join(work, "emb.manifest.jsonl"))]
    check(len(manifest) == len(names), f"{len(manifest)} manifest lines for {len(names)} items")
    want_rows = [(r["id"], i, p) for r in reqs for i, p in enumerate(r["images"])]
    check([(m["request"], m["item"], m["media"]) for m in manifest] == want_rows, "manifest rows in trace order")
    key_of = {}
    for m in manifest:
        name = os.path.basename(m["media"])
        w, h = sizes[name]
        check(m["grid_thw"] == [1, h // 14, w // 14], f"{name}: grid {m['grid_thw']}")
        check(m["tokens"] == tokens[name] and m["file"] == out, f"{name}: {m}")
        check(m["key"] in mains and mains[m["key"]]["shape"][0] == tokens[name], f"{name}: key {m['key']}")
        check(grid_in_file(m["key"]) == m["grid_thw"], f"{name}: grid in the file")
        check(key_of.setdefault(name, m["key"]) == m["key"], f"{name} has one key")
    check(len(set(key_of.values())) == len(distinct), "distinct images, distinct keys")
    # Each line carries the embedding's bytes (rows x out_hidden x 4, no
    # deepstack) and the cost the tower's item measured for the key, so the
    # manifest is a cache trace: plan reads it with the replay's costs.
    cost_of = {}
    for m in manifest:
        check(m["bytes"] == m["tokens"] * out_hidden * 4, f"bytes: {m}")
        check(m["cost_s"] > 0 and cost_of.setdefault(m["key"], m["cost_s"]) == m["cost_s"], f"one cost a key: {m}")
    p = child_process.run([binary, "plan", "--trace", os.path.join(work, "emb.manifest.jsonl"), "--json"],
                          capture_output=True, text=True, timeout=120)
    check(p.returncode == 0, f"plan on the manifest failed: {p.stderr}")
    plan = json.loads(p.stdout)
    check(plan["requests"] == len(manifest) and plan["distinct_keys"] == len(distinct), f"plan: {plan['requests']}")
    check(abs(plan["encode_seconds"] - sum(m["cost_s"] for m in manifest)) < 1e-9, "plan's seconds are the costs")
    check(plan["working_set_bytes"] == sum({m["key"]: m["bytes"] for m in manifest}.values()), "plan's working set")
    # --mrc is the same report on the replay's own items: its policy, and each key's measured cost (the
    # manifest's cost_s of that run; costs are timed, so each run has its own).
    out2 = os.path.join(work, "mrc.safetensors")
    rc, stdout, stderr = run(binary, "--trace", trace, "--images", images, "--json", "--mrc", "--eviction", "gdsf",
                             "--l1-admission", "doorkeeper", "--out", out2)
    check(rc == 0, f"--mrc replay failed ({rc}): {stderr}")
    mrc = json.loads(stdout)["mrc"]
    manifest2 = [json.loads(line) for line in open(os.path.join(work, "mrc.manifest.jsonl"))]
    check(mrc["policy"] == "gdsf+doorkeeper", f"--mrc sized for {mrc['policy']}")
    check(mrc["requests"] == len(manifest2) and mrc["distinct_keys"] == len(distinct), f"--mrc: {mrc['requests']}")
    check(abs(mrc["encode_seconds"] - sum(m["cost_s"] for m in manifest2)) < 1e-9, "--mrc's seconds are the costs")

    # 2. The same trace without cache or dedup: every item runs the tower.
    rc, stdout, stderr = run(binary, "--trace", trace, "--images", images, "--json", "--no-cache")
    check(rc == 0, f"--no-cache replay failed: {stderr}")
    k = json.loads(stdout)
    check(k["tower_items"] == k["items"] == j["items"] and k["joins"] == 0, f"--no-cache: {k}")
    check(k["hits_l1"] == 0 and k["hits_l2"] == 0, f"--no-cache hits: {k}")

    # 3. A hand-written trace with a repeat inside a request, relative paths.
    hand = os.path.join(work, "hand.jsonl")
    with open(hand, "w") as f:
        f.write('{"id": "x", "arrival_ms": 0, "images": ["a.png", "b.png", "a.png"]}\n')
        f.write('{"id": "y", "arrival_ms": 5, "images": ["a.png"]}\n')
    rc, stdout, stderr = run(binary, "--trace", hand, "--images", images, "--json", "--realtime",
                             "--max-items-per-batch", "1")
    check(rc == 0, f"hand trace failed: {stderr}")
    h = json.loads(stdout)
    check(h["items"] == 4 and h["distinct_keys"] == 2 and h["tower_items"] == 2, f"hand trace: {h}")
    check(h["joins"] + h["hits_l1"] == 2, f"the repeats joined or hit: {h}")
    check(h["tower_batches"] == 2, f"one item per batch: {h}")

    # 3b. --eviction gdsf with the doorkeeper (issue 26): a.png three times,
    # far enough apart that each finds the last one's entry. Its first put
    # goes to L2 (the doorkeeper's first request), its second request
    # promotes it (an L2 hit), its third is an L1 hit; each hit weighs the
    # entry's bytes (tokens x out_hidden x 4) and its measured cost, which is
    # what its miss cost.
    with open(hand, "w") as f:
        for i in range(3):
            f.write(json.dumps({"id": f"g{i}", "arrival_ms": 1500 * i, "images": ["a.png"]}) + "\n")
    rc, stdout, stderr = run(binary, "--trace", hand, "--images", images, "--json", "--realtime", "--eviction",
                             "gdsf", "--l1-admission", "doorkeeper")
    check(rc == 0, f"gdsf replay failed: {stderr}")
    g = json.loads(stdout)
    entry = tokens["a.png"] * out_hidden * 4
    check((g["misses"], g["hits_l2"], g["hits_l1"], g["l1_admission_rejections"]) == (1, 1, 1, 1), f"gdsf: {g}")
    check(g["miss_bytes"] == g["hit_bytes_l2"] == g["hit_bytes_l1"] == entry, f"gdsf bytes, entry {entry}: {g}")
    check(g["miss_seconds"] > 0 and g["hit_seconds_l2"] == g["hit_seconds_l1"] == g["miss_seconds"], f"gdsf s: {g}")
    check(abs(g["encode_seconds_saved"] - 2 * g["miss_seconds"]) <= 1e-6 * g["miss_seconds"], f"saved: {g}")
    check(g["l2_write_bytes"] == entry and g["l1_write_bytes"] == entry, f"write bytes: {g}")
    rc, stdout, stderr = run(binary, "--trace", hand, "--images", images, "--eviction", "fifo")
    check(rc == 1 and "--eviction" in stderr and "fifo" in stderr, f"--eviction fifo: {rc} {stderr}")

    # 4. A corrupt image fails its item only (exit 3); a missing one is a setup error (exit 1).
    with open(os.path.join(images, "zz_bad.png"), "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + b"garbage" * 10)
    with open(hand, "w") as f:
        f.write('{"id": "x", "images": ["zz_bad.png", "a.png"]}\n')
    rc, stdout, stderr = run(binary, "--trace", hand, "--images", images, "--json")
    check(rc == 3, f"corrupt image: exit {rc}, {stderr}")
    b = json.loads(stdout)
    check(b["failed_items"] == 1 and b["errors"] == {"INVALID_ARGUMENT": 1} and b["tower_items"] == 1, f"{b}")
    with open(hand, "w") as f:
        f.write('{"id": "x", "images": ["missing.png"]}\n')
    rc, stdout, stderr = run(binary, "--trace", hand, "--images", images)
    check(rc == 1 and "cannot read image" in stderr and "missing.png" in stderr, f"missing image: {rc} {stderr}")

    # 4b. Only regular files under the request limit are read (issue 27): a
    # character device, a FIFO (as an image, a video, or the trace itself)
    # and a file over --max-request-mb each fail at once, naming the path
    # and what it is. (A FIFO once hung the replay; the 60 s limit below is
    # a bound on "at once", not a measurement.)
    fifo = os.path.join(work, "pipe.fifo")
    os.mkfifo(fifo)
    for field, path, says in (("images", "/dev/null", "/dev/null is a character device, not a regular file"),
                              ("images", fifo, "pipe.fifo is a FIFO, not a regular file"),
                              ("videos", fifo, "cannot read video " + fifo)):
        with open(hand, "w") as f:
            f.write(json.dumps({"id": "x", field: [path]}) + "\n")
        rc, stdout, stderr = run(binary, "--trace", hand, "--images", images, timeout=60)
        check(rc == 1 and says in stderr and "request 'x'" in stderr, f"{field} {path}: {rc} {stderr}")
    rc, stdout, stderr = run(binary, "--trace", fifo, "--images", images, timeout=60)
    check(rc == 1 and f"cannot read trace {fifo}: {fifo} is a FIFO" in stderr, f"trace FIFO: {rc} {stderr}")
    with open(hand, "w") as f:
        f.write('{"id": "x", "images": ["e.png"]}\n')
    size = os.path.getsize(os.path.join(images, "e.png"))
    rc, stdout, stderr = run(binary, "--trace", hand, "--images", images, "--max-request-mb", str(size / 2 / 2**20))
    check(rc == 1 and f"is {size} bytes" in stderr and "over the limit" in stderr, f"over the limit: {rc} {stderr}")

    # 5. --device: a string that is no device is a setup error naming it; cuda
    # on a machine without a usable GPU (CI) is one too, never a crash.
    with open(hand, "w") as f:
        f.write('{"id": "x", "images": ["a.png"]}\n')
    rc, stdout, stderr = run(binary, "--trace", hand, "--images", images, "--device", "tpu")
    check(rc == 1 and "'tpu' is not a device" in stderr, f"--device tpu: {rc} {stderr}")
    # A bad flag value is a usage error: exit 1, naming the flag and the value.
    rc, stdout, stderr = run(binary, "--trace", hand, "--images", images, "--cache-mb", "nan")
    check(rc == 1 and "--cache-mb: expected a number >= 0 (MiB), got 'nan'" in stderr, f"--cache-mb nan: {rc} {stderr}")
    rc, stdout, stderr = run(binary, "--trace", hand, "--images", images, "--rgba-background", "pink")
    check(rc == 1 and "--rgba-background" in stderr and "'pink'" in stderr, f"--rgba-background pink: {rc} {stderr}")
    # --max-decode-pixels below a.png's 56x56 = 3136 pixels fails that item by name (exit 3).
    rc, stdout, stderr = run(binary, "--trace", hand, "--images", images, "--json", "--max-decode-pixels", "3135")
    check(rc == 3 and json.loads(stdout)["errors"] == {"INVALID_ARGUMENT": 1}, f"--max-decode-pixels: {rc} {stdout}")
    # A capacity past what the cache's int64 byte counter holds (2^62 - 1 bytes) is refused, not wrapped.
    rc, stdout, stderr = run(binary, "--trace", hand, "--images", images, "--host-cache-mb", "1e13")
    check(rc == 1 and "--host-cache-mb: at most 4398046511103 MiB" in stderr and "got 1e+13" in stderr,
          f"--host-cache-mb 1e13: {rc} {stderr}")
    rc, stdout, stderr = run(binary, "--trace", hand, "--images", images, "--device", "cuda:0")
    if rc == 1:
        check("FAILED_PRECONDITION" in stderr and "cuda:0" in stderr, f"--device cuda:0 without a GPU: {stderr}")
    else:
        check(rc == 0, f"--device cuda:0 with a GPU: {rc} {stderr}")

    print("replay e2e: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())

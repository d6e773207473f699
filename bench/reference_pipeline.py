#!/usr/bin/python3
"""The Python reference engine's encode worker, replaying an epd-encode trace.

Shape of the worker (the engine this reference comes from): for each request,
on arrival, look every item up in the reference (Tiered)EmbeddingCache under
sha256(image bytes); queue the misses as PendingEncodeItem on the reference
EncodeScheduler; then step: next_batch -> preprocess with PIL -> the same
TorchScript tower `epd-encode replay` runs -> split the rows per item -> put
them in the cache. There is NO in-flight deduplication: a repeat that arrives
while its first copy is still queued is a miss and is encoded again.

Input is the trace format of docs/REPLAY.md (JSON Lines {"id", "arrival_ms",
"images"}). Images are read into memory before the clock starts, as replay
does. `--realtime` admits each request at its arrival_ms (otherwise all at
once). Output: one JSON object on stdout with the keys of `epd-encode replay
--json` that apply (joins is always 0).

Preprocessing follows docs/KEYS_AND_PREPROCESSING.md (Qwen2-VL smart_resize,
PIL BICUBIC, CLIP mean/std, the Hugging Face patch row order); the tower
contract is docs/TOWER.md: forward(pixel_values [N, 1176] float32,
grid_thw [n, 3] int64) -> (main [T, hidden], deepstack [T, hidden * k]).

Usage:
  reference_pipeline.py --trace T.jsonl --images DIR --model tower.pt
      [--reference ../shared/reference] [--threads 2] [--realtime]
      [--cache-mb 1024] [--host-cache-mb 4096]
      [--max-tokens-per-batch 8192] [--max-items-per-batch 16]
Exit status 2 when the reference folder is absent (the caller skips this run).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import os
import sys
import time

# Qwen2-VL image processor defaults (transformers image_processing_qwen2_vl.py),
# the same as epd's PreprocessConfig defaults.
PATCH = 14
MERGE = 2
TEMPORAL = 2
MIN_PIXELS = 56 * 56
MAX_PIXELS = 28 * 28 * 1280
MEAN = (0.48145466, 0.4578275, 0.40821073)  # OpenAI CLIP
STD = (0.26862954, 0.26130258, 0.27577711)


def smart_resize(h: int, w: int, max_pixels: int) -> tuple[int, int]:
    f = PATCH * MERGE
    hb = max(f, round(h / f) * f)  # Python's round is half-to-even, as the rule says
    wb = max(f, round(w / f) * f)
    if hb * wb > max_pixels:
        beta = math.sqrt(h * w / max_pixels)
        hb = max(f, math.floor(h / beta / f) * f)
        wb = max(f, math.floor(w / beta / f) * f)
    elif hb * wb < MIN_PIXELS:
        beta = math.sqrt(MIN_PIXELS / (h * w))
        hb = math.ceil(h * beta / f) * f
        wb = math.ceil(w * beta / f) * f
    return hb, wb


def preprocess(data: bytes, max_pixels: int):
    """bytes -> (rows [(H/14)(W/14), 1176] float32 tensor, (1, H/14, W/14))."""
    import numpy as np
    import torch
    from PIL import Image

    img = Image.open(io.BytesIO(data)).convert("RGB")
    hb, wb = smart_resize(img.height, img.width, max_pixels)
    img = img.resize((wb, hb), Image.BICUBIC)
    x = np.asarray(img, dtype=np.float32) / 255.0  # [H, W, 3]
    x = (x - np.asarray(MEAN, np.float32)) / np.asarray(STD, np.float32)
    x = np.ascontiguousarray(x.transpose(2, 0, 1))  # [3, H, W]
    x = np.broadcast_to(x[None], (TEMPORAL, 3, hb, wb))
    gh, gw = hb // PATCH, wb // PATCH
    x = x.reshape(1, TEMPORAL, 3, gh // MERGE, MERGE, PATCH, gw // MERGE, MERGE, PATCH)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8).reshape(gh * gw, 3 * TEMPORAL * PATCH * PATCH)
    return torch.from_numpy(np.ascontiguousarray(x)), (1, gh, gw)


def header_tokens(data: bytes, max_pixels: int) -> int:
    """Post-merge token count from the image header (PIL opens lazily)."""
    from PIL import Image

    w, h = Image.open(io.BytesIO(data)).size
    hb, wb = smart_resize(h, w, max_pixels)
    return hb * wb // (PATCH * MERGE) ** 2


def percentile(values: list[float], p: float) -> float:
    """Nearest rank, as replay reports it."""
    if not values:
        return 0.0
    s = sorted(values)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def main() -> int:
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--images", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--reference", default=os.path.join(repo, "..", "shared", "reference"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--realtime", action="store_true")
    ap.add_argument("--cache-mb", type=float, default=1024)
    ap.add_argument("--host-cache-mb", type=float, default=4096)
    ap.add_argument("--max-tokens-per-batch", type=int, default=8192)
    ap.add_argument("--max-items-per-batch", type=int, default=16)
    ap.add_argument("--max-pixels", type=int, default=MAX_PIXELS)
    ap.add_argument("--jit-executor", choices=["legacy", "profiling"], default="legacy",
                    help="TorchScript executor; with torch 1.13 on CPU the profiling one (torch's default) ran "
                         "this tower several times slower, so the default gives the reference its faster one")
    args = ap.parse_args()

    ref_dir = os.path.abspath(args.reference)
    if not os.path.isfile(os.path.join(ref_dir, "embedding_cache.py")):
        print(f"reference_pipeline: no Python reference at {ref_dir}; skipped", file=sys.stderr)
        return 2
    sys.path.insert(0, ref_dir)
    from embedding_cache import TieredEmbeddingCache  # noqa: E402
    from encode_scheduler import EncodeScheduler, PendingEncodeItem  # noqa: E402
    import torch

    torch.set_num_threads(args.threads)
    if args.jit_executor == "legacy":
        torch._C._jit_set_profiling_executor(False)
        torch._C._jit_set_profiling_mode(False)
    tower = torch.jit.load(args.model, map_location="cpu")
    tower.eval()

    requests = []
    blobs: dict[str, bytes] = {}
    with open(args.trace) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            r = json.loads(line)
            paths = [p if os.path.isabs(p) else os.path.join(args.images, p) for p in r["images"]]
            for p in paths:
                if p not in blobs:
                    with open(p, "rb") as g:
                        blobs[p] = g.read()
            requests.append({"id": r.get("id", f"line-{n}"), "arrival_ms": float(r.get("arrival_ms", 0)),
                             "images": paths})
    requests.sort(key=lambda r: r["arrival_ms"])  # stable: trace order among equal arrivals

    mb = 1 << 20
    ident = lambda v: v  # noqa: E731  (CPU only: the tiers' copies are no-ops)
    cache = TieredEmbeddingCache(int(args.cache_mb * mb), int(args.host_cache_mb * mb), to_host=ident, to_device=ident)
    sched = EncodeScheduler(args.max_tokens_per_batch, args.max_items_per_batch)

    # Warm-up outside the clock: two forwards of one token, as the C++ tower
    # does at load, then one image-sized forward (36x36 patches), because from
    # Python the first real-sized call cost about a second more than later ones.
    with torch.inference_mode():
        for _ in range(2):
            tower(torch.zeros(4, 3 * TEMPORAL * PATCH * PATCH), torch.tensor([[1, 2, 2]], dtype=torch.int64))
        tower(torch.zeros(36 * 36, 3 * TEMPORAL * PATCH * PATCH), torch.tensor([[1, 36, 36]], dtype=torch.int64))

    stats = dict(hits_l1=0, hits_l2=0, misses=0, tower_batches=0, tower_items=0, tower_tokens=0)
    tower_s = 0.0
    keys_done: set[str] = set()
    pending_items: dict[tuple[str, int], tuple[str, bytes]] = {}  # scheduler key -> (content key, bytes)
    left: dict[str, int] = {}  # request id -> items not yet served
    submit_t: dict[str, float] = {}
    latencies: list[float] = []
    items = sum(len(r["images"]) for r in requests)

    def finish(rid: str, now: float) -> None:
        left[rid] -= 1
        if left[rid] == 0:
            latencies.append((now - submit_t[rid]) * 1e3)

    nxt = 0

    def admit(now: float) -> None:
        """Looks up and queues every request that has arrived by `now` (s).
        A request that arrived while the tower was running is admitted right
        after the call and before its outputs enter the cache, which is what
        a lookup at its arrival time would have seen."""
        nonlocal nxt
        while nxt < len(requests) and (not args.realtime or requests[nxt]["arrival_ms"] <= now * 1e3):
            r = requests[nxt]
            nxt += 1
            rid = r["id"]
            submit_t[rid] = r["arrival_ms"] / 1e3 if args.realtime else time.perf_counter() - t0
            left[rid] = len(r["images"])
            for i, p in enumerate(r["images"]):
                data = blobs[p]
                key = hashlib.sha256(data).hexdigest()
                l1, l2 = cache.l1_hits, cache.l2_hits
                if cache.get(key) is not None:
                    stats["hits_l1"] += cache.l1_hits - l1
                    stats["hits_l2"] += cache.l2_hits - l2
                    finish(rid, time.perf_counter() - t0)
                    continue
                stats["misses"] += 1
                sched.add(PendingEncodeItem(rid, i, header_tokens(data, args.max_pixels)))
                pending_items[(rid, i)] = (key, data)

    t0 = time.perf_counter()
    while nxt < len(requests) or sched.pending_size() > 0:
        admit(time.perf_counter() - t0)
        if sched.pending_size() == 0:
            if nxt < len(requests):
                time.sleep(max(0.0, requests[nxt]["arrival_ms"] / 1e3 - (time.perf_counter() - t0)))
            continue
        batch = sched.next_batch()
        rows, grids = [], []
        for it in batch:
            x, g = preprocess(pending_items[it.key][1], args.max_pixels)
            rows.append(x)
            grids.append(g)
        tb = time.perf_counter()
        with torch.inference_mode():  # as the C++ tower (c10::InferenceMode)
            main_out, deep_out = tower(torch.cat(rows), torch.tensor(grids, dtype=torch.int64))
        tower_s += time.perf_counter() - tb
        admit(time.perf_counter() - t0)
        stats["tower_batches"] += 1
        stats["tower_items"] += len(batch)
        off = 0
        for it, g in zip(batch, grids):
            tok = g[0] * g[1] * g[2] // (MERGE * MERGE)
            stats["tower_tokens"] += tok
            emb = (main_out[off:off + tok].clone(), deep_out[off:off + tok].clone())
            off += tok
            key = pending_items.pop(it.key)[0]
            cache.put(key, emb, emb[0].numel() * emb[0].element_size() + emb[1].numel() * emb[1].element_size())
            keys_done.add(key)
            finish(it.request_id, time.perf_counter() - t0)
    wall = time.perf_counter() - t0

    hit_keys = {hashlib.sha256(blobs[p]).hexdigest() for r in requests for p in r["images"]}
    out = {
        "engine": "python-reference",
        "requests": len(requests),
        "items": items,
        "distinct_keys": len(hit_keys),
        **stats,
        "joins": 0,
        "mean_batch_tokens": stats["tower_tokens"] / stats["tower_batches"] if stats["tower_batches"] else 0,
        "latency_ms_p50": percentile(latencies, 50),
        "latency_ms_p99": percentile(latencies, 99),
        "items_per_s": items / wall if wall > 0 else 0,
        "wall_s": wall,
        "tower_s": tower_s,
        "tower_busy_fraction": tower_s / wall if wall > 0 else 0,
        "l1_bytes": cache.l1.current_bytes,
        "l2_bytes": cache.l2.current_bytes,
        "demotions": cache.demotions,
        "promotions": cache.promotions,
        "threads": args.threads,
        "torch": torch.__version__,
        "jit_executor": args.jit_executor,
    }
    json.dump(out, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

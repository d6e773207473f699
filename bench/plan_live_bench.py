#!/usr/bin/env python3
"""`epd-encode plan`'s tier sizing checked against a live worker and a real,
memory-capped Redis (docs/PLAN.md, "The tiers modelled" and "What Redis
charges a value").

1. N distinct PNGs of seeded block noise, sides multiples of 28 (Qwen2.5-VL:
   patch 14, merge 2, so post-merge tokens = H/28 x W/28) with token counts
   log-uniform over --tokens-min..--tokens-max (10x by default), aspect 1:2
   to 2:1, sides 112 to 896 px.
2. A replay trace (docs/REPLAY.md) of M requests, one image each, Zipf(s)
   popularity over the images (ranks shuffled, so popularity is independent
   of size), arrival_ms evenly spaced at --rate requests/s.
3. `plan --replay on --eviction lru` twice: once for the working set, then
   with --l1-max-gb and --l2-max-gb at --l1-share and --l2-share of it; the
   80 % row (sizing[0]) gives L1, L2 and L3 bytes, the prediction and plan's
   own replay through the real caches.
4. A redis-server (tests/python/redis_harness.py) capped at its empty
   used_memory + the row's L3 bytes + an allowance for the worker's
   connection buffers, measured by a short probe replay against the same
   Redis (uncapped, then flushed), allkeys-lru. The empty used_memory is
   taken after the probe, with Redis's per-command latency histograms made
   (about 25 kB per command name, which a fresh Redis lacks).
5. `replay --realtime --l3 redis://...` of the trace with L1/L2 at the row's
   sizes (--cache-mb is MiB: bytes / 2^20), --out for each image's key.
   INFO memory/stats are sampled every 0.5 s meanwhile.
6. A table of object (and modelled-seconds) hit ratios per tier: predicted,
   plan's replay, the live run; the keys Redis holds at the end against an
   independent Python model of the tiers; JSON to
   BUILD/bench-results/plan_live.json.

The plan's modelled cost is tokens x --seconds-per-token, and an entry's
bytes are tokens x hidden x dtype size, so plan's seconds-weighted ratio is
the byte-weighted one; the live run's byte-weighted ratio (hit_bytes_*) is
compared with it. Objects are compared directly.

Timing: Redis's LRU clock ticks once a second, so the rate is chosen for an
L3 turnover (values written per second against the keys it holds) of tens of
seconds; the script prints the turnover it saw.

Usage: plan_live_bench.py [--build BUILD] [--images 600] [--requests 4000]
                          [--rate 25] [--zipf 0.9] [--seed 7] [--keep]
"""

from __future__ import annotations

import argparse
import bisect
import collections
import json
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
import child_process  # noqa: E402
from redis_harness import RedisServer  # noqa: E402
from traces import zipf_cdf  # noqa: E402  (bench/, this script's own folder)



# --- Redis's charge per value (epd/plan/plan_tiers.h, RedisChargeBytes) --------

OVERHEAD_PER_MILLE = 1100  # kRedisOverheadPerMille: Redis's bytes per 1000 bytes of entry (docs/PLAN.md)


def redis_charge(embedding_bytes: int) -> int:
    return max(1, -(-max(embedding_bytes, 0) * OVERHEAD_PER_MILLE // 1000))


# --- Inputs --------------------------------------------------------------------

def make_images(d: str, n: int, seed: int, tmin: int, tmax: int) -> dict:
    """name -> tokens. Seeded block noise (4x4 blocks, so PNGs stay ~1/3 the raw size)."""
    import numpy as np
    from PIL import Image
    os.makedirs(d, exist_ok=True)
    rng = random.Random(seed)
    out = {}
    for i in range(n):
        tokens = math.exp(rng.uniform(math.log(tmin), math.log(tmax)))
        aspect = math.exp(rng.uniform(math.log(0.5), math.log(2.0)))
        gh = min(32, max(4, round(math.sqrt(tokens * aspect))))
        gw = min(32, max(4, round(tokens / gh)))
        h, w = 28 * gh, 28 * gw
        name = f"img{i:04d}.png"
        out[name] = gh * gw
        path = os.path.join(d, name)
        if not os.path.exists(path):
            g = np.random.default_rng([seed, i])
            small = g.integers(0, 256, size=(h // 4, w // 4, 3), dtype=np.uint8)
            Image.fromarray(small.repeat(4, 0).repeat(4, 1), "RGB").save(path, compress_level=1)
    return out


def make_trace(path: str, names: list, m: int, zipf: float, rate: float, seed: int) -> list:
    rng = random.Random(seed + 1)
    ranked = names[:]
    rng.shuffle(ranked)  # rank r -> image, independent of size
    cum = zipf_cdf(len(ranked), zipf)
    acc = cum[-1]
    seq = []
    with open(path, "w") as f:
        for i in range(m):
            img = ranked[min(bisect.bisect_left(cum, rng.random() * acc), len(ranked) - 1)]
            seq.append(img)
            f.write(json.dumps({"id": f"r{i:06d}", "arrival_ms": round(i * 1000.0 / rate, 3), "images": [img]}) + "\n")
    return seq


# --- An independent model of the tiers (docs/PLAN.md, "The tiers modelled") ---

class Lru:
    def __init__(self, cap: int):
        self.cap, self.used, self.d = cap, 0, collections.OrderedDict()

    def get(self, k):
        if k in self.d:
            self.d.move_to_end(k)
            return True
        return False

    def pop(self, k):
        b = self.d.pop(k)
        self.used -= b
        return b

    def put(self, k, b) -> list:
        """Inserts (MRU); returns the victims [(key, bytes)]. Too big: not held."""
        if k in self.d:
            self.pop(k)
        if b > self.cap:
            return []
        victims = []
        while self.used + b > self.cap:
            vk, vb = self.d.popitem(last=False)
            self.used -= vb
            victims.append((vk, vb))
        self.d[k] = b
        self.used += b
        return victims


def model_tiers(seq: list, nbytes: dict, l1: int, l2: int, l3: int) -> dict:
    """Exclusive LRU L1/L2 (L1 victims demoted, L2 hits promoted, an entry over
    L1 placed in L2) over a write-through LRU L3 charged as Redis; hits per tier
    and what L3 holds at the end."""
    c1, c2, c3 = Lru(l1), Lru(l2), Lru(l3)
    hits = collections.Counter()
    hb = collections.Counter()

    def place(k):
        b = nbytes[k]
        if b > l1:
            c2.put(k, b)
            return
        for vk, vb in c1.put(k, b):
            c2.put(vk, vb)

    for k in seq:
        if c1.get(k):
            tier = "l1"
        elif k in c2.d:
            c2.pop(k)
            place(k)
            tier = "l2"
        elif c3.get(k):
            place(k)
            tier = "l3"
        else:
            place(k)
            c3.put(k, redis_charge(nbytes[k]))
            tier = "miss"
        hits[tier] += 1
        hb[tier] += nbytes[k]
    return {"hits": dict(hits), "hit_bytes": dict(hb), "l3_keys": set(c3.d), "l3_charged": c3.used}


# --- Runs -----------------------------------------------------------------------

def run_json(argv: list, timeout: float) -> dict:
    t = time.monotonic()
    p = child_process.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {p.returncode}\n{p.stderr[-3000:]}")
    j = json.loads(p.stdout)
    j["_elapsed_s"] = time.monotonic() - t
    return j


def info(redis: RedisServer, section: str) -> dict:
    raw = redis.command("INFO", section).decode()
    out = {}
    for line in raw.splitlines():
        if ":" in line and not line.startswith("#"):
            k, v = line.split(":", 1)
            try:
                out[k] = int(v)
            except ValueError:
                out[k] = v
    return out


class Sampler(threading.Thread):
    """INFO memory + stats every `period` s until stopped."""

    def __init__(self, redis: RedisServer, period: float):
        super().__init__(daemon=True)
        self.redis, self.period, self.rows, self.halt = redis, period, [], threading.Event()

    def run(self):
        t0 = time.monotonic()
        while not self.halt.is_set():
            try:
                m, s = info(self.redis, "memory"), info(self.redis, "stats")
                self.rows.append({"t": time.monotonic() - t0, "used_memory": m["used_memory"],
                                  "mem_clients_normal": m.get("mem_clients_normal", 0),
                                  "evicted_keys": s["evicted_keys"], "keys": self.redis.dbsize()})
            except Exception:  # noqa: BLE001  (a sample lost is no result lost)
                pass
            self.halt.wait(self.period)

    def stop(self):
        self.halt.set()
        self.join()


def ratios(l1, l2, l3, total) -> dict:
    return {"l1": l1 / total, "l1_l2": (l1 + l2) / total, "all": (l1 + l2 + l3) / total}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--model", default=None, help="checkpoint [BUILD/models/tiny-qwen2_5_vl]")
    ap.add_argument("--images", type=int, default=600)
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--rate", type=float, default=25.0, help="requests/s of the trace (--realtime)")
    ap.add_argument("--zipf", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--tokens-min", type=int, default=40)
    ap.add_argument("--tokens-max", type=int, default=400)
    ap.add_argument("--l1-share", type=float, default=0.02, help="L1 limit, share of the working set")
    ap.add_argument("--l2-share", type=float, default=0.08, help="L2 limit, share of the working set")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--maxmemory-samples", type=int, default=5, help="Redis's LRU sample (its default 5)")
    ap.add_argument("--workdir", default=None, help="images, trace and outputs [a temp dir, removed]")
    ap.add_argument("--keep", action="store_true", help="keep the temp dir")
    ap.add_argument("--out", default=None, help="[BUILD/bench-results/plan_live.json]")
    a = ap.parse_args()
    t_start = time.monotonic()
    epd = os.path.join(a.build, "tools", "epd-encode")
    model = a.model or os.path.join(a.build, "models", "tiny-qwen2_5_vl")
    out_path = a.out or os.path.join(a.build, "bench-results", "plan_live.json")
    work = a.workdir or tempfile.mkdtemp(prefix="epd-plan-live-")
    os.makedirs(work, exist_ok=True)
    imgdir, trace = os.path.join(work, "images"), os.path.join(work, "trace.jsonl")
    res = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "loadavg_before": open("/proc/loadavg").read().split()[:3],
           "params": {k: v for k, v in vars(a).items() if k not in ("keep",)}}
    redis = None
    try:
        # 1-2. Images and trace.
        t = time.monotonic()
        tokens = make_images(imgdir, a.images, a.seed, a.tokens_min, a.tokens_max)
        seq = make_trace(trace, sorted(tokens), a.requests, a.zipf, a.rate, a.seed)
        res["inputs_s"] = time.monotonic() - t
        res["tokens_range"] = [min(tokens.values()), max(tokens.values())]
        print(f"inputs: {a.images} images ({min(tokens.values())}..{max(tokens.values())} tokens), "
              f"{a.requests} requests, {len(set(seq))} distinct, {a.requests / a.rate:.0f} s at {a.rate:g}/s "
              f"({res['inputs_s']:.1f} s)", flush=True)

        # 3. The plan.
        base = [epd, "plan", "--trace", trace, "--images", imgdir, "--model", model, "--json", "--eviction", "lru",
                "--replay", "on", "--dtype", a.dtype]
        first = run_json(base, 600)
        ws = first["working_set_bytes"]
        l1_gb, l2_gb = a.l1_share * ws / 1e9, a.l2_share * ws / 1e9
        plan = run_json(base + ["--l1-max-gb", repr(l1_gb), "--l2-max-gb", repr(l2_gb)], 600)
        row = plan["sizing"][0]
        b = {k: int(round(v)) for k, v in row["bytes"].items()}  # the JSON's are doubles
        rp = row["replayed"]
        n_obj = sum(rp[t]["objects"] for t in ("l1", "l2", "l3", "miss"))
        res["plan"] = {"working_set_bytes": ws, "working_set_redis_bytes": plan["working_set_redis_bytes"],
                       "distinct_keys": plan["distinct_keys"], "l1_max_gb": l1_gb, "l2_max_gb": l2_gb,
                       "row": row, "elapsed_s": first["_elapsed_s"] + plan["_elapsed_s"],
                       "warnings": plan.get("warnings", [])}
        print(f"plan: working set {ws / 1e6:.2f} MB ({plan['distinct_keys']} keys); 80 % row: L1 {b['l1']} B, "
              f"L2 {b['l2']} B, L3 {b['l3']} B, reached {row['reached']}", flush=True)

        # 4. Redis, and the allowance for the worker's connections.
        redis = RedisServer(work)
        redis.start()
        redis.command("CONFIG", "SET", "maxmemory-samples", str(a.maxmemory_samples))
        replay = [epd, "replay", "--images", imgdir, "--model", model, "--eviction", "lru", "--dtype", a.dtype,
                  "--json", "--l3", redis.url]
        fresh = info(redis, "memory")
        fresh_used, idle_clients = fresh["used_memory"], fresh.get("mem_clients_normal", 0)
        biggest = sorted(tokens, key=lambda n: -tokens[n])[:16]
        probe_trace = os.path.join(work, "probe.jsonl")
        with open(probe_trace, "w") as f:
            for i, n in enumerate(biggest):
                f.write(json.dumps({"id": f"p{i}", "arrival_ms": 0, "images": [n]}) + "\n")
        s = Sampler(redis, 0.02)
        s.start()
        probe = run_json(replay + ["--trace", probe_trace, "--cache-mb", "0", "--host-cache-mb", "0"], 300)
        s.stop()
        allowance = max([r["mem_clients_normal"] for r in s.rows] + [idle_clients]) - idle_clients
        spt = probe["tower_s"] / max(1, probe["tower_tokens"])
        # The empty baseline as a Redis that has served a worker has it: with
        # latency-tracking on (Redis 7's default) each command name used once
        # keeps a latency histogram, about 25 kB each, in used_memory (GET, SET,
        # EVAL, SELECT from the worker; INFO, DBSIZE, SCAN, CONFIG, MEMORY from
        # this script). The probe made the worker's; the calls below make ours.
        # CONFIG RESETSTAT would free them all, and they would come back
        # during the run, out of the values' room.
        redis.command("FLUSHALL")
        redis.keys("epd:v:*")
        redis.command("MEMORY", "USAGE", "none")
        redis.command("CONFIG", "GET", "maxmemory")
        info(redis, "stats")
        redis.dbsize()
        time.sleep(0.2)
        empty_info = info(redis, "memory")
        empty = empty_info["used_memory"] - empty_info.get("mem_clients_normal", 0)
        res["redis_fresh_used_memory"] = fresh_used
        stats0 = info(redis, "stats")
        maxmemory = empty + b["l3"] + allowance
        redis.command("CONFIG", "SET", "maxmemory", str(maxmemory))
        redis.command("CONFIG", "SET", "maxmemory-policy", "allkeys-lru")
        res["redis"] = {"version": info(redis, "server")["redis_version"], "empty_used_memory": empty,
                        "allowance_bytes": allowance, "maxmemory": maxmemory,
                        "maxmemory_samples": a.maxmemory_samples, "probe_tower_s_per_token": spt,
                        "probe_items": probe["items"],
                        "probe_client_buffers_peak": allowance + idle_clients, "idle_client_buffers": idle_clients,
                        "info_memory_empty": empty_info}
        # Tower load the live run should see: the plan's replayed misses at the probe's s/token.
        mean_tokens = sum(tokens[n] for n in seq) / len(seq)
        busy = rp["miss"]["objects"] * mean_tokens * spt / (a.requests / a.rate)
        print(f"redis {res['redis']['version']}: empty used_memory {empty} B, allowance {allowance} B "
              f"(probe peak of client buffers), maxmemory {maxmemory} B; probe {spt * 1e3:.3f} ms/token, "
              f"expected tower busy ~{100 * busy:.0f} %", flush=True)

        # 5. The live run.
        s = Sampler(redis, 0.5)
        s.start()
        live = run_json(replay + ["--trace", trace, "--realtime",
                                  "--cache-mb", repr(b["l1"] / 2 ** 20), "--host-cache-mb", repr(b["l2"] / 2 ** 20),
                                  "--out", os.path.join(work, "emb.safetensors")], 3600)
        s.stop()
        keys_raw = redis.keys("epd:v:*")
        final_mem = info(redis, "memory")
        final_stats = info(redis, "stats")
        for k in ("evicted_keys", "keyspace_hits", "keyspace_misses"):
            final_stats[k] -= stats0[k]

        # The key of each image, and its bytes, from the manifest.
        key_of, nbytes = {}, {}
        with open(os.path.join(work, "emb.manifest.jsonl")) as f:
            for line in f:
                r = json.loads(line)
                if "key" in r and "bytes" in r:
                    key_of[r["media"]] = r["key"]
                    nbytes[r["key"]] = r["bytes"]
        held = {k.decode()[len("epd:v:"):] for k in keys_raw}
        held_charged = sum(redis_charge(nbytes[k]) for k in held if k in nbytes)
        # Redis's own count of the held values (key, value, object, keyspace entry;
        # not the expires entry or the buckets: the model's charge less 56 B).
        memory_usage = sum(int(redis.command("MEMORY", "USAGE", "epd:v:" + k, "SAMPLES", "0")) for k in held)
        kseq = [key_of[n] for n in seq]
        mdl = model_tiers(kseq, nbytes, b["l1"], b["l2"], b["l3"])

        # 6. The table.
        items = live["items"]
        lh = {"l1": live["hits_l1"], "l2": live["hits_l2"], "l3": live["hits_l3"], "joins": live["joins"],
              "miss": live["misses"]}
        lb = {"l1": live["hit_bytes_l1"], "l2": live["hit_bytes_l2"], "l3": live["hit_bytes_l3"],
              "miss": live["miss_bytes"]}
        pr = row["predicted_seconds_hit_ratio"]
        rs = row["replayed_seconds_hit_ratio"]
        table = {
            "predicted_seconds": pr,
            "plan_replay_objects": ratios(rp["l1"]["objects"], rp["l2"]["objects"], rp["l3"]["objects"], n_obj),
            "plan_replay_seconds": rs,
            "model_objects": ratios(mdl["hits"].get("l1", 0), mdl["hits"].get("l2", 0), mdl["hits"].get("l3", 0),
                                    len(kseq)),
            "live_objects": ratios(lh["l1"], lh["l2"], lh["l3"], items),
            "live_objects_joins_as_l1": ratios(lh["l1"] + lh["joins"], lh["l2"], lh["l3"], items),
            "live_bytes": ratios(lb["l1"], lb["l2"], lb["l3"], sum(lb.values())),
        }
        mc = [r["mem_clients_normal"] for r in s.rows]
        writes = live.get("l3", {}).get("writes", 0)
        turnover = len(held) / (writes / max(live["wall_s"], 1e-9)) if writes else float("inf")
        res["live"] = {"replay": live, "redis_keys_held": len(held), "redis_held_charged_bytes": held_charged,
                       "redis_held_memory_usage_plus_56": memory_usage + 56 * len(held),
                       "redis_used_memory_end": final_mem["used_memory"], "redis_evicted_keys": final_stats["evicted_keys"],
                       "redis_keyspace_hits": final_stats["keyspace_hits"],
                       "redis_keyspace_misses": final_stats["keyspace_misses"],
                       "mem_clients_normal_max": max(mc) if mc else None,
                       "mem_clients_normal_mean": sum(mc) / len(mc) if mc else None,
                       "l3_turnover_s": turnover, "info_memory_end": final_mem, "samples": s.rows}
        res["model"] = {"hits": mdl["hits"], "l3_keys_held": len(mdl["l3_keys"]), "l3_charged_bytes": mdl["l3_charged"],
                        "held_in_both": len(mdl["l3_keys"] & held)}
        res["table"] = table
        res["elapsed_s"] = time.monotonic() - t_start
        res["loadavg_after"] = open("/proc/loadavg").read().split()[:3]

        print(f"live: {items} items: L1 {lh['l1']}, L2 {lh['l2']}, L3 {lh['l3']}, joins {lh['joins']}, "
              f"misses {lh['miss']}; wall {live['wall_s']:.1f} s, tower busy {100 * live['tower_busy_fraction']:.0f} %, "
              f"p99 {live['latency_ms_p99']:.0f} ms; L3 {live.get('l3', {})}")
        print(f"L3 turnover ~{turnover:.0f} s (keys held / values written per s); client buffers mean "
              f"{res['live']['mem_clients_normal_mean'] or 0:.0f} B, max {res['live']['mem_clients_normal_max']} B\n")
        fmt = "{:<34} {:>7} {:>7} {:>7}"
        print(fmt.format("hit ratio", "L1", "L1+L2", "all"))
        names = [("plan predicted (seconds = bytes)", "predicted_seconds"),
                 ("plan replay, seconds", "plan_replay_seconds"),
                 ("live, bytes (= plan's seconds)", "live_bytes"),
                 ("plan replay, objects", "plan_replay_objects"),
                 ("python model, objects", "model_objects"),
                 ("live, objects", "live_objects")]
        if lh["joins"]:
            names.append(("live, objects, joins as L1", "live_objects_joins_as_l1"))
        for label, k in names:
            v = table[k]
            print(fmt.format(label, f"{v['l1']:.4f}", f"{v['l1_l2']:.4f}", f"{v['all']:.4f}"))
        print(f"\nL3 keys held at the end: Redis {len(held)} (charged {held_charged} B, maxmemory less empty "
              f"{maxmemory - empty} B), model {len(mdl['l3_keys'])} (charged {mdl['l3_charged']} B, L3 {b['l3']} B); "
              f"in both {res['model']['held_in_both']}; Redis evicted {final_stats['evicted_keys']}")
        print(f"Redis's MEMORY USAGE of the held values + 56 B each: {memory_usage + 56 * len(held)} B; "
              f"used_memory at the end less the empty baseline: {final_mem['used_memory'] - empty} B "
              f"(baseline {empty} B; {empty - fresh_used} B of it command latency histograms and tables)")
        print(f"total {res['elapsed_s']:.0f} s")
    finally:
        if redis is not None:
            redis.close()
        os.makedirs(os.path.dirname(out_path), exist_ok=True)
        with open(out_path, "w") as f:
            json.dump(res, f, indent=1, default=str)
        if a.workdir is None and not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        elif a.workdir is None:
            print(f"kept {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

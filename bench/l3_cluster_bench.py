#!/usr/bin/env python3
"""l3_cluster_bench: the L3 tier on Redis Cluster against a single Redis, end
to end through real `epd-encode serve` processes (tiny tower), in one run.

1. Hit latency. A single redis-server and a six-node cluster (three masters,
   three replicas; tests/python/redis_cluster_harness.py) on free loopback
   ports. On each, a writer server encodes --images images; a reader server
   with no L1/L2 (--cache-mb 0 --host-cache-mb 0) then asks for them in
   turn, single and cluster interleaved request by request, so both see the
   same machine load. Every reader request is an L3 hit (checked: its
   source is "l3"). Reported: p50 / p99 / mean of the request's wall time,
   ms, as the client sees it (gRPC, the server's lookup thread, one GET).
2. Failover. On the cluster, three reader threads ask for the stored images
   in turn while one master is killed (SIGKILL by PID); the run goes on
   until its replica is promoted plus --after-s. Reported: requests sent,
   failed, served as misses (the images whose master was dead, encoded
   again), and the time from the kill to the promotion and to the last miss
   (after it every stored image is an l3 hit again, from the promoted node).

Output: one JSON object (schema "epd-bench-l3-cluster/1") on stdout or
--out. Needs a build (EPD_BUILD_DIR or ./build), redis-server and
redis-cli. Usage:
  PYTHONPATH=build/python python3 bench/l3_cluster_bench.py [--images 40] [--rounds 10] [--out F]"""

import argparse
import json
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))

import redis_cluster_harness as rch  # noqa: E402
import redis_harness as rh  # noqa: E402
import server_harness as h  # noqa: E402
from l3_harness import Server  # noqa: E402


def image(i: int) -> bytes:
    block = i // 256
    return h.png(56 + 28 * (block % 4), 56 + 28 * (block // 4 % 4), i % 256)


def percentile(xs, q):
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def summary(ms):
    return {"n": len(ms), "p50_ms": round(percentile(ms, 0.5), 3), "p99_ms": round(percentile(ms, 0.99), 3),
            "mean_ms": round(sum(ms) / len(ms), 3)}


def hit_latency(single_url, cluster_url, images, rounds):
    no_cache = ["--cache-mb", "0", "--host-cache-mb", "0"]
    servers = []
    try:
        for url in (single_url, cluster_url):
            w = Server(url, "writer")
            servers.append(w)
            written = w.encode(images)
            assert all(r.ok for r in written)
            value_bytes = sum(len(r.main) + len(r.deepstack) for r in written) // len(written)
            w.await_writes(len(images))
        readers = {"single": Server(single_url, "r-single", no_cache), "cluster": Server(cluster_url, "r-cluster",
                                                                                        no_cache)}
        servers += readers.values()
        ms = {"single": [], "cluster": []}
        for _ in range(rounds):
            for img in images:
                for name, r in readers.items():
                    t = time.perf_counter()
                    got = r.encode([img])[0]
                    ms[name].append((time.perf_counter() - t) * 1000)
                    assert got.ok and got.source == "l3", f"{name}: {got.source}"
        out = {name: summary(v) for name, v in ms.items()}
        out["embedding_bytes_mean"] = value_bytes
        return out
    finally:
        for s in servers:
            s.stop()


def failover(cluster, images, after_s):
    writer = Server(cluster.url, "writer")
    readers = [Server(cluster.url, f"r{i}", ["--cache-mb", "0", "--host-cache-mb", "0"]) for i in range(3)]
    try:
        assert all(r.ok for r in writer.encode(images))
        writer.await_writes(len(images))
        victim = cluster.masters()[0]
        replica = cluster.replica_of(victim)
        cluster.wait_synced(victim)
        counts = {"sent": 0, "failed": 0, "miss": 0, "l3": 0}
        last_miss_after = [None]  # the last miss served after the kill, s after it
        stop = threading.Event()
        lock = threading.Lock()
        on_victim = {i for i, img in enumerate(images)
                     if cluster.master_of_key("epd:v:{" + writer.client.key_for(img).hex() + "}") is victim}
        # A miss re-encodes and rewrites: the stored set stays the same.

        def run(reader, start):
            i = start
            while not stop.is_set():
                k = i % len(images)
                try:
                    r = reader.encode([images[k]])[0]
                    source = r.source if r.ok else "failed"
                except Exception:  # noqa: BLE001 (counted)
                    source = "failed"
                with lock:
                    counts["sent"] += 1
                    counts[source] = counts.get(source, 0) + 1
                    if killed_at[0] is not None and source == "miss":
                        last_miss_after[0] = time.monotonic() - killed_at[0]
                i += 1

        killed_at = [None]
        threads = [threading.Thread(target=run, args=(r, 7 * n)) for n, r in enumerate(readers)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        killed_at[0] = time.monotonic()
        cluster.kill(victim)
        cluster.wait_promoted(replica)
        promoted_after = time.monotonic() - killed_at[0]
        time.sleep(after_s)
        stop.set()
        for t in threads:
            t.join()
        return {"requests": counts["sent"], "failed": counts["failed"], "served_as_miss": counts["miss"],
                "l3_hits": counts["l3"], "images_on_killed_master": len(on_victim), "images": len(images),
                "promoted_after_s": round(promoted_after, 2),
                "last_miss_after_s": None if last_miss_after[0] is None else round(last_miss_after[0], 2)}
    finally:
        for s in [writer] + readers:
            s.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--after-s", type=float, default=3.0)
    ap.add_argument("--out")
    a = ap.parse_args()
    images = [image(100 + i) for i in range(a.images)]
    single = rh.RedisServer()
    single.start()
    cluster = rch.RedisCluster(masters=3, replicas=1)
    try:
        out = {"schema": "epd-bench-l3-cluster/1", "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "images": a.images, "rounds": a.rounds,
               "hit": hit_latency(single.url, cluster.url, images, a.rounds)}
        out["failover"] = failover(cluster, [image(2000 + i) for i in range(a.images)], a.after_s)
    finally:
        cluster.close()
        single.close()
    text = json.dumps(out, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

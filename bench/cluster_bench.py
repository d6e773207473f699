#!/usr/bin/python3
"""L3 and the cluster: what an L3 hit costs, and what L3 and the cluster
lease save when servers come and go (issue 14, "Performance").

Three parts, each on real processes on loopback (a redis-server of its own,
`epd-encode serve` processes, nginx from deploy/nginx/nginx.conf.template;
tests/python/cluster_harness.py starts and stops them by PID):

  micro     build/bench/l3_bench (C++): an L3 Get through epd::l3 against a
            real Redis, by entry size (0.5, 2, 8 MiB), beside an L1 hit and
            the value codec alone (see bench/l3_bench.cc).
  sizes     the same through the server, by entry size, with the default
            TorchScript tower (models/default_tower.pt: hidden 512, 2
            deepstack layers, float32: 6 KiB per post-merge token), one synthetic JPEG per size whose tokens give
            about 0.5, 2 and 8 MB (252, 504 and 1008 px square: 81, 324 and
            1296 tokens). `epd-encode bench-server` (C++ client, one caller,
            closed loop) against three servers that share one Redis:
              L1 hit   a server with a large L1 (every request after the
                       first hits L1);
              L3 hit   a server whose L1 is smaller than the entry and has no
                       L2, so every request misses L1/L2 and is served from L3
                       (the Stats check that: source l3 only);
              tower    a server without L3 and with the same small L1, so
                       every request runs the tower on the same image.
  cluster   the scale event of tests/deploy/test_cluster_scale.py as a
            trace, side by side for no L3, L3 without the lease, and L3 with
            single flight: 3 servers behind nginx, a Zipf trace warms them,
            a 4th server is added and one removed, the trace is replayed;
            then the burst: new images each sent at once to the 3 servers
            directly (no affinity). For each: tower runs, hit rate, latency
            p50/p99 at the client (Python client, one caller).

Writes BUILD/bench-results/l3.json (read by bench/report.py, section "L3
and the cluster") and a copy in docs/BENCHMARKS-l3.json, which report.py
falls back to. `--render` prints the markdown of a JSON file instead.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
SCHEMA = "epd-bench-l3/1"

# (name, side px): post-merge tokens (side/28)^2 = 81, 324, 1296
SIZES = [("0.5 MB", 252), ("2 MB", 504), ("8 MB", 1008)]
CONFIGS = [("no L3", False, True), ("L3, no lease", True, False), ("L3 + single flight", True, True)]


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def pct(values, p):
    """Nearest-rank percentile (p in 0..100); None for no values."""
    if not values:
        return None
    v = sorted(values)
    k = max(0, min(len(v) - 1, int(-(-p * len(v) // 100)) - 1))
    return v[k]


# --- micro -----------------------------------------------------------------


def run_micro(build: str, samples: int) -> dict | None:
    binary = os.path.join(build, "bench", "l3_bench")
    if not os.access(binary, os.X_OK):
        print(f"cluster_bench: no {binary} (target l3_bench); micro part skipped", file=sys.stderr)
        return None
    out = os.path.join(build, "bench-results", "l3_micro.json.tmp")
    subprocess.run([binary, "--out", out, "--samples", str(samples)], check=True, timeout=900)
    with open(out) as f:
        data = json.load(f)
    os.remove(out)
    return data


# --- sizes through the server ------------------------------------------------


def bench_server(build: str, address: str, side: int, duration: float, hit_only: bool) -> dict:
    cmd = [os.path.join(build, "tools", "epd-encode"), "bench-server", "--server", address, "--synthetic", "1",
           "--image-size", str(side), "--concurrency", "1", "--duration-s", str(duration), "--json",
           "--timeout-s", "600"]
    if hit_only:
        cmd.append("--hit-only")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"bench-server failed: {r.stderr}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_sizes(build: str, duration: float, tower_duration: float) -> list:
    import cluster_harness as ch

    rows = []
    # The TorchScript default tower (hidden 512, 2 deepstack layers: 6 KiB per
    # token in float32, as in docs/BENCHMARKS-server.md); the default
    # checkpoint (Qwen2.5-VL) has no deepstack, so its entries are 3x smaller.
    common = ["--model", os.path.join(build, "models", "default_tower.pt"), "--threads", "2"]
    with ch.Cluster(common, l3=True) as c:
        try:
            # Separate L3 flags per server: build the three by hand.
            url = [ch.L3_FLAGS["url"], c.redis.url] + ch.PATIENT_L3
            servers = {
                "l1": ch.EncodeServer("l1", common + ["--cache-mb", "256"] + url, os.path.join(c.dir, "logs")),
                "l3": ch.EncodeServer("l3", common + ["--cache-mb", "0.01", "--host-cache-mb", "0"] + url,
                                      os.path.join(c.dir, "logs")),
                "tower": ch.EncodeServer("tower", common + ["--cache-mb", "0.01", "--host-cache-mb", "0"],
                                         os.path.join(c.dir, "logs")),
            }
            c.servers.update(servers)
            for s in servers.values():
                s.spawn()
            for s in servers.values():
                s.wait_ready()
            for name, side in SIZES:
                row = {"size": name, "side": side}
                row["l1"] = bench_server(build, servers["l1"].address, side, duration, hit_only=True)
                n = c.wait_l3_entries(len(rows) + 1, pattern="*v:*")
                row["l3_values"] = n
                before = servers["l3"].stats()
                row["l3"] = bench_server(build, servers["l3"].address, side, duration, hit_only=True)
                after = servers["l3"].stats()
                row["l3_server"] = {k: int(after.get(k, 0)) - int(before.get(k, 0))
                                    for k in ("items", "hits_l1", "hits_l2", "hits_l3", "misses")}
                t_before = servers["tower"].stats()
                row["tower"] = bench_server(build, servers["tower"].address, side, tower_duration, hit_only=False)
                t_after = servers["tower"].stats()
                row["tower_server"] = {k: t_after[k] - t_before[k] for k in ("misses", "tower_seconds", "tower_tokens")}
                # Post-merge tokens of this image, as the tower counted them.
                row["tokens"] = row["tower_server"]["tower_tokens"] // max(1, row["tower_server"]["misses"])
                print(f"sizes {name}: L1 p50 {row['l1']['p50_ms']:.2f} ms, L3 p50 {row['l3']['p50_ms']:.2f} ms "
                      f"p99 {row['l3']['p99_ms']:.2f} ms ({row['l3']['sources']}), tower p50 "
                      f"{row['tower']['p50_ms']:.1f} ms", file=sys.stderr, flush=True)
                rows.append(row)
        except Exception:
            print(c.logs(), file=sys.stderr)
            raise
    return rows


# --- the cluster trace ----------------------------------------------------------


def zipf_trace(n_keys: int, n_requests: int, s: float, seed: int) -> list:
    rng = random.Random(seed)
    weights = [1.0 / (r + 1) ** s for r in range(n_keys)]
    return rng.choices(range(n_keys), weights=weights, k=n_requests)


def replay(cluster, images, trace) -> dict:
    """Sends the trace through nginx, one caller; per-phase figures."""
    import cluster_harness as ch
    before = cluster.stats()
    lat, sources, errors = [], {}, 0
    with cluster.client(timeout=300) as cl:
        for k in trace:
            t0 = time.perf_counter()
            [r] = cl.encode([images[k]], check=False)
            lat.append((time.perf_counter() - t0) * 1e3)
            if not r.ok:
                errors += 1
            else:
                sources[r.source] = sources.get(r.source, 0) + 1
    after = cluster.stats()
    tower = ch.field_delta(before, after, "misses")
    return {"requests": len(trace), "distinct": len(set(trace)), "errors": errors, "sources": sources,
            "tower_runs": tower, "hit_rate": 1 - sum(v for k, v in sources.items() if k == "miss") / len(trace),
            "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99)}


def burst(cluster, names, images) -> dict:
    """Each image sent at once to every server in `names`, directly."""
    import cluster_harness as ch
    clients = [cluster.client(cluster.servers[n].address, timeout=300) for n in names]
    lat, errors, sources = [], 0, {}
    before = cluster.stats()
    try:
        for img in images:
            barrier = threading.Barrier(len(clients))
            out = [None] * len(clients)

            def send(i):
                barrier.wait()
                t0 = time.perf_counter()
                r = clients[i].encode([img], check=False)[0]
                out[i] = (r, (time.perf_counter() - t0) * 1e3)

            threads = [threading.Thread(target=send, args=(i,)) for i in range(len(clients))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            for r, ms in out:
                lat.append(ms)
                if not r.ok:
                    errors += 1
                else:
                    sources[r.source] = sources.get(r.source, 0) + 1
    finally:
        for cl in clients:
            cl.close()
    after = cluster.stats()
    tower = ch.field_delta(before, after, "misses", names)
    return {"images": len(images), "servers": len(names), "requests": len(lat), "errors": errors,
            "sources": sources, "tower_runs": tower, "tower_per_image": tower / len(images),
            "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99)}


def run_cluster(keys: int, requests: int, burst_images: int) -> list:
    import cluster_harness as ch

    images = ch.distinct_images(keys, side=112, base_seed=40)
    burst_set = ch.distinct_images(burst_images, side=448, base_seed=4000)
    trace = zipf_trace(keys, requests, 0.8, seed=5)
    rows = []
    serve = ["--threads", "1", "--cache-mb", "256", "--host-cache-mb", "0"]
    for label, l3, single_flight in CONFIGS:
        l3_args = ch.PATIENT_L3 if single_flight or not l3 else ch.NO_SINGLE_FLIGHT + ch.PATIENT_L3
        with ch.Cluster(serve, l3=l3, l3_args=l3_args) as c:
            try:
                c.start_servers(["s0", "s1", "s2"])
                c.start_nginx()
                row = {"config": label, "l3": l3, "single_flight": single_flight and l3}
                row["warm"] = replay(c, images, trace)
                if l3:
                    c.wait_l3_entries(row["warm"]["distinct"], pattern="*v:*")
                c.start_server("s3")
                c.set_upstream(["s1", "s2", "s3"])
                c.stop_server("s0")
                row["after_scale"] = replay(c, images, trace)
                # Burst on the three servers running now.
                row["burst"] = burst(c, ["s1", "s2", "s3"], burst_set)
                rows.append(row)
                print(f"cluster {label}: after scale {row['after_scale']['tower_runs']} tower runs, hit rate "
                      f"{row['after_scale']['hit_rate']:.3f}, p99 {row['after_scale']['p99_ms']:.1f} ms; burst "
                      f"{row['burst']['tower_runs']} tower runs for {burst_images} images",
                      file=sys.stderr, flush=True)
            except Exception:
                print(c.logs(), file=sys.stderr)
                raise
    return rows


# --- rendering ----------------------------------------------------------------------


def _f(x, digits=2):
    return "n/a" if x is None else f"{x:.{digits}f}"


def targets(data: dict) -> list:
    """(what, goal, value, met, margin) for bench/report.py's summary."""
    out = []
    micro = {s["mib"]: s for s in (data.get("micro") or {}).get("sizes", [])}
    if 2 in micro or 2.0 in micro:
        g = micro.get(2, micro.get(2.0))["l3_get"]
        for q in ("p50", "p99"):
            ms = g[f"{q}_us"] / 1e3
            out.append((f"L3 hit of a 2 MB entry on loopback (epd::l3 Get, {q})", "<= 5 ms", f"{ms:.2f} ms",
                        ms <= 5.0, f"{(1 - ms / 5.0) * 100:.0f}% under" if ms <= 5.0 else f"{ms / 5.0:.1f}x over"))
    for row in data.get("cluster", []):
        if row["config"] == "L3 + single flight":
            b = row["burst"]
            out.append(("cluster tower runs on the 3-server same-image burst, single flight",
                        "1.00x the distinct images", f"{b['tower_per_image']:.2f}x ({b['tower_runs']} for "
                        f"{b['images']})", abs(b["tower_per_image"] - 1.0) < 1e-9,
                        "at the limit" if abs(b["tower_per_image"] - 1.0) < 1e-9 else "above the limit"))
    return out


def render_body(data: dict) -> str:
    m = data["meta"]
    out = [f"Measured {m['date']} on {m['machine']} (redis-server {m.get('redis_version', '?')}, on loopback), "
           f"load average {m['load_before']} before and {m['load_after']} after: the 2 cores are shared with other "
           "builds, so tails (p99) are upper bounds. Reproduce: `scripts/bench.sh` with "
           "`EPD_BENCH_SECTIONS=l3` (`bench/cluster_bench.py`, about "
           f"{m.get('wall_s', '?')} s).\n"]
    if m.get("merged_from"):
        o = m["merged_from"]
        out.append(f"That run measured only: {', '.join(m.get('parts', []))}. The other parts come from the run of "
                   f"{o['date']}, load average {o['load_before']} before and {o['load_after']} after "
                   f"({o.get('wall_s', '?')} s).\n")
    micro = data.get("micro")
    if micro:
        when = f"measured {m['date']}; " if m.get("merged_from") else ""
        out.append(f"**L3 hit by entry size, in process** ({when}`bench/l3_bench`: epd::l3 against the real Redis; "
                   f"float32 rows of hidden {micro['hidden']} with {micro['deepstack_layers']} deepstack layer(s); "
                   "one call at a time; microseconds). *L3 get* is what a server pays for an L3 hit before it "
                   "answers: one GET, the header and XXH3 checksum check and the copy into a fresh embedding. "
                   "*decode* is that without Redis and the socket; *L1 hit* is the cache lookup alone; "
                   "*put visible* is a PutAsync until a Get from another connection finds the value.\n")
        rows = ["| entry | value bytes | L1 hit p50 | L3 get p50 | L3 get p90 | L3 get p99 | decode p50 | "
                "encode p50 | put visible p50 |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for s in micro["sizes"]:
            rows.append(f"| {s['mib']} MiB | {s['value_bytes']:,} | {_f(s['l1_hit']['p50_us'], 3)} | "
                        f"{s['l3_get']['p50_us']:,.0f} | {s['l3_get']['p90_us']:,.0f} | {s['l3_get']['p99_us']:,.0f} | "
                        f"{s['l3_decode']['p50_us']:,.0f} | {s['l3_encode']['p50_us']:,.0f} | "
                        f"{s['l3_put_visible']['p50_us']:,.0f} |")
        out.append("\n".join(rows) + "\n")
    sizes = data.get("sizes")
    if sizes:
        when = f"measured {m['merged_from']['date']}; " if m.get("merged_from") and "sizes" not in m.get("parts", []) else ""
        out.append(f"**Through the server, by entry size** ({when}the default TorchScript tower, hidden 512 with 2 "
                   "deepstack layers, float32, so an entry is tokens x 6144 bytes; one synthetic JPEG per size; "
                   "`epd-encode bench-server`, one caller, closed loop; milliseconds at the client, so each "
                   "includes moving the embedding over gRPC). The L3 row's server answered every request from L3 "
                   "(its L1 is smaller than the entry, it has no L2); the tower row ran the tower every time.\n")
        rows = ["| image | tokens | entry MB | L1 hit p50 | L1 hit p99 | L3 hit p50 | L3 hit p99 | L3 sources | tower p50 | "
                "tower p99 | tower requests |", "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
        for r in sizes:
            mb = r["tokens"] * 6144 / 1e6 if isinstance(r.get("tokens"), int) else None
            rows.append(f"| {r['side']} px | {r.get('tokens', '?')} | {_f(mb)} | {_f(r['l1']['p50_ms'])} | "
                        f"{_f(r['l1']['p99_ms'])} | {_f(r['l3']['p50_ms'])} | {_f(r['l3']['p99_ms'])} | "
                        f"{', '.join(f'{k} {v}' for k, v in sorted(r['l3']['sources'].items()))} | "
                        f"{_f(r['tower']['p50_ms'], 0)} | {_f(r['tower']['p99_ms'], 0)} | {r['tower']['requests']} |")
        out.append("\n".join(rows) + "\n")
    cluster = data.get("cluster")
    if cluster:
        c0 = cluster[0]
        when = f"measured {m['merged_from']['date']}; " if m.get("merged_from") and "cluster" not in m.get("parts", []) else ""
        out.append(f"**The cluster trace** ({when}tests/deploy/test_cluster_scale.py as a benchmark): 3 servers "
                   f"(default model, `--threads 1`) behind nginx with content-key affinity; a Zipf(0.8) trace of "
                   f"{c0['warm']['requests']} requests over {c0['warm']['distinct']} distinct images (112 px) warms "
                   "them; a 4th server is added and one removed (`nginx -s reload`); the same trace is replayed. "
                   f"Then the burst: {c0['burst']['images']} new images (448 px), each sent at once to the "
                   f"{c0['burst']['servers']} servers directly, bypassing nginx's affinity. Latency at the client "
                   "(Python client; the trace: one caller through nginx; the burst: one caller per server), "
                   "milliseconds.\n")
        rows = ["| config | warm: tower runs | after the change: tower runs | of distinct keys | hit rate | p50 | "
                "p99 | burst: tower runs | per image | burst p99 |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in cluster:
            a, b = r["after_scale"], r["burst"]
            rows.append(f"| {r['config']} | {r['warm']['tower_runs']} | {a['tower_runs']} | "
                        f"{a['tower_runs'] / a['distinct']:.3f} | {a['hit_rate']:.3f} | {_f(a['p50_ms'])} | "
                        f"{_f(a['p99_ms'])} | {b['tower_runs']} | {b['tower_per_image']:.2f}x | {_f(b['p99_ms'], 0)} |")
        out.append("\n".join(rows) + "\n")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--parts", default="micro,sizes,cluster")
    ap.add_argument("--samples", type=int, default=200, help="l3_bench samples per size")
    ap.add_argument("--duration-s", type=float, default=5.0, help="seconds per L1/L3 size run")
    ap.add_argument("--tower-duration-s", type=float, default=8.0, help="seconds per tower size run")
    ap.add_argument("--keys", type=int, default=120)
    ap.add_argument("--requests", type=int, default=360)
    ap.add_argument("--burst-images", type=int, default=10)
    ap.add_argument("--out", default=None, help="[BUILD/bench-results/l3.json]")
    ap.add_argument("--docs-copy", default=os.path.join(REPO, "docs", "BENCHMARKS-l3.json"))
    ap.add_argument("--render", metavar="JSON", help="print the markdown of this file and exit")
    ap.add_argument("--merge", action="store_true",
                    help="keep the parts not run from the existing --out file (rerun one part)")
    args = ap.parse_args()
    if args.render:
        with open(args.render) as f:
            print(render_body(json.load(f)))
        return 0
    build = os.path.abspath(args.build)
    os.environ.setdefault("EPD_BUILD_DIR", build)
    sys.path.insert(0, os.path.join(build, "python"))  # epd.client
    import cluster_harness as ch

    reason = ch.missing_reason()
    if reason:
        print(f"cluster_bench: {reason}", file=sys.stderr)
        return 1
    out = args.out or os.path.join(build, "bench-results", "l3.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    parts = set(args.parts.split(","))
    t0 = time.monotonic()
    redis_v = subprocess.run([ch.redis_binary(), "--version"], capture_output=True, text=True).stdout
    data = {"schema": SCHEMA, "meta": {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}",
        "redis_version": next((w.split("=")[1] for w in redis_v.split() if w.startswith("v=")), "?"),
        "load_before": loadavg()}}
    if args.merge and os.path.isfile(out):
        with open(out) as f:
            old = json.load(f)
        for part in ("micro", "sizes", "cluster"):
            if part not in parts and part in old:
                data[part] = old[part]
        data["meta"]["merged_from"] = old["meta"]
    if "micro" in parts:
        data["micro"] = run_micro(build, args.samples)
    if "sizes" in parts:
        data["sizes"] = run_sizes(build, args.duration_s, args.tower_duration_s)
    if "cluster" in parts:
        data["cluster"] = run_cluster(args.keys, args.requests, args.burst_images)
    data["meta"]["parts"] = sorted(parts)
    data["meta"]["load_after"] = loadavg()
    data["meta"]["wall_s"] = round(time.monotonic() - t0)
    with open(out, "w") as f:
        json.dump(data, f, indent=1)
    if args.docs_copy:
        with open(args.docs_copy, "w") as f:
            json.dump(data, f, indent=1)
    print(render_body(data))
    for t in targets(data):
        print("target", "MET   " if t[3] else "MISSED", t[0], "|", t[2])
    return 0


if __name__ == "__main__":
    sys.exit(main())

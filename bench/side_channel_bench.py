#!/usr/bin/python3
"""The shared-cache timing channel, measured (issue 25, docs/SECURITY.md).

A victim tenant sends a fresh image X, or does not, by a fair coin; an
attacker tenant then sends X and times the reply (wall time at the Python
client, one call, nothing else in flight from the bench). Per channel and
per setting, TRIALS trials per arm (victim sent / did not), arms
interleaved at random so that drift in the machine's load hits both alike.

Channels (real `epd-encode serve` processes on loopback, the tiny tower;
every probe image is PROBE_SIDE x PROBE_SIDE, JOIN_SIDE for the joins, so
that a miss costs the tiny tower tens of ms, as a real tower's ~100 ms
miss dwarfs a hit; at 56 x 56 a miss was ~4 ms against a ~1.5 ms hit and
the two overlapped on a loaded machine):
  l1      the victim's encode completed; the attacker's call finds it in L1;
  l2      the same on a server whose L1 holds no entry (--cache-mb 0.0005),
          so a completed encode is held in L2 (the control's `source` says
          which tier answered; reported);
  join    the victim's call is in flight (the attacker's call is sent
          JOIN_FRACTION = 0.7 x a miss's median time after it, measured in
          the warm-up, so a joined probe waits for the last ~0.3 of a miss
          and a probe late enough finds the finished entry in L1, which is
          the same channel; at 0.5 the two arms' tails crossed on a loaded
          machine): the attacker joins it or not. The victim's call also
          keeps the tower busy, which the attacker sees whatever the keys:
          so
  join-matched  the same, except that in the "not sent" arm the victim
          sends another fresh image Y at the same moment: equal load in
          both arms, so what is left is the content (the join) alone;
  l3      a two-server cluster on one real redis-server: the victim's
          encode completed on server 1 (its L3 write awaited), the
          attacker calls server 2.
Settings:
  salted    --tenant-isolation salted: victim and attacker are two tenants;
  none      --tenant-isolation none: today's exposure;
  control   salted, the probe sent with the victim's own token: the same
            measurement within one tenant, which must distinguish (>= 0.9)
            or the measurement proves nothing.
  salted-floor, control-floor
            the same, on servers run with --miss-reply-floor-ms
            MISS_FLOOR_MS (--miss-floor-ms): a miss's reply waits until the
            floor, so that it takes the same time whether or not the victim
            keeps the tower busy; hits and joins are not held, so the
            control (a join within the victim's tenant) still distinguishes.

Statistic: the distinguishing advantage max_t |F_sent(t) - F_not(t)| over
thresholds t (the two-sample Kolmogorov-Smirnov statistic D), a bootstrap
95 % interval (2000 resamples of each arm, percentile), and the KS test's
asymptotic p-value, Q_KS(sqrt(n_e) * D) with n_e = n*m/(n+m) and
Q_KS(x) = 2 * sum_{k>=1} (-1)^(k-1) exp(-2 k^2 x^2) (Kolmogorov's limit
distribution; Numerical Recipes, section 14.3, gives the same series).
Written here, no SciPy. Note the floor: with 250 a side, D of two samples of
ONE distribution has median about 0.83 * sqrt(2/250) = 0.074, so an
advantage near 0.07 with a large p-value is what no leak looks like.

Also the cost of salting on the hit path: p50 of an L1 hit (the same image
sent again by its own tenant) with isolation salted vs none, one run each,
side by side.

--large-trials N adds, after the main rows, the salted arms of
--large-channels with N trials per arm: at N = 1000 the null's median D is
about 0.83 * sqrt(2/1000) = 0.037, so an advantage <= 0.05 can be resolved.
Each row records its trials, the load average when it started, and the
latency quantiles of both arms.

Writes BUILD/bench-results/side_channel.json and prints the markdown table
docs/SECURITY.md quotes. --render prints the table of a JSON file.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import math
import os
import platform
import random
import stat
import struct
import sys
import tempfile
import time
import uuid
import zlib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
SCHEMA = "epd-bench-side-channel/1"
JOIN_FRACTION = 0.7
MISS_FLOOR_MS = 400  # the -floor settings' --miss-reply-floor-ms: above a 448-px miss's p99 under load (~200 ms)
PROBE_SIDE = 448  # l1, l2, l3: a tiny-tower miss of ~30-40 ms on an idle core, 256 post-merge tokens
JOIN_SIDE = 448   # the joins too (672 took 5 min a row on this loaded machine)
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)

TOKENS = {"victim": "tok-victim-0001", "attacker": "tok-attacker-0002", "ops": "tok-ops-0003"}


def ks_statistic(a, b):
    """max over thresholds of |F_a - F_b| (two-sample KS D)."""
    xs = sorted(set(a) | set(b))
    sa, sb = sorted(a), sorted(b)
    ia = ib = 0
    d = 0.0
    for x in xs:
        while ia < len(sa) and sa[ia] <= x:
            ia += 1
        while ib < len(sb) and sb[ib] <= x:
            ib += 1
        d = max(d, abs(ia / len(sa) - ib / len(sb)))
    return d


def ks_pvalue(d, n, m):
    """Kolmogorov's asymptotic two-sample p-value for statistic d."""
    ne = n * m / (n + m)
    x = math.sqrt(ne) * d
    if x < 1e-3:
        return 1.0
    s = 0.0
    for k in range(1, 200):
        term = 2 * (-1) ** (k - 1) * math.exp(-2 * k * k * x * x)
        s += term
        if abs(term) < 1e-12:
            break
    return min(1.0, max(0.0, s))


def bootstrap_ci(a, b, rounds=2000, seed=7):
    rng = random.Random(seed)
    ds = sorted(ks_statistic([rng.choice(a) for _ in a], [rng.choice(b) for _ in b]) for _ in range(rounds))
    return ds[int(0.025 * rounds)], ds[int(0.975 * rounds) - 1]


def analyse(sent, not_sent):
    d = ks_statistic(sent, not_sent)
    lo, hi = bootstrap_ci(sent, not_sent)
    return {"advantage": d, "ci95": [lo, hi], "p_value": ks_pvalue(d, len(sent), len(not_sent)),
            "n_sent": len(sent), "n_not": len(not_sent),
            "p50_sent_ms": 1e3 * sorted(sent)[len(sent) // 2], "p50_not_ms": 1e3 * sorted(not_sent)[len(not_sent) // 2],
            "quantiles": list(QUANTILES), "quantiles_sent_ms": quantiles_ms(sent),
            "quantiles_not_ms": quantiles_ms(not_sent)}


def quantiles_ms(v):
    v = sorted(v)
    return [round(1e3 * v[min(len(v) - 1, int(q * len(v)))], 3) for q in QUANTILES]


class Cluster:
    """One or two servers sharing flags (and a redis-server for l3)."""

    def __init__(self, h, rh, flags, n=1, redis=None):
        self.h = h
        self.procs, self.ports = [], []
        extra = list(flags)
        if redis is not None:
            extra += ["--l3", redis.url, "--l3-timeout-ms", "500", "--l3-lease-ms", "20000"]
        for i in range(n):
            proc, port, _ = h.start_server(h.tiny_serve_args() + ["--server-id", f"s{i}"] + extra)
            self.procs.append(proc)
            self.ports.append(port)

    def close(self):
        for p in self.procs:
            self.h.stop_server(p)


def fresh(base: bytes, tag: str) -> bytes:
    """`base` (a PNG) with a tEXt chunk naming `tag` before IEND: the same
    pixels, bytes (so a content key) never sent before."""
    data = b"epd\x00" + tag.encode()
    chunk = struct.pack(">I", len(data)) + b"tEXt" + data + struct.pack(">I", zlib.crc32(b"tEXt" + data) & 0xFFFFFFFF)
    return base[:-12] + chunk + base[-12:]


def clients(ec, port):
    return {t: ec.EncodeClient(f"127.0.0.1:{port}", timeout=60, auth_token=tok) for t, tok in TOKENS.items()}


def timed(c, image):
    t0 = time.perf_counter()
    r = c.encode([image])[0]
    return time.perf_counter() - t0, r.source


def encode_seconds(c, image):
    """The worker's time for one item, arrival -> ready (EncodedItem.total_ms),
    which a reply held by --miss-reply-floor-ms does not show."""
    return c.encode([image])[0].total_ms / 1e3


def run_channel(h, ec, channel, setting, trials, files, redis, seed_base):
    floored = setting.endswith("-floor")
    setting = setting.removesuffix("-floor")
    isolation = "none" if setting == "none" else "salted"
    flags = ["--tokens-file", files["tokens"], "--tenant-secret-file", files["secret"], "--tenant-isolation", isolation]
    if floored:
        flags += ["--miss-reply-floor-ms", str(MISS_FLOOR_MS)]
    if channel == "l2":
        flags += ["--cache-mb", "0.0005", "--host-cache-mb", "1024"]
    n = 2 if channel == "l3" else 1  # (the join channels: one server)
    cluster = Cluster(h, None, flags, n, redis if channel == "l3" else None)
    try:
        near = clients(ec, cluster.ports[0])
        far = clients(ec, cluster.ports[-1])
        prober = "victim" if setting == "control" else "attacker"
        joining = channel.startswith("join")
        side = JOIN_SIDE if joining else PROBE_SIDE
        base = h.png(side, side, seed_base % 251)
        run = uuid.uuid4().hex
        # Warm up both tenants' paths (connections, Health, the tower).
        for i in range(5):
            timed(near["victim"], fresh(base, f"{run}-warm-v{i}"))
            timed(far[prober], fresh(base, f"{run}-warm-p{i}"))
        # A floored miss's wall time is the floor: time the encode itself
        # (arrival -> ready at the worker), which is what a join waits on.
        calib = encode_seconds if floored else (lambda c, x: timed(c, x)[0])
        delay = JOIN_FRACTION * sorted(calib(near["victim"], fresh(base, f"{run}-t{i}")) for i in range(5))[2]
        rng = random.Random(seed_base)
        arms = [True] * trials + [False] * trials
        rng.shuffle(arms)
        sent, not_sent, sources = [], [], {}
        pool = cf.ThreadPoolExecutor(1)
        for i, victim_sends in enumerate(arms):
            x = fresh(base, f"{run}-{i}")
            fut = None
            if joining and (victim_sends or channel == "join-matched"):
                fut = pool.submit(timed, near["victim"], x if victim_sends else fresh(base, f"{run}-{i}-other"))
                time.sleep(delay)
            elif joining:
                time.sleep(delay)
            elif victim_sends:
                before = cluster_writes(near) if channel == "l3" else 0
                timed(near["victim"], x)
                if channel == "l3":  # the value is in Redis before the probe
                    deadline = time.monotonic() + 10
                    while cluster_writes(near) <= before and time.monotonic() < deadline:
                        time.sleep(0.002)
            dt, src = timed(far[prober], x)
            if fut is not None:
                fut.result()
            (sent if victim_sends else not_sent).append(dt)
            if victim_sends:
                sources[src] = sources.get(src, 0) + 1
        pool.shutdown()
        for c in list(near.values()) + list(far.values()):
            c.close()
        out = analyse(sent, not_sent)
        out["probe_sources_when_sent"] = sources
        if joining:
            out["join_delay_ms"] = 1e3 * delay
        if floored:
            out["miss_floor_ms"] = MISS_FLOOR_MS
        return out
    finally:
        cluster.close()


def cluster_writes(c):
    """Writes the near server has made so far (every victim image is one)."""
    return c["ops"].stats()["l3_counters"].get("writes", 0)


def hit_cost(h, ec, files, n=500):
    """p50/p90 of an L1 hit by its own tenant, isolation none vs salted: two
    servers up at once, calls alternated, so both see the same load."""
    out, cls, cs = {}, {}, {}
    try:
        for iso in ("none", "salted"):
            cls[iso] = Cluster(h, None, ["--tokens-file", files["tokens"], "--tenant-secret-file", files["secret"],
                                         "--tenant-isolation", iso])
            cs[iso] = clients(ec, cls[iso].ports[0])["victim"]
        img = h.png(56, 56, 77)
        ts = {iso: [] for iso in cs}
        for iso in cs:
            for _ in range(20):
                timed(cs[iso], img)
        for _ in range(n):
            for iso in cs:
                ts[iso].append(timed(cs[iso], img)[0])
        for iso, v in ts.items():
            v.sort()
            out[iso] = {"p50_ms": 1e3 * v[n // 2], "p90_ms": 1e3 * v[int(0.9 * n)], "n": n}
        for c in cs.values():
            c.close()
        return out
    finally:
        for cl in cls.values():
            cl.close()


def write_files(d):
    tokens = os.path.join(d, "tokens")
    with open(tokens, "w") as f:
        f.write(f"{TOKENS['victim']} victim\n{TOKENS['attacker']} attacker\n{TOKENS['ops']} ops operator\n")
    secret = os.path.join(d, "secret")
    with open(secret, "wb") as f:
        f.write(os.urandom(32))
    for p in (tokens, secret):
        os.chmod(p, stat.S_IRUSR | stat.S_IWUSR)
    return {"tokens": tokens, "secret": secret}


def render(data):
    lines = ["| channel | setting | trials per arm | advantage (KS D) | bootstrap 95 % | KS p-value | "
             "p50 sent / not (ms) | p90 sent / not (ms) | probe's source when sent |",
             "|---|---|---|---|---|---|---|---|---|"]
    data = dict(data)
    for row in data["rows"]:
        r = row["result"]
        p90 = (f"{r['quantiles_sent_ms'][QUANTILES.index(0.9)]:.2f} / {r['quantiles_not_ms'][QUANTILES.index(0.9)]:.2f}"
               if "quantiles_sent_ms" in r else "")
        lines.append(f"| {row['channel']} | {row['setting']} | {row.get('trials', data['trials'])} | "
                     f"{r['advantage']:.3f} | "
                     f"[{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}] | {r['p_value']:.3g} | "
                     f"{r['p50_sent_ms']:.2f} / {r['p50_not_ms']:.2f} | {p90} | "
                     f"{', '.join(f'{k} {v}' for k, v in sorted(r['probe_sources_when_sent'].items()))} |")
    if data.get("hit_cost"):
        hc = data["hit_cost"]
        lines += ["", "| L1 hit, own tenant | p50 (ms) | p90 (ms) | calls |", "|---|---|---|---|"]
        for k in ("none", "salted"):
            lines.append(f"| isolation {k} | {hc[k]['p50_ms']:.3f} | {hc[k]['p90_ms']:.3f} | {hc[k]['n']} |")
    lines += ["", f"Machine: {data['machine']}; load average before/after: {data['load_before']} / "
              f"{data['load_after']}; {data['trials']} trials per arm in the main rows."]
    return "\n".join(lines)


def save(data, out):
    data["load_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(data, f, indent=1)


def main() -> int:
    global PROBE_SIDE, JOIN_SIDE, JOIN_FRACTION, MISS_FLOOR_MS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--trials", type=int, default=250)
    ap.add_argument("--channels", default="l1,l2,join,join-matched,l3")
    ap.add_argument("--settings", default="salted,none,control")
    ap.add_argument("--large-trials", type=int, default=0,
                    help="then the salted arms of --large-channels with this many trials per arm (0: none)")
    ap.add_argument("--large-channels", default="l1,l2,join-matched,l3")
    ap.add_argument("--large-setting", default="salted", help="the setting of the --large-trials rows")
    ap.add_argument("--miss-floor-ms", type=int, default=MISS_FLOOR_MS,
                    help="--miss-reply-floor-ms of the servers of the -floor settings")
    ap.add_argument("--no-hit-cost", action="store_true", help="skip the salting cost on the hit path")
    ap.add_argument("--probe-side", type=int, default=PROBE_SIDE, help="l1/l2/l3 probe images' side, pixels")
    ap.add_argument("--join-side", type=int, default=JOIN_SIDE, help="join probe images' side, pixels")
    ap.add_argument("--join-fraction", type=float, default=JOIN_FRACTION,
                    help="the join probe is sent this fraction of a miss's median after the victim's call")
    ap.add_argument("--render", help="print the table of this JSON file")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    PROBE_SIDE, JOIN_SIDE, JOIN_FRACTION = args.probe_side, args.join_side, args.join_fraction
    MISS_FLOOR_MS = args.miss_floor_ms
    if args.render:
        with open(args.render) as f:
            print(render(json.load(f)))
        return 0
    os.environ.setdefault("EPD_BUILD_DIR", args.build)
    sys.path.insert(0, os.path.join(args.build, "python"))
    import redis_harness as rh
    import server_harness as h
    from epd import client as ec
    data = {"schema": SCHEMA, "machine": f"{platform.node()} {os.cpu_count()} cores",
            "load_before": " ".join(f"{x:.2f}" for x in os.getloadavg()), "trials": args.trials,
            "probe_side": PROBE_SIDE, "join_side": JOIN_SIDE, "join_fraction": JOIN_FRACTION, "rows": []}
    out = args.out or os.path.join(args.build, "bench-results", "side_channel.json")
    d = tempfile.mkdtemp(prefix="epd-side-")
    files = write_files(d)
    redis = None
    try:
        if "l3" in args.channels.split(",") + (args.large_channels.split(",") if args.large_trials else []):
            redis = rh.RedisServer()
            redis.start()
        seed = 10_000
        plan = [(c, st, args.trials) for c in args.channels.split(",") for st in args.settings.split(",")]
        plan.append(None)  # the hit cost, between the main and the large rows
        if args.large_trials:
            plan += [(c, args.large_setting, args.large_trials) for c in args.large_channels.split(",")]
        for step in plan:
            if step is None:
                if not args.no_hit_cost:
                    data["hit_cost"] = hit_cost(h, ec, files)
                continue
            channel, setting, trials = step
            seed += 10_000
            t0 = time.time()
            load = " ".join(f"{x:.2f}" for x in os.getloadavg())
            r = run_channel(h, ec, channel, setting, trials, files, redis, seed)
            print(f"{channel:5s} {setting:13s} n={trials} D={r['advantage']:.3f} CI={r['ci95'][0]:.3f}.."
                  f"{r['ci95'][1]:.3f} p={r['p_value']:.3g} p50={r['p50_sent_ms']:.1f}/{r['p50_not_ms']:.1f} ms "
                  f"sources={r['probe_sources_when_sent']} load={load} ({time.time() - t0:.0f} s)", flush=True)
            data["rows"].append({"channel": channel, "setting": setting, "trials": trials, "load_at_start": load,
                                 "result": r})
            save(data, out)  # after each row: a run stopped early keeps what it measured
    finally:
        if redis is not None:
            redis.close()
    save(data, out)
    print(render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())

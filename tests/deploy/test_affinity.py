#!/usr/bin/env python3
"""Scale-out behind nginx (deploy/nginx/run-local.sh): 3 servers, hash
affinity on the content key.

Shows, on real processes:
  1. affinity: every key is served by exactly one server (server_id in each
     EncodedItem), while round robin spreads keys over servers;
  2. hit rate: on the same kind of Zipf trace (two image sets with identical
     popularity, so neither run warms the other's cache), the aggregate hit
     rate through the affinity front is higher than through round robin;
  3. failover: after one server stops, every request still succeeds, keys
     owned by the live servers stay where they were, and exactly the stopped
     server's keys (about a third) move.

Caches are sized to hold ~30 of the tiny tower's 2 KiB embeddings per server
(--cache-mb 0.06, no L2), well under the 150 keys of the trace, so where a key
goes decides whether it hits. Exit 77 (CTest SKIP_RETURN_CODE) when the
binaries are not built.
"""

import os
import random
import shutil
import socket
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
import child_process  # noqa: E402
import server_harness as h  # noqa: E402

RUN_LOCAL = os.path.join(h.REPO, "deploy", "nginx", "run-local.sh")
KEYS = 150
REQUESTS = 600
ZIPF_S = 1.0


def consecutive_free_ports(n):
    """A base port with n consecutive free loopback ports after it."""
    rng = random.Random(os.getpid())
    for _ in range(200):
        base = rng.randrange(20000, 45000)
        socks = []
        try:
            for i in range(n):
                s = socket.socket()
                s.bind(("127.0.0.1", base + i))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no block of free ports")


def zipf_trace(n_keys, n_requests, s, seed):
    rng = random.Random(seed)
    weights = [1.0 / (r + 1) ** s for r in range(n_keys)]
    return rng.choices(range(n_keys), weights=weights, k=n_requests)


def run_trace(client, images, trace):
    """Sends one request per trace entry; returns [(key index, result)]."""
    out = []
    for k in trace:
        [r] = client.encode([images[k]])
        out.append((k, r))
    return out


def hit_rate(results):
    return sum(r.source in ("l1", "l2") for _, r in results) / len(results)


def main():
    reason = h.missing_reason()
    if reason:
        print(f"SKIP: {reason}")
        return 77
    try:
        from epd import client as ec
    except ImportError as e:
        print(f"SKIP: epd.client is not importable ({e}); build target epd_python_stubs")
        return 77

    base = consecutive_free_ports(5)
    servers_base, front, rr = base, base + 3, base + 4
    state = tempfile.mkdtemp(prefix="epd-affinity-")
    env = dict(os.environ, EPD_ENCODE_BIN=h.encode_binary())
    # run-local.sh leaves its servers and nginx detached: if this test is
    # killed, the watchdog stops them.
    cleanup = child_process.on_death([RUN_LOCAL, "stop", "--dir", state])

    def local(*args):
        child_process.run([RUN_LOCAL, *args, "--dir", state], check=True, env=env, timeout=120)

    t0 = time.monotonic()
    child_process.run([RUN_LOCAL, "start", "--dir", state, "--servers", "3", "--base-port", str(servers_base),
                    "--front-port", str(front), "--rr-port", str(rr), "--"] + h.tiny_serve_args() +
                   ["--cache-mb", "0.06", "--host-cache-mb", "0"], check=True, env=env, timeout=180)
    failures = []

    def check(cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            failures.append(what)

    try:
        # Distinct images for the two runs, same popularity law.
        images_a = [h.png(56, 56, 1000 + i) for i in range(KEYS)]
        images_b = [h.png(56, 56, 5000 + i) for i in range(KEYS)]
        trace = zipf_trace(KEYS, REQUESTS, ZIPF_S, seed=7)

        with ec.EncodeClient(f"127.0.0.1:{front}", timeout=30) as c:
            affinity = run_trace(c, images_a, trace)
        with ec.EncodeClient(f"127.0.0.1:{rr}", timeout=30) as c:
            robin = run_trace(c, images_b, trace)

        owner = {}
        spread_ok = True
        for k, r in affinity:
            spread_ok &= owner.setdefault(k, r.server_id) == r.server_id
        check(spread_ok, "affinity: each key was always served by the same server")
        servers_used = sorted(set(owner.values()))
        check(len(servers_used) == 3, f"affinity: keys spread over all 3 servers {servers_used}")
        rr_servers = {}
        for k, r in robin:
            rr_servers.setdefault(k, set()).add(r.server_id)
        check(any(len(s) > 1 for s in rr_servers.values()), "round robin: keys are spread over servers")

        hr_aff, hr_rr = hit_rate(affinity), hit_rate(robin)
        print(f"aggregate hit rate on a Zipf({ZIPF_S}) trace of {REQUESTS} requests over {KEYS} keys: "
              f"affinity {hr_aff:.3f}, round robin {hr_rr:.3f}")
        check(hr_aff > hr_rr, "affinity hit rate > round-robin hit rate")

        # Failover: stop encoder-1, send every key of the affinity run again.
        local("stop-server", "1")
        with ec.EncodeClient(f"127.0.0.1:{front}", timeout=30) as c:
            after = {k: c.encode([images_a[k]], check=False)[0] for k in sorted(owner)}
        check(all(r.ok for r in after.values()), "failover: every request succeeded with one server down")
        moved = {k for k, r in after.items() if r.server_id != owner[k]}
        owned_by_stopped = {k for k, s in owner.items() if s == "encoder-1"}
        check(moved == owned_by_stopped, "failover: exactly the stopped server's keys moved")
        check(all(r.server_id != "encoder-1" for r in after.values()), "failover: nothing served by the stopped server")
        frac = len(moved) / len(owner)
        print(f"failover: {len(moved)} of {len(owner)} keys remapped ({frac:.2f}; the stopped server owned them)")
        check(0.15 < frac < 0.55, "failover: about a third of the keys moved")
    finally:
        child_process.run([RUN_LOCAL, "stop", "--dir", state], env=env, timeout=120)
        child_process.forget(cleanup)
        print(f"took {time.monotonic() - t0:.1f} s")
    if failures:
        for log in sorted(os.listdir(os.path.join(state, "logs"))):
            with open(os.path.join(state, "logs", log), errors="replace") as f:
                print(f"--- {log} (tail)\n" + "".join(f.readlines()[-20:]))
    shutil.rmtree(state, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

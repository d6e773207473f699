#!/usr/bin/env python3
"""A server restarted mid-trace (issue 14, section 3): 3 encode servers behind
nginx sharing one L3 (a redis-server of the test's own).

A client thread replays a trace over a fixed set of distinct images through
the nginx front, pass after pass. After the first pass (which warms the
cluster and L3), the main thread restarts s1 (SIGTERM by PID, then a fresh
process on the same port, with empty L1/L2) while the trace keeps going, and
lets the trace run until nginx sends s1 traffic again.

Checks:
  - no request fails, during the restart or after it;
  - after the warm-up the tower never runs again anywhere: the keys nginx
    sends elsewhere while s1 is down, and s1's own keys when it is back, are
    served from L3 (hits continue);
  - the restarted s1 serves L3 hits and runs no tower;
  - every answer carries the bytes the tower produced during the warm-up.

No timing is asserted (the trace runs until s1 has served traffic again, with
a generous deadline only against a hang). Exit 77 (CTest SKIP_RETURN_CODE)
when the binaries, redis-server or nginx are missing.
"""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
import cluster_harness as ch  # noqa: E402
import server_harness as h  # noqa: E402

KEYS = 60
SERVE = ["--cache-mb", "8", "--host-cache-mb", "0", "--grace-s", "10"]
# nginx marks a server that refused a connection as down for fail_timeout
# (10 s in deploy/nginx/nginx.conf.template), so s1 sees traffic again only
# after that; the trace goes on until then, bounded by this (a hang guard).
DEADLINE_S = 180

check = ch.Checks()


class TraceThread(threading.Thread):
    """Sends the images in order, pass after pass, until stopped; records
    (pass, key, result) for each request."""

    def __init__(self, cluster, images):
        super().__init__(daemon=True)
        self.cluster, self.images = cluster, images
        self.results = []
        self.passes = 0
        self.stop_after_pass = threading.Event()
        self.error = None

    def run(self):
        try:
            with self.cluster.client(timeout=60) as cl:
                while not self.stop_after_pass.is_set():
                    for k, img in enumerate(self.images):
                        r = cl.encode([img], check=False)[0]
                        self.results.append((self.passes, k, r))
                    self.passes += 1
        except Exception as e:  # noqa: BLE001 - reported by the main thread
            self.error = e


def main():
    status = ch.preflight(serve_flags=[ch.L3_FLAGS["url"]])
    if status is not None:
        return status
    t0 = time.monotonic()
    images = ch.distinct_images(KEYS, side=56, base_seed=300)
    with ch.Cluster(h.tiny_serve_args() + SERVE, l3=True) as c:
        with c.logs_on_failure(check):
            c.start_servers(["s0", "s1", "s2"])
            c.start_nginx()
            trace = TraceThread(c, images)
            trace.start()
            while trace.passes < 1 and trace.is_alive():
                time.sleep(0.05)
            warm = {k: r for p, k, r in trace.results if p == 0}
            check(len(warm) == KEYS and all(r.ok for r in warm.values()), "warm-up pass: every request succeeded")
            n = c.wait_l3_entries(KEYS, pattern="*v:*")
            check(n == KEYS, f"every key is in L3 after the warm-up ({n})")
            s1_keys = {k for k, r in warm.items() if r.server_id == "s1"}
            check(len(s1_keys) > 0, f"s1 owns keys ({len(s1_keys)})")
            warm_misses = c.total("misses")
            check(warm_misses == KEYS, f"the warm-up ran the tower once per key ({warm_misses})")

            # Restart s1 while the trace runs.
            mark = len(trace.results)
            rc = c.stop_server("s1")
            check(rc == 0, f"s1 stopped cleanly on SIGTERM (exit {rc})")
            stopped_at = len(trace.results)
            time.sleep(0.5)  # a few requests while s1 is gone
            down_end = len(trace.results)  # before the new process exists
            c.start_server("s1")
            restarted_at = len(trace.results)
            print(f"s1 restarted: requests {mark}..{stopped_at} during its shutdown, "
                  f"{stopped_at}..{restarted_at} while it was down or starting", flush=True)

            # Until s1 has served a few of its keys again (from L3).
            deadline = time.monotonic() + DEADLINE_S
            while time.monotonic() < deadline and trace.is_alive():
                if sum(1 for _, _, r in trace.results[restarted_at:] if r.server_id == "s1") >= 2 * len(s1_keys):
                    break
                time.sleep(0.2)
            trace.stop_after_pass.set()
            trace.join(timeout=120)
            check(trace.error is None, f"the trace thread ended without an exception ({trace.error!r})")

            results = trace.results
            bad = [(p, k, r.code, r.message) for p, k, r in results if not r.ok]
            check(not bad, f"no request failed over {len(results)} requests, {trace.passes} passes "
                           f"(first failures: {bad[:3]})")
            later = results[len(warm):]
            check(all(r.source in ("l1", "l2", "l3") for _, _, r in later if r.ok),
                  "after the warm-up every answer was a hit (L1, L2 or L3)")
            check(all(r.main == warm[k].main for _, k, r in later if r.ok),
                  "every answer carries the warm-up's bytes")
            down = [r for _, _, r in results[stopped_at:down_end] if r.ok]
            check(all(r.server_id != "s1" for r in down), f"nothing was served by s1 while it was down "
                                                          f"({len(down)} requests)")
            moved_l3 = [r for _, k, r in results[mark:] if k in s1_keys and r.server_id != "s1" and r.ok]
            print(f"s1's keys served elsewhere meanwhile: {len(moved_l3)} "
                  f"({sum(r.source == 'l3' for r in moved_l3)} from L3)", flush=True)

            stats = c.stats()
            s1 = stats["s1"]
            print("s1 after restart:", {f: s1.get(f) for f in ("items", "hits_l1", "hits_l3", "misses", "joins")})
            check(int(s1.get("hits_l3", 0)) > 0, f"the restarted s1 served L3 hits ({s1.get('hits_l3')})")
            check(int(s1["misses"]) == 0, f"the restarted s1 ran no tower ({s1['misses']} misses)")
            served_by_s1 = [r for _, _, r in results[restarted_at:] if r.server_id == "s1"]
            check(len(served_by_s1) > 0, f"nginx sent s1 traffic again ({len(served_by_s1)} requests)")
            total = c.total("misses", stats)
            check(total == warm_misses, f"no tower run anywhere after the warm-up ({total - warm_misses} extra)")
    print(f"took {time.monotonic() - t0:.1f} s")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())

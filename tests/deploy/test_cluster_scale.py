#!/usr/bin/env python3
"""Scale event behind nginx (issue 14, section 3): 3 encode servers with
content-key affinity, warmed with a trace of distinct images; then a 4th
server is added and one removed (upstream rewritten, `nginx -s reload`), and
the trace is replayed.

Run twice on fresh clusters:
  - without L3: every key whose owner changed runs the tower again. The test
    checks that the tower runs after the change are exactly the keys that
    moved (from the server_id of each answer, before and after), and that
    they are a large share of the keys (the scale event costs about a third
    or more of the tower work it took to warm up);
  - with L3 (one redis-server of the test's own, --l3): the moved keys are
    served from L3, so tower runs after the change are <= 5% of the distinct
    keys; every moved key comes back as source "l3" with the same bytes the
    tower produced during the warm-up.

Caches hold every key (no capacity eviction), so where a key goes is the only
thing that decides a hit. No timing is asserted. Exit 77 (CTest
SKIP_RETURN_CODE) when the binaries, redis-server or nginx are missing;
`--no-l3` runs only the baseline.
"""

import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
import cluster_harness as ch  # noqa: E402
import server_harness as h  # noqa: E402

KEYS = 90
# L1 large enough for every key on one server (tiny tower: ~2 KiB each).
SERVE = ["--cache-mb", "8", "--host-cache-mb", "0"]

check = ch.Checks()


def warm_trace(n_keys, seed):
    """Every key once, in random order, then a second random pass."""
    rng = random.Random(seed)
    first, second = list(range(n_keys)), list(range(n_keys))
    rng.shuffle(first)
    rng.shuffle(second)
    return first + second


def run_scale(l3: bool, images):
    """Warm 3 servers, add s3 and remove s0, replay. Returns a dict of figures."""
    label = "L3" if l3 else "no L3"
    with ch.Cluster(h.tiny_serve_args() + SERVE, l3=l3) as c:
        with c.logs_on_failure(check):
            c.start_servers(["s0", "s1", "s2"])
            c.start_nginx(["s0", "s1", "s2"])
            owner, warm_bytes = {}, {}
            with c.client() as cl:
                for k in warm_trace(len(images), seed=11):
                    [r] = cl.encode([images[k]])
                    owner.setdefault(k, r.server_id)
                    warm_bytes.setdefault(k, r.main)
            before = c.stats()
            warm_tower = c.total("misses", before)
            check(warm_tower == len(images), f"{label}: warming ran the tower once per distinct key "
                                             f"({warm_tower} for {len(images)})")
            if l3:
                n = c.wait_l3_entries(len(images), pattern="*v:*")
                check(n == len(images), f"{label}: every key was written to L3 ({n} values)")

            # The scale event: s3 joins, s0 leaves.
            c.start_server("s3")
            c.set_upstream(["s1", "s2", "s3"])
            c.stop_server("s0")
            base = c.stats()

            after = {}
            with c.client() as cl:
                for k in range(len(images)):
                    after[k] = cl.encode([images[k]], check=False)[0]
            check(all(r.ok for r in after.values()), f"{label}: every request after the change succeeded")
            end = c.stats()
            tower = ch.field_delta(base, end, "misses")
            l3_hits = ch.field_delta(base, end, "hits_l3")
            moved = {k for k, r in after.items() if r.server_id != owner[k]}
            check(all(after[k].server_id != "s0" for k in after), f"{label}: nothing served by the removed server")
            check(any(after[k].server_id == "s3" for k in after), f"{label}: the added server took keys")
            check(moved >= {k for k, s in owner.items() if s == "s0"},
                  f"{label}: every key of the removed server moved")
            out = {"keys": len(images), "moved": len(moved), "tower_after": tower, "l3_hits_after": l3_hits}
            print(f"{label}: {len(moved)} of {len(images)} keys changed server; tower runs after the change: "
                  f"{tower} ({tower / len(images):.3f} of the distinct keys); L3 hits: {l3_hits}", flush=True)
            if not l3:
                check(tower == len(moved), f"{label}: the tower ran again for exactly the moved keys "
                                           f"({tower} runs, {len(moved)} moved)")
                check(len(moved) >= 0.2 * len(images),
                      f"{label}: the scale event moved a large share of the keys ({len(moved)}/{len(images)} >= 0.2)")
                check(all(after[k].source == ("miss" if k in moved else "l1") for k in after),
                      f"{label}: moved keys were misses, the others L1 hits")
            else:
                check(tower <= 0.05 * len(images), f"{label}: tower runs after the change <= 5% of the distinct "
                                                   f"keys ({tower} <= {0.05 * len(images):.1f})")
                check(l3_hits == len(moved), f"{label}: each moved key was an L3 hit ({l3_hits} hits, "
                                             f"{len(moved)} moved)")
                check(all(after[k].source == ("l3" if k in moved else "l1") for k in after),
                      f"{label}: moved keys came from L3, the others from L1")
                check(all(after[k].main == warm_bytes[k] for k in moved),
                      f"{label}: L3 served the bytes the tower produced during warm-up")
            return out


def main():
    only_baseline = "--no-l3" in sys.argv[1:]
    status = ch.preflight(need_redis=not only_baseline, serve_flags=[] if only_baseline else [ch.L3_FLAGS["url"]])
    if status is not None:
        return status
    t0 = time.monotonic()
    images = ch.distinct_images(KEYS, side=56)
    check(len({bytes(i) for i in images}) == KEYS, f"{KEYS} distinct images")
    base = run_scale(False, images)
    if not only_baseline:
        with_l3 = run_scale(True, images)
        check(with_l3["tower_after"] < base["tower_after"],
              f"L3 cut the tower runs after the change ({with_l3['tower_after']} < {base['tower_after']})")
    print(f"took {time.monotonic() - t0:.1f} s")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())

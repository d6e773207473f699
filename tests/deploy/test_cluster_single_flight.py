#!/usr/bin/env python3
"""Cluster-wide single flight (issue 14, section 2): the same image sent at
once to 3 encode servers directly (no nginx, so no affinity) runs the tower
once in the cluster.

3 servers share one L3 (a redis-server of the test's own). For each of
BURSTS distinct images, three client threads held at a barrier send the image
to s0, s1 and s2 at the same moment. With the cluster lease (the default),
one server takes it and encodes; the others wait for its value and serve it
from L3. Checks, per burst and in total:
  - all three answers succeed and carry the same bytes;
  - the servers' `misses` grow by exactly 1 per burst (tower_items too), and
    the two others are L3 hits;
  - the lease keys are gone once the values are written.

Control (so the check above can fail): the same bursts on a cluster with L3
but single flight off run the tower more than once per burst in total: the
three requests of a burst overlap (the image is large enough that the tower
takes tens of milliseconds), which is what the lease is there to join.

Exit 77 (CTest SKIP_RETURN_CODE) when the binaries or redis-server are
missing.
"""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
import cluster_harness as ch  # noqa: E402
import server_harness as h  # noqa: E402

BURSTS = 5
SIDE = 560  # tiny tower: 400 post-merge tokens, tens of ms in the tower
SERVE = ["--cache-mb", "32", "--host-cache-mb", "0"]
NAMES = ["s0", "s1", "s2"]

check = ch.Checks()


def burst(cluster, clients, image):
    """Sends `image` to every server at once; returns their results."""
    barrier = threading.Barrier(len(clients))
    out = [None] * len(clients)

    def send(i):
        barrier.wait()
        out[i] = clients[i].encode([image], check=False)[0]

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def run(single_flight: bool, images, warmup):
    label = "single flight" if single_flight else "no single flight"
    l3_args = ch.PATIENT_L3 if single_flight else ch.NO_SINGLE_FLIGHT + ch.PATIENT_L3
    with ch.Cluster(h.tiny_serve_args() + SERVE, l3=True, l3_args=l3_args) as c:
        with c.logs_on_failure(check):
            c.start_servers(NAMES)
            clients = [c.client(c.servers[n].address) for n in NAMES]
            try:
                # The tower's first calls are slow (TorchScript profiling runs):
                # one small image per server first, so bursts measure steady state.
                for i, cl in enumerate(clients):
                    cl.encode([warmup[i]])
                base = c.total("misses")
                per_burst = []
                for image in images:
                    before = c.stats()
                    rs = burst(c, clients, image)
                    after = c.stats()
                    misses, towers, l3 = (ch.field_delta(before, after, f, NAMES)
                                          for f in ("misses", "tower_items", "hits_l3"))
                    per_burst.append((misses, towers, l3, [r.source for r in rs]))
                    check(all(r.ok for r in rs), f"{label}: the 3 requests of a burst succeeded "
                                                 f"({[(r.code, r.message) for r in rs if not r.ok]})")
                    check(len({r.main for r in rs if r.ok}) == 1, f"{label}: the 3 answers carry the same bytes")
                total = c.total("misses") - base
            finally:
                for cl in clients:
                    cl.close()
            print(f"{label}: per burst (misses, tower items, L3 hits, sources): {per_burst}", flush=True)
            if single_flight:
                check(all(m == 1 and t == 1 and l3 == 2 for m, t, l3, _ in per_burst),
                      f"{label}: every burst ran the tower once in the cluster, the 2 others were L3 hits")
                check(total == len(images), f"{label}: {total} tower runs for {len(images)} distinct images")
                leases = c.redis.keys("*lease:*")
                check(not leases, f"{label}: no lease left in Redis ({len(leases)})")
            return total


def main():
    status = ch.preflight(need_nginx=False, serve_flags=[ch.L3_FLAGS["url"], ch.L3_FLAGS["lease_ms"]])
    if status is not None:
        return status
    t0 = time.monotonic()
    images = ch.distinct_images(BURSTS, side=SIDE, base_seed=700)
    warmup = ch.distinct_images(len(NAMES), side=64, base_seed=900)
    with_sf = run(True, images, warmup)
    without = run(False, images, warmup)
    print(f"tower runs for {BURSTS} images each sent to 3 servers at once: {with_sf} with single flight, "
          f"{without} without", flush=True)
    check(without > BURSTS, f"control: without single flight the bursts overlapped and ran the tower more than "
                            f"once per image ({without} > {BURSTS})")
    print(f"took {time.monotonic() - t0:.1f} s")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A short load test of a real `epd-encode serve` with `epd-encode bench-server`
(about 10 s): hit-only closed loop, then an open-loop mixed Zipf trace.

Checks correctness under load, not speed (no timing assertions): no errors;
in the hit-only run every measured request is an L1 hit, and the server's own
Prometheus counter epd_cache_hits_total{tier="l1"} grew by exactly the number
of requests bench-server reports (plus the warm-up hits of its further connections); the mixed run sees both hits and misses;
bench-server refuses a non-loopback target. Exit 77 when not built.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "tests", "python"))
import server_harness as h  # noqa: E402


def metric(port, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    m = re.search("^" + re.escape(name) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def bench(port, *args):
    r = subprocess.run([h.encode_binary(), "bench-server", "--server", f"127.0.0.1:{port}", "--json", *args],
                       capture_output=True, text=True, timeout=120)
    print(r.stdout.strip())
    if r.returncode != 0:
        print(r.stderr, file=sys.stderr)
    return r.returncode, (json.loads(r.stdout) if r.stdout.strip() else {})


def main():
    reason = h.missing_reason()
    if reason:
        print(f"SKIP: {reason}")
        return 77
    failures = []

    def check(cond, what):
        print(("ok   " if cond else "FAIL ") + what)
        if not cond:
            failures.append(what)

    r = subprocess.run([h.encode_binary(), "bench-server", "--server", "10.1.2.3:50051", "--duration-s", "1"],
                       capture_output=True, text=True, timeout=30)
    check(r.returncode != 0 and "loopback" in r.stderr, "bench-server refuses a non-loopback target")

    proc, port, metrics_port = h.start_server(h.tiny_serve_args() + ["--metrics-port", "0", "--cache-mb", "8"])
    try:
        hits_before = metric(metrics_port, 'epd_cache_hits_total{tier="l1"}') or 0.0
        rc, hit = bench(port, "--hit-only", "--concurrency", "4", "--duration-s", "4", "--synthetic", "16",
                        "--image-size", "112")
        # The warm-up sends every image once through each connection: the
        # first connection's calls miss, the others' hit (not measured, but
        # counted by the server).
        warm_hits = (hit.get("connections", 1) - 1) * hit.get("images", 0)
        # The worker publishes its counters after the loop iteration that
        # served the last request; give it a moment.
        for _ in range(100):
            hits_after = metric(metrics_port, 'epd_cache_hits_total{tier="l1"}')
            if hits_after - hits_before == hit.get("requests") + warm_hits:
                break
            time.sleep(0.02)
        check(rc == 0 and hit.get("errors") == 0, "hit-only run: no errors")
        check(hit.get("requests", 0) > 0, "hit-only run: requests were served")
        check(hit.get("sources") == {"l1": hit.get("requests")}, "hit-only run: every request was an L1 hit")
        check(hits_after - hits_before == hit.get("requests") + warm_hits,
              "server's L1 hit counter grew by exactly the requests bench-server counted, plus the warm-up's hits")

        rc, mixed = bench(port, "--rate", "100", "--concurrency", "8", "--duration-s", "4", "--synthetic", "200",
                          "--zipf", "1.0", "--image-size", "112", "--server-pid", str(proc.pid))
        check(rc == 0 and mixed.get("errors") == 0, "mixed open-loop run: no errors")
        src = mixed.get("sources", {})
        check(src.get("miss", 0) > 0 and src.get("l1", 0) > 0, "mixed run: both hits and misses")
        check(mixed.get("server_rss_mb", {}).get("max", 0) > 0, "server RSS was sampled")

        # --images names a directory anywhere, not only the working directory.
        with tempfile.TemporaryDirectory() as d:
            for i in range(3):
                with open(os.path.join(d, f"img{i}.png"), "wb") as f:
                    f.write(h.png(56, 56, 40 + i))
            rc, files = bench(port, "--images", d, "--concurrency", "2", "--duration-s", "1")
            check(rc == 0 and files.get("errors") == 0 and files.get("requests", 0) > 0,
                  "bench-server --images DIR reads DIR's files from another working directory")
    finally:
        check(h.stop_server(proc) == 0, "server exited 0 on SIGTERM")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

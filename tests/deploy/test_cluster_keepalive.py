#!/usr/bin/env python3
"""Server keepalive (--keepalive-s, --keepalive-timeout-s) behind nginx
(deploy/nginx/nginx.conf.template): nginx answers the server's pings for its
clients, so a lease session and an Encode call that idle through many
keepalive periods are not dropped.

One server with keepalive 0.5 s / 0.5 s and a shared-memory arena, nginx in
front. Through the front, a client opens a lease session and gets two leased
items; the session then idles for 3 s (six keepalive periods) while the
server goes on pinging. Checks, on the server itself:
  - the session and its two leases are still there (a ping nginx did not
    answer would have ended the session and released them);
  - a further call through the front in the same session is served in it
    (two more leases, no unknown-session count), and its leases are the
    session's (closing the client releases all four).

Exit 77 (CTest SKIP_RETURN_CODE) when the binaries or nginx are missing.
(What the server cannot tell apart behind nginx, a client that stops reading
a reply it has ready for longer than keepalive + timeout, is in docs/SHM.md,
"Detection time".)
"""

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
import cluster_harness as ch  # noqa: E402
import server_harness as h  # noqa: E402

SERVE = ["--shm-arena-mb", "1", "--shm-lease-ms", "600000", "--keepalive-s", "0.5", "--keepalive-timeout-s", "0.5"]


check = ch.Checks()


def expect(what, got, want):
    check(got == want, f"{what}: got {got!r}, want {want!r}")


def main():
    status = ch.preflight(need_redis=False, serve_flags=["--keepalive-s"])
    if status is not None:
        return status
    from epd import client as ec
    with ch.Cluster(h.tiny_serve_args() + SERVE, l3=False) as c, c.logs_on_failure(check):
        s1 = c.start_server("s1")
        c.start_nginx()
        far = ec.EncodeClient(c.front, shm=True, timeout=30)
        try:
            rs = far.encode([h.png(56, 56, 800 + i) for i in range(2)])
            expect("leased items through nginx", [r.lease is not None for r in rs], [True, True])
            time.sleep(3)  # six keepalive periods, idle
            s = s1.stats()
            expect("session and leases after 3 s idle behind nginx", (s["shm_sessions"], s["shm_leases"]), (1, 2))
            rs2 = far.encode([h.png(56, 56, 810 + i) for i in range(2)])
            expect("leased items in the same session", [r.lease is not None for r in rs2], [True, True])
            s = s1.stats()
            expect("still one session, four leases", (s["shm_sessions"], s["shm_leases"]), (1, 4))
            expect("no call named an unknown session", s["shm_session_unknown"], 0)
        finally:
            far.close()
        s = s1.stats()
        expect("closing the client ends the session and its leases", (s["shm_sessions"], s["shm_leases"]), (0, 0))
        expect("the four leases went with the session", s["shm_session_reclaimed"], 4)
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())

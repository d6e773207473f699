#!/usr/bin/env python3
"""`epd-encode health` (tools/health_command.cc), the image's HEALTHCHECK,
against a real `epd-encode serve` with the default model:
  * SERVING and exit 0 for the whole server and for epd.v1.Encoder;
  * a service the server does not know: NOT_FOUND from gRPC's health
    service, named on stderr, exit 1;
  * a port nobody listens on: UNAVAILABLE naming the address, exit 1;
  * a bad --timeout-s is refused before any call.
Exit 77 (CTest SKIP_RETURN_CODE) when epd-encode is not built.
"""

import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
import server_harness as h  # noqa: E402


def health(*args):
    return subprocess.run([h.encode_binary(), "health", *args], capture_output=True, text=True, timeout=60)


def main():
    if h.encode_binary() is None:
        print("SKIP: epd-encode is not built", file=sys.stderr)
        sys.exit(77)
    proc, port, _ = h.start_server([])
    try:
        server = f"127.0.0.1:{port}"
        for service in ([], ["--service", "epd.v1.Encoder"]):
            r = health("--server", server, *service)
            assert (r.returncode, r.stdout) == (0, "SERVING\n"), (service, r)
        r = health("--server", server, "--service", "no.such.Service")
        assert r.returncode == 1 and r.stdout == "", r
        assert r.stderr.startswith("NOT_FOUND: grpc.health.v1.Health/Check on " + server), r.stderr
    finally:
        assert h.stop_server(proc) == 0
    r = health("--server", server, "--timeout-s", "2")
    assert r.returncode == 1 and r.stderr.startswith("UNAVAILABLE: ") and server in r.stderr, r
    r = health("--server", server, "--timeout-s", "0")
    assert r.returncode == 1 and "--timeout-s" in r.stderr, r
    print("health: SERVING x2, NOT_FOUND, UNAVAILABLE, bad flag refused", file=sys.stderr)


if __name__ == "__main__":
    main()

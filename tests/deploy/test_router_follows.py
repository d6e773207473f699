#!/usr/bin/env python3
"""The routing tier's script (deploy/kubernetes/router/epd-router.sh) follows
the encoders as they come and go, with Debian's nginx and two real
`epd-encode serve` on 127.0.0.1 and 127.0.0.2 (the same port, as pods of one
Deployment have). A stub `getent` first on PATH stands in for the cluster
DNS of the headless Service: it prints the addresses of a file the test
rewrites.

  1. one address: every key is served by encoder A;
  2. both addresses: the router rewrites its ring and reloads; keys spread
     over A and B, and each key stays on one server (affinity);
  3. A gone from the answer: every key goes to B.
Exit 77 (CTest SKIP_RETURN_CODE) when epd-encode or nginx is missing.
"""

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
import child_process  # noqa: E402
import server_harness as h  # noqa: E402

ROUTER = os.path.join(REPO, "deploy", "kubernetes", "router", "epd-router.sh")
ADDRS = ("127.0.0.1", "127.0.0.2")


def free_port():
    for _ in range(50):
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind((ADDRS[0], 0))
                port = a.getsockname()[1]
                b.bind((ADDRS[1], port))
                return port
            except OSError:
                continue
    raise RuntimeError("no port free on both loopback addresses")


def serve(addr, port):
    argv = [h.encode_binary(), "serve", "--host", addr, "--port", str(port), "--server-id", addr]
    proc = child_process.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    if h.read_ready(proc, 240) is None:
        raise RuntimeError(f"epd-encode serve on {addr}:{port}: {h.not_ready(proc, 240)}")
    return proc


def owners(router_port, images):
    """server id per image, through the router."""
    out = subprocess.run([h.encode_binary(), "client", "--server", f"127.0.0.1:{router_port}", *images],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    return re.findall(r"server=(\S+)", out)


def until(what, fn, timeout_s=60):
    """fn()'s first truthy value, retried: nginx's new workers take over
    from the old ones a moment after a reload."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def wait_for_log(log, text, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(log) as f:
            if f.read().count(text):
                return
        time.sleep(0.2)
    raise AssertionError(f"router log never said {text!r}: {open(log).read()}")


def main():
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
    if h.encode_binary() is None or nginx is None:
        print("SKIP: epd-encode or nginx missing", file=sys.stderr)
        sys.exit(77)
    with tempfile.TemporaryDirectory() as tmp:
        bin_dir, answer = os.path.join(tmp, "bin"), os.path.join(tmp, "answer")
        os.mkdir(bin_dir)
        with open(os.path.join(bin_dir, "getent"), "w") as f:  # `getent ahostsv4 NAME`, as glibc prints it
            f.write(f'#!/bin/sh\nwhile read a; do echo "$a STREAM $2"; done < {answer}\n')
        os.chmod(os.path.join(bin_dir, "getent"), 0o755)
        os.symlink(nginx, os.path.join(bin_dir, "nginx"))
        with open(answer, "w") as f:
            f.write(ADDRS[0] + "\n")
        images = []
        for i in range(12):
            images.append(os.path.join(tmp, f"{i}.png"))
            with open(images[-1], "wb") as f:
                f.write(h.png(56, 56, i))
        port, router_port, health_port = free_port(), *[free_port() for _ in range(2)]
        servers = [serve(a, port) for a in ADDRS]
        log = os.path.join(tmp, "router.log")
        env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", EPD_ENCODERS="epd-encoder-headless",
                   EPD_ENCODER_PORT=str(port), EPD_ROUTER_PORT=str(router_port), EPD_HEALTH_PORT=str(health_port),
                   EPD_REFRESH_S="0.5", EPD_RUN_DIR=os.path.join(tmp, "run"))
        with open(log, "w") as out:
            router = child_process.popen(["/bin/sh", ROUTER], env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for_log(log, "over 1 address(es)")
            h.wait_port(router_port, 30, router)
            one = owners(router_port, images)
            assert set(one) == {ADDRS[0]}, one
            with open(answer, "w") as f:
                f.write("\n".join(ADDRS) + "\n")
            wait_for_log(log, f"encoders now: {ADDRS[0]}:{port} {ADDRS[1]}:{port}")
            def settled():  # keys on both encoders, each key on the same one twice running (affinity)
                a, b = owners(router_port, images), owners(router_port, images)
                return a if a == b and set(a) == set(ADDRS) else None

            both = until("keys settled on both encoders", settled)
            with open(answer, "w") as f:
                f.write(ADDRS[1] + "\n")
            wait_for_log(log, f"encoders now: {ADDRS[1]}:{port}")
            until("every key on B", lambda: set(owners(router_port, images)) == {ADDRS[1]})
            print(f"router: A only, then {both.count(ADDRS[0])}/{both.count(ADDRS[1])} of 12 keys on A/B, "
                  "then B only", file=sys.stderr)
        finally:
            h.stop_pid(router, signal.SIGTERM, grace=20)
            for s in servers:
                h.stop_pid(s, signal.SIGTERM, grace=30)


if __name__ == "__main__":
    main()

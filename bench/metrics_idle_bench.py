#!/usr/bin/python3
"""Scrape latency of /metrics beside idle TCP connections (issue 27, fault
6): start `epd-encode serve --metrics-port 0` (the tiny tower), open N
connections to the metrics port that send nothing, and time --scrapes
scrapes (GET /metrics, a fresh connection each, 30 s timeout) for each N.

  bench/metrics_idle_bench.py [--bin build/tools/epd-encode] [--idle 0,16,200]

--bin another build's epd-encode measures that one (the numbers "before"
in docs/SERVER.md were taken with main's binary of the time). Prints a
markdown table: N, scrapes, p50 / p99 / max ms, timeouts."""

import argparse
import os
import socket
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
import server_harness as h  # noqa: E402


def scrape(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    assert b"epd_cache_misses_total" in data, data[:200]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="")
    ap.add_argument("--idle", default="0,16,200")
    ap.add_argument("--scrapes", type=int, default=50)
    a = ap.parse_args()
    if a.bin:
        os.environ["EPD_ENCODE_BIN"] = os.path.abspath(a.bin)
    proc, _, metrics_port = h.start_server(h.tiny_serve_args() + ["--metrics-port", "0"], timeout=120)
    print("| idle connections | scrapes | p50 ms | p99 ms | max ms | timeouts (30 s) |")
    print("| --- | --- | --- | --- | --- | --- |")
    try:
        for n in (int(x) for x in a.idle.split(",")):
            idle = [socket.create_connection(("127.0.0.1", metrics_port), timeout=30) for _ in range(n)]
            ms, timeouts = [], 0
            for _ in range(a.scrapes):
                t = time.perf_counter()
                try:
                    scrape(metrics_port)
                    ms.append((time.perf_counter() - t) * 1000)
                except (socket.timeout, AssertionError, ConnectionError):
                    timeouts += 1
            for s in idle:
                s.close()
            ms.sort()
            cell = (lambda p: f"{ms[min(len(ms) - 1, int(p * (len(ms) - 1)))]:.2f}") if ms else (lambda p: "-")
            print(f"| {n} | {a.scrapes} | {cell(0.5)} | {cell(0.99)} | {cell(1.0)} | {timeouts} |", flush=True)
    finally:
        h.stop_server(proc)


if __name__ == "__main__":
    main()

"""bench/traces.py, the cache-trace generator: bad arguments are refused
naming the flag, and the adversarial kinds have the shape docs/PLAN.md gives
them (checked here from the lines alone)."""

import json
import os
import subprocess
import sys

import pytest

TRACES = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "traces.py")


def gen(*args):
    return subprocess.run([sys.executable, TRACES, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("flag,value", [("--tenants", "0"), ("--rate", "0"), ("--rate", "nan"), ("--rate", "-1"),
                                        ("--one-hit", "2"), ("--one-hit", "-0.1"), ("--keys", "0"),
                                        ("--requests", "-1"), ("--burst-every", "-1"), ("--burst-len", "0"),
                                        ("--bytes-per-token", "0"), ("--seconds-per-token", "-1"),
                                        ("--seconds-per-token", "inf"), ("--zipf", "nan")])
def test_a_bad_argument_is_refused_naming_the_flag(flag, value):
    r = gen("--requests", "10", flag, value)
    assert r.returncode == 2 and f"{flag} must be" in r.stderr, (r.returncode, r.stderr)
    assert r.stdout == ""


def lines(*args):
    r = gen(*args)
    assert r.returncode == 0, r.stderr
    return [json.loads(x) for x in r.stdout.splitlines()]


def test_unique_never_repeats_a_key_and_scan_loops_over_keys_keys():
    unique = lines("--kind", "unique", "--requests", "500")
    assert len(unique) == 500 and len({x["key"] for x in unique}) == 500
    scan = lines("--kind", "scan", "--requests", "500", "--keys", "37")
    assert [x["key"] for x in scan] == [scan[i % 37]["key"] for i in range(500)]
    assert len({x["key"] for x in scan}) == 37


def test_every_line_is_a_valid_cache_trace_line_and_arrivals_follow_the_rate():
    trace = lines("--requests", "2000", "--keys", "300", "--rate", "250", "--burst-every", "0", "--seed", "5")
    for i, x in enumerate(trace):
        assert set(x) == {"key", "bytes", "cost_s", "t_ms", "tenant"}
        assert isinstance(x["bytes"], int) and 16 * 7168 <= x["bytes"] <= 1280 * 7168
        assert x["cost_s"] >= 0 and x["t_ms"] == pytest.approx(i * 4.0)
    assert not any(x["key"].startswith("burst-") for x in trace)
    # A key keeps its size and cost on every request (content-keyed).
    seen = {}
    for x in trace:
        assert seen.setdefault(x["key"], (x["bytes"], x["cost_s"])) == (x["bytes"], x["cost_s"])

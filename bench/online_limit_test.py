"""bench/online_limit.py: the ideal encoder on three tiny traces, computed by hand.

Run: /usr/bin/python3 -m pytest -q bench/online_limit_test.py (ctest: online_limit_test).
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from online_limit import Request, percentile, requests_from_trace, simulate  # noqa: E402


def test_idle_gap_between_arrivals_counts_towards_the_limit():
    # Trace 1: r1 at 0 s holds A (100 tokens), r2 at 2 s holds B (100 tokens);
    # 0.01 s per token, so each image takes 1 s.
    #   A runs 0 -> 1; the tower waits 1 -> 2 for r2; B runs 2 -> 3.
    #   r1 answered at 1 (latency 1), r2 at 3 (latency 3 - 2 = 1).
    #   Limit 3 s, where the all-at-once limit (the work) is 2 s.
    reqs = [Request("r1", 0.0, ("A",)), Request("r2", 2.0, ("B",))]
    run = simulate(reqs, {"A": 100, "B": 100}, 0.01)
    assert run.limit_s == pytest.approx(3.0)
    assert run.work_s == pytest.approx(2.0)
    assert run.image_start_s == pytest.approx({"A": 0.0, "B": 2.0})
    assert run.image_done_s == pytest.approx({"A": 1.0, "B": 3.0})
    assert run.request_latency_s == pytest.approx([1.0, 1.0])


def test_queueing_and_repeats_served_by_the_first_encode():
    # Trace 2, 1 ms per token; A has 400 tokens (0.4 s), B 200 (0.2 s).
    #   r1 at 0.0 [A]     r2 at 0.1 [B, A]     r3 at 0.2 [A]     r4 at 1.0 [B]
    # First arrivals: A at 0.0 (r1), B at 0.1 (r2).
    #   A runs 0.0 -> 0.4; B is queued at 0.1 and runs 0.4 -> 0.6.
    #   r1 done 0.4, latency 0.4
    #   r2 done max(0.6 (B), 0.4 (A)) = 0.6, latency 0.5
    #   r3 done 0.4 (its A was already running), latency 0.2
    #   r4 arrives at 1.0 after B was done at 0.6: answered at arrival, latency 0
    # Limit = max(0.4, 0.6, 0.4, 1.0) = 1.0 (the last arrival); work 0.6 s.
    # Latencies sorted: [0, 0.2, 0.4, 0.5]. Nearest rank: p50 is rank
    # ceil(0.50 * 4) = 2 -> 0.2; p99 is rank ceil(0.99 * 4) = 4 -> 0.5.
    reqs = [Request("r1", 0.0, ("A",)), Request("r2", 0.1, ("B", "A")), Request("r3", 0.2, ("A",)),
            Request("r4", 1.0, ("B",))]
    run = simulate(reqs, {"A": 400, "B": 200}, 0.001)
    assert run.image_start_s == pytest.approx({"A": 0.0, "B": 0.4})
    assert run.request_done_s == pytest.approx([0.4, 0.6, 0.4, 1.0])
    assert run.request_latency_s == pytest.approx([0.4, 0.5, 0.2, 0.0])
    assert run.limit_s == pytest.approx(1.0)
    assert run.work_s == pytest.approx(0.6)
    assert run.latency_percentile_s(50) == pytest.approx(0.2)
    assert run.latency_percentile_s(99) == pytest.approx(0.5)


def test_equal_arrivals_run_in_trace_order_and_repeats_in_a_request_run_once():
    # Trace 3, 2 ms per token; C has 50 tokens (0.1 s), D 150 (0.3 s); arrivals in ms.
    #   r1 at 10 ms [C, C]     r2 at 10 ms [D]     r3 at 11 ms [C, D]
    # C and D first arrive together at 10 ms; r1 comes first in the trace, so C
    # goes first, and r1's second C is the same image (runs once).
    #   C runs 0.010 -> 0.110; D runs 0.110 -> 0.410.
    #   r1 done 0.110 (latency 0.100), r2 done 0.410 (0.400),
    #   r3 done 0.410 (0.410 - 0.011 = 0.399). Limit 0.410; work 0.4.
    trace = [{"id": "r1", "arrival_ms": 10, "images": ["C", "C"]},
             {"id": "r2", "arrival_ms": 10, "images": ["D"]},
             {"id": "r3", "arrival_ms": 11, "images": ["C", "D"]}]
    tokens = {"C": 50, "D": 150}
    run = simulate(requests_from_trace(trace), tokens, 0.002)
    assert run.image_start_s == pytest.approx({"C": 0.010, "D": 0.110})
    assert run.request_latency_s == pytest.approx([0.100, 0.400, 0.399])
    assert run.limit_s == pytest.approx(0.410)
    assert run.work_s == pytest.approx(0.4)
    # The same trace with r2 listed first: D runs 0.010 -> 0.310, C 0.310 -> 0.410.
    #   r2 latency 0.300, r1 0.400, r3 0.399; the limit does not change (0.410).
    swapped = simulate(requests_from_trace([trace[1], trace[0], trace[2]]), tokens, 0.002)
    assert swapped.image_start_s == pytest.approx({"D": 0.010, "C": 0.310})
    assert swapped.request_latency_s == pytest.approx([0.300, 0.400, 0.399])
    assert swapped.limit_s == pytest.approx(0.410)


def test_unsorted_trace_is_served_in_arrival_order():
    # r_late is listed first but arrives at 1 s; r_early at 0 s. X (10 tokens,
    # 0.1 s per token -> 1 s) is first needed by r_early, so it runs 0 -> 1 and
    # r_late (holding X too) is answered at its arrival, 1 s: latency 0.
    reqs = [Request("r_late", 1.0, ("X",)), Request("r_early", 0.0, ("X",))]
    run = simulate(reqs, {"X": 10}, 0.1)
    assert run.image_start_s == pytest.approx({"X": 0.0})
    assert run.request_latency_s == pytest.approx([0.0, 1.0])
    assert run.limit_s == pytest.approx(1.0)


def test_empty_trace_has_a_zero_limit():
    run = simulate([], {}, 0.5)
    assert (run.limit_s, run.work_s, run.latency_percentile_s(99)) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("reqs,tokens,cost,message", [
    ([Request("r", 0.0, ("A",))], {"A": 1}, 0.0, "seconds_per_token"),
    ([Request("r", 0.0, ("A",))], {"A": 1}, float("nan"), "seconds_per_token"),
    ([Request("r", -1.0, ("A",))], {"A": 1}, 1.0, "request 'r': arrival_s"),
    ([Request("r", 0.0, ("A", "B"))], {"A": 1}, 1.0, "no token count for image 'B'"),
    ([Request("r", 0.0, ("A",))], {"A": 0}, 1.0, "image 'A': token count"),
])
def test_bad_input_is_refused_naming_the_fault(reqs, tokens, cost, message):
    with pytest.raises(ValueError, match=message):
        simulate(reqs, tokens, cost)


def test_percentile_is_nearest_rank():
    # 10 values 1..10: p50 is rank 5 -> 5; p99 is rank ceil(9.9) = 10 -> 10; p0 is rank 1.
    vals = [float(v) for v in range(10, 0, -1)]
    assert (percentile(vals, 50), percentile(vals, 99), percentile(vals, 0)) == (5.0, 10.0, 1.0)
    with pytest.raises(ValueError, match="percentile q"):
        percentile(vals, 101)

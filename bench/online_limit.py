"""The online limit of a real-time trace: when an ideal encoder would be done.

A trace replayed in real time cannot finish before its requests arrive, so
"the tower time of the distinct images, submitted at once" (the all-at-once
limit) understates what any engine can do when arrivals are spread out. This
module simulates an ideal encoder on the trace instead and reports when it
would have answered each request.

The ideal encoder (what the simulation assumes):
  - One tower, one image at a time. An image of n post-merge tokens occupies
    it for n * seconds_per_token seconds: the cost is linear in tokens, and
    batching neither helps nor hurts (a batch would cost the sum of its
    images). The caller measures seconds_per_token (e.g. tower_s /
    tower_tokens of a real run), so the per-image quadratic attention term and
    whatever batching gained in that run are folded into one average.
  - Each distinct image runs exactly once (perfect content keys, an unbounded
    cache), and never before the first request that holds it arrives.
  - No overhead: hashing, decoding, preprocessing, scheduling, copies and
    delivery cost nothing. A request is answered the moment its last image is
    done, or at its arrival if every image was done before it arrived.
  - Work-conserving, first come first served: whenever the tower is free it
    starts the not-yet-encoded image whose first arrival is earliest. Ties go
    to the earlier request in trace order (requests are stably sorted by
    arrival), then to the earlier position within the request. Since images
    are started in first-arrival order, a newly arrived image never precedes
    the running one, so preemption would change nothing.

What the results mean:
  - limit_s, the completion time of the last request, is order-independent:
    any work-conserving order keeps the tower busy exactly when work is
    waiting, so every busy period ends at the same time. Under the linear
    cost model no engine can answer the whole trace earlier.
  - Per-request latencies depend on the order. They are the FIFO ideal's
    latencies, a reference point: a scheduler that favours one request could
    answer that request sooner.

Times are seconds from trace time 0 (arrival_ms = 0), the origin from which
`epd-encode replay --realtime` and bench/reference_pipeline.py measure wall
time. Cost: O(R log R + I) for R requests holding I image references.
Standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence


@dataclass(frozen=True)
class Request:
    """One request of a trace: its id, arrival (seconds from trace time 0,
    >= 0) and image names (a name repeated in the trace is the same image)."""

    id: str
    arrival_s: float
    images: tuple[str, ...]


@dataclass
class IdealRun:
    """What the ideal encoder did with a trace.

    limit_s: completion time of the last request (s); 0 for an empty trace.
    work_s: tower time of the distinct images, each once (s): the all-at-once
        limit at the same speed. limit_s >= work_s, and limit_s - work_s is
        the time the tower waited for arrivals.
    image_start_s, image_done_s: per distinct image, when it ran (s).
    request_done_s, request_latency_s: per request, in the order given to
        simulate(): when it was answered and that minus its arrival (s).
    """

    limit_s: float
    work_s: float
    image_start_s: dict[str, float] = field(default_factory=dict)
    image_done_s: dict[str, float] = field(default_factory=dict)
    request_done_s: list[float] = field(default_factory=list)
    request_latency_s: list[float] = field(default_factory=list)

    def latency_percentile_s(self, q: float) -> float:
        """Nearest-rank percentile (q in [0, 100]) of the request latencies, the
        method `epd-encode replay` reports; 0 when there are no requests."""
        return percentile(self.request_latency_s, q)


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest rank: the smallest value with at least q% of the values at or
    below it; 0 for no values. Raises ValueError unless 0 <= q <= 100."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in [0, 100], got {q}")
    if not values:
        return 0.0
    s = sorted(values)
    rank = min(len(s), max(1, math.ceil(q / 100 * len(s))))
    return s[rank - 1]


def simulate(requests: Sequence[Request], tokens: Mapping[str, int], seconds_per_token: float) -> IdealRun:
    """Runs the ideal encoder (see the module docstring) over `requests`.

    tokens: post-merge token count of every image the trace names (> 0).
    seconds_per_token: the tower's measured cost per post-merge token (> 0).
    Raises ValueError naming the fault: a non-positive or non-finite cost, a
    negative or non-finite arrival, an image without a token count, or a
    non-positive token count.
    """
    if not (seconds_per_token > 0 and math.isfinite(seconds_per_token)):
        raise ValueError(f"seconds_per_token must be positive and finite, got {seconds_per_token}")
    for r in requests:
        if not (r.arrival_s >= 0 and math.isfinite(r.arrival_s)):
            raise ValueError(f"request '{r.id}': arrival_s must be >= 0 and finite, got {r.arrival_s}")
        for name in r.images:
            if name not in tokens:
                raise ValueError(f"request '{r.id}': no token count for image '{name}'")
            if tokens[name] <= 0:
                raise ValueError(f"image '{name}': token count must be > 0, got {tokens[name]}")

    # Distinct images in first-arrival order; sorted() is stable, so ties keep
    # trace order, and a request's images keep their positions.
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
    first_arrival: dict[str, float] = {}
    for i in order:
        for name in requests[i].images:
            first_arrival.setdefault(name, requests[i].arrival_s)

    run = IdealRun(limit_s=0.0, work_s=0.0)
    free_at = 0.0  # when the tower finishes its current image
    for name, arrival in first_arrival.items():  # dicts keep insertion order
        cost = tokens[name] * seconds_per_token
        start = max(free_at, arrival)
        free_at = start + cost
        run.image_start_s[name] = start
        run.image_done_s[name] = free_at
        run.work_s += cost

    for r in requests:
        done = max([r.arrival_s] + [run.image_done_s[name] for name in r.images])
        run.request_done_s.append(done)
        run.request_latency_s.append(done - r.arrival_s)
        run.limit_s = max(run.limit_s, done)
    return run


def requests_from_trace(trace: Sequence[Mapping]) -> list[Request]:
    """Trace records ({"id", "arrival_ms", "images"}, docs/REPLAY.md) to
    Requests; a missing arrival_ms is 0, as replay reads it."""
    return [Request(str(r.get("id", f"line-{n}")), float(r.get("arrival_ms", 0)) / 1e3, tuple(r["images"]))
            for n, r in enumerate(trace, 1)]

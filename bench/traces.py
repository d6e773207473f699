#!/usr/bin/env python3
"""Cache traces for `epd-encode plan` and the eviction benchmarks: one item
request per line, {"key", "bytes", "cost_s", "t_ms", "tenant"} (docs/PLAN.md).

Kinds:
  production    Zipf popularity per tenant, one-hit wonders, bursts and a
                popularity shift (below).
  unique        every request a new key (no cache can hit).
  scan          a loop over --keys keys in order, again and again: larger
                than the cache, LRU's worst case.
  uniform-cost  the production trace with every cost proportional to bytes
                (one cost per byte), where GDSF has nothing to exploit.
  conversation  multi-turn chat, the canonical workload of an EPD encoder
                cache: a client re-sends the same image on every turn of a
                conversation (below). Every later turn re-sends the image, so
                recency predicts reuse and frequency barely does (an image is
                used 2 to --turns times, then never again).

Entry sizes: post-merge image tokens drawn from a log-normal with median
560 and sigma 0.55, clipped to [16, 1280] (our approximation of the image
token distribution ServeGen reports for Qwen-VL serving: median about 560,
capped near 1,280 by max_pixels; Xiang et al., "ServeGen: Workload
Characterization of Large Language Model Serving in Production", 2025), times
--bytes-per-token (7168: Qwen2.5-VL-7B's 3584-wide output in bf16).

Costs (simulated, so that a trace needs no images; `epd-encode replay --out`
writes a manifest with measured costs, which plan reads as a trace): tower
seconds tokens x --seconds-per-token (1.25e-5, ~7 ms for 560 tokens on a
GPU), plus decode and preprocessing seconds source-megapixels x 4 ms, with
the source size log-uniform in [0.3, 12] MP, independent of the tokens (a
12 MP photo resized to few tokens still costs its full decode). So cost per
byte spreads over more than 10x.

Production shape: --tenants tenants, each with its own catalog of --keys /
(2 x tenants) keys plus a shared catalog of the same size, requested by Zipf(s)
over ranks (a request picks its tenant uniformly, and its own catalog with
probability 0.7); a --one-hit share of requests are new keys never seen
again; every --burst-every requests (0: never) a new key is requested --burst-len times
in a row within 50 ms; at the trace's midpoint every catalog's ranks are
rotated by a third (a popularity shift). Arrivals: --rate requests per
second, evenly spaced.

Conversation shape: each request is the next turn of an open conversation
that is due now, or else the first turn of a new conversation with a new key
(`conv-N`, a new image) and a tenant drawn uniformly from --tenants. A new
conversation has 1 + randint(1, --turns - 1) turns in all (default --turns 4:
1 to 3 further turns), each scheduled randint(1, --turn-gap) requests after
the one before (default --turn-gap 20000, in requests). When several turns
fall due at the same request, one is served and the rest move to the next
request (none is dropped); turns still pending when the trace ends are not
emitted. Sizes and costs as for production (content-keyed).

Random numbers: Python's random.Random(seed), so a seed gives the same trace
on every machine with the same Python.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import random
import sys


def zipf_cdf(n: int, s: float) -> list[float]:
    out, total = [], 0.0
    for r in range(1, n + 1):
        total += r ** -s
        out.append(total)
    return out


class Entries:
    """Size and cost per key, drawn once per key (content-keyed)."""

    def __init__(self, rng: random.Random, args):
        self.rng, self.args, self.memo = rng, args, {}

    def get(self, key: str) -> tuple[int, float]:
        e = self.memo.get(key)
        if e is None:
            e = self.memo[key] = self.draw()
        return e

    def draw(self) -> tuple[int, float]:
        a, rng = self.args, self.rng
        tokens = int(min(1280, max(16, round(math.exp(math.log(560) + 0.55 * rng.gauss(0, 1))))))
        nbytes = tokens * a.bytes_per_token
        if a.kind == "uniform-cost":
            return nbytes, nbytes * a.seconds_per_token / a.bytes_per_token
        megapixels = math.exp(rng.uniform(math.log(0.3), math.log(12)))
        return nbytes, tokens * a.seconds_per_token + megapixels * 0.004


def production(args, rng: random.Random):
    per = max(1, args.keys // (2 * args.tenants))
    cdf = zipf_cdf(per, args.zipf)
    total = cdf[-1]
    fresh = 0
    burst_key, burst_left = None, 0
    for i in range(args.requests):
        tenant = f"t{rng.randrange(args.tenants)}"
        if burst_left > 0:
            burst_left -= 1
            yield burst_key, tenant
            continue
        if args.burst_every and i % args.burst_every == 0 and i > 0:
            fresh += 1
            burst_key, burst_left = f"burst-{fresh}", args.burst_len - 1
            yield burst_key, tenant
            continue
        if rng.random() < args.one_hit:
            fresh += 1
            yield f"once-{fresh}", tenant
            continue
        rank = min(per - 1, bisect.bisect_left(cdf, rng.random() * total))
        if i >= args.requests // 2:  # the popularity shift
            rank = (rank + per // 3) % per
        catalog = tenant if rng.random() < 0.7 else "shared"
        yield f"{catalog}-{rank}", tenant


def conversation(args, rng: random.Random):
    due: dict[int, list[tuple[str, int]]] = {}  # request index -> [(key, turns left)]
    tenant_of: dict[str, str] = {}
    started = 0
    for i in range(args.requests):
        pending = due.pop(i, None)
        if pending:
            (key, left), rest = pending[0], pending[1:]
            if rest:  # several turns due now: the others move to the next request, ahead of its own
                due[i + 1] = rest + due.get(i + 1, [])
            tenant = tenant_of[key]
        else:
            started += 1
            key = f"conv-{started}"
            tenant = tenant_of[key] = f"t{rng.randrange(args.tenants)}"
            left = rng.randint(1, args.turns - 1)  # further turns after this one
        if left > 0:
            due.setdefault(i + rng.randint(1, args.turn_gap), []).append((key, left - 1))
        else:
            del tenant_of[key]
        yield key, tenant


def keys_of(args, rng: random.Random):
    if args.kind == "unique":
        for i in range(args.requests):
            yield f"u-{i}", "t0"
    elif args.kind == "scan":
        for i in range(args.requests):
            yield f"s-{i % args.keys}", "t0"
    elif args.kind == "conversation":
        yield from conversation(args, rng)
    else:
        yield from production(args, rng)


def main() -> int:
    class Help(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
        """The module docstring as written, and every option's default."""

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=Help)
    ap.add_argument("--kind", choices=["production", "unique", "scan", "uniform-cost", "conversation"],
                    default="production", help="the workload (Kinds, above)")
    ap.add_argument("--requests", type=int, default=100_000, help="requests (lines) to write")
    ap.add_argument("--keys", type=int, default=20_000,
                    help="production: each tenant's catalog and the shared one hold --keys / (2 x --tenants) keys; scan: the "
                         "loop length")
    ap.add_argument("--zipf", type=float, default=0.9, help="Zipf exponent s of popularity over a catalog's ranks")
    ap.add_argument("--tenants", type=int, default=4, help="tenants (production, conversation)")
    ap.add_argument("--turns", type=int, default=4, help="conversation: most turns per conversation (>= 2)")
    ap.add_argument("--turn-gap", type=int, default=20_000, help="conversation: most requests between two turns (>= 1)")
    ap.add_argument("--one-hit", type=float, default=0.3, help="share of requests for keys seen once (production)")
    ap.add_argument("--burst-every", type=int, default=5000, help="requests between two bursts, 0 for none (production)")
    ap.add_argument("--burst-len", type=int, default=20, help="times a burst's one new key is requested in a row (production)")
    ap.add_argument("--rate", type=float, default=1000.0, help="arrivals per second, evenly spaced (t_ms)")
    ap.add_argument("--bytes-per-token", type=int, default=7168,
                    help="entry bytes per post-merge token (7168: a 3584-wide output in bf16)")
    ap.add_argument("--seconds-per-token", type=float, default=1.25e-5, help="tower seconds per post-merge token")
    ap.add_argument("--seed", type=int, default=1, help="random.Random seed: a seed gives the same trace")
    ap.add_argument("--out", default="-", help="file to write; - for stdout")
    args = ap.parse_args()
    if args.turns < 2 or args.turn_gap < 1:
        ap.error("--turns must be >= 2 and --turn-gap >= 1")
    finite = math.isfinite
    for name, ok, want in (
            ("--requests", args.requests >= 0, ">= 0"),
            ("--keys", args.keys >= 1, ">= 1"),
            ("--tenants", args.tenants >= 1, ">= 1"),
            ("--zipf", finite(args.zipf), "a finite number"),
            ("--one-hit", 0 <= args.one_hit <= 1, "a share in [0, 1]"),
            ("--burst-every", args.burst_every >= 0, ">= 0 (0: no bursts)"),
            ("--burst-len", args.burst_len >= 1, ">= 1"),
            ("--rate", finite(args.rate) and args.rate > 0, "a finite number > 0"),
            ("--bytes-per-token", args.bytes_per_token >= 1, ">= 1"),
            ("--seconds-per-token", finite(args.seconds_per_token) and args.seconds_per_token >= 0,
             "a finite number >= 0")):
        if not ok:
            ap.error(f"{name} must be {want}, got {getattr(args, name[2:].replace('-', '_'))}")
    rng = random.Random(args.seed)
    entries = Entries(random.Random(args.seed + 1), args)
    out = sys.stdout if args.out == "-" else open(args.out, "w")
    buf = []
    for i, (key, tenant) in enumerate(keys_of(args, rng)):
        nbytes, cost = entries.get(key)
        buf.append(json.dumps({"key": key, "bytes": nbytes, "cost_s": round(cost, 9),
                               "t_ms": round(i * 1000.0 / args.rate, 3), "tenant": tenant}, separators=(",", ":")))
        if len(buf) >= 65536:
            out.write("\n".join(buf) + "\n")
            buf.clear()
    if buf:
        out.write("\n".join(buf) + "\n")
    if out is not sys.stdout:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""End-to-end tests of `epd-encode plan`'s L3 (Redis) sizing (pytest; the
binary from EPD_ENCODE). Redis's charge is the entry's bytes times
kRedisOverheadFactor, 1.100 (epd/plan/plan_tiers.h), at least a byte; the
expected sizes below are worked from it by hand.
"""

import json
import random

import pytest

from plan_e2e_test import EPD, run, write

pytestmark = pytest.mark.skipif(not EPD, reason="EPD_ENCODE not set (ctest plan_e2e sets it)")


def test_an_l3_only_plan_is_sized_for_the_lru_that_l3_is_whatever_the_tiers_policy(tmp_path):
    # 100 hot 1 KB keys that cost 1 s each, among 1 MB keys seen once. GDSF's curve reaches the target with
    # little more than the hot keys; L3 (Redis) is LRU and must also hold the one-off keys written through
    # between two requests of a hot key.
    rng = random.Random(3)
    lines = []
    for i in range(20_000):
        lines.append({"key": f"h{rng.randrange(100)}", "bytes": 1000, "cost_s": 1.0})
        lines.append({"key": f"once{i}", "bytes": 10**6, "cost_s": 0.001})
    path = write(tmp_path / "hot.jsonl", lines)
    limits = ("--l1-max-gb", "0", "--l2-max-gb", "0", "--replay", "on", "--json")
    for policy in ("gdsf", "lru"):
        j = json.loads(run("--trace", path, "--eviction", policy, *limits).stdout)
        for row in j["sizing"]:
            assert row["bytes"]["l1"] == 0 and row["bytes"]["l2"] == 0
            assert row["reached"], (policy, row)
            assert row["replayed_seconds_hit_ratio"]["all"] >= row["hit_ratio"] - 0.005, (policy, row)


def test_a_tier_of_zero_bytes_serves_nothing_and_l3_is_charged_what_redis_charges(tmp_path):
    # 1,000 keys of 0 bytes, each requested twice. A 0-byte tier (left out of the plan) must not serve them, and
    # Redis is charged the entries' bytes times the overhead factor, at least a byte each (RedisChargeBytes).
    lines = [{"key": f"k{k}", "bytes": 0, "cost_s": 0.001} for _ in range(2) for k in range(1000)]
    j = json.loads(run("--trace", write(tmp_path / "zero.jsonl", lines), "--l1-max-gb", "0", "--l2-max-gb", "0",
                       "--eviction", "lru", "--replay", "on", "--json").stdout)
    assert j["working_set_bytes"] == 0 and j["working_set_redis_bytes"] == 1000 * 1
    for row in j["sizing"]:
        assert row["replayed_seconds_hit_ratio"]["l1_l2"] == 0, row
        assert row["reached"], row
        # The share of keys held is about the target's share of the hits.
        assert row["bytes"]["l3"] >= 0.95 * row["target"] * 1000 * 1, row


def test_l3_starts_from_lru_distances_in_the_bytes_redis_charges(tmp_path):
    # 10,000 one-off 1-byte keys (Redis charged 1.1, rounded up: 2 bytes each), then 11 rounds over 10 hot 1 kB
    # keys (each charged 1,100). L3 alone needs the hot keys, 11,000 bytes, at every row. Scaled by the working
    # set's charge ratio (1.55 here) the start would be 1.4 times that, which the miniature leaves as it is
    # within half a point of its target.
    lines = [{"key": f"c{k}", "bytes": 1, "cost_s": 0.01} for k in range(10_000)]
    lines += [{"key": f"h{k}", "bytes": 1000, "cost_s": 0.08} for _ in range(11) for k in range(10)]
    j = json.loads(run("--trace", write(tmp_path / "mix.jsonl", lines), "--l1-max-gb", "0", "--l2-max-gb", "0",
                       "--eviction", "lru", "--replay", "on", "--json").stdout)
    for row in j["sizing"]:
        assert row["reached"], row
        assert 10 * 1100 <= row["bytes"]["l3"] <= 1.1 * 10 * 1100, row

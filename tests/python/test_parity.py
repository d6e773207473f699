"""Parity: seeded random operation sequences applied to both `epd` and the
reference; every return value, counter, membership, len, current_bytes and
callback call must be identical, including when a callback raises."""

import random

import pytest

import epd

SEEDS = [1, 2, 3, 4, 5]
OPS_PER_SEED = 10_000
CAPACITIES = [0, 1, 50, 1000, 10**9]


class Raise(Exception):
    pass


def make_key(rng):
    # A mix of key types, as dict keys in the reference may be anything hashable.
    n = rng.randrange(40)
    kind = n % 3
    if kind == 0:
        return f"img-{n}"
    if kind == 1:
        return n
    return ("tuple", n)


def make_nbytes(rng, capacity):
    r = rng.random()
    if r < 0.02:
        return -rng.randrange(1, 5)  # invalid: ValueError in both
    if r < 0.1:
        return 0
    if r < 0.15:
        return capacity + rng.randrange(1, 10)  # oversized: skipped in both
    return rng.randrange(1, max(2, capacity // 4 + 2))


def call(log, fn, *args):
    """Calls fn, logging its result or the exception it raised."""
    try:
        log.append(("ok", fn(*args)))
    except (ValueError, Raise) as e:  # noqa: PERF203
        log.append(("raised", type(e).__name__, str(e)))


def run_single(module, seed, capacity):
    rng = random.Random(seed * 1000 + capacity)
    log, hook_calls = [], []
    raise_every = rng.choice([0, 7, 13])

    def on_evict(key, value, nbytes):
        hook_calls.append((key, value, nbytes))
        if raise_every and len(hook_calls) % raise_every == 0:
            raise Raise(f"hook call {len(hook_calls)}")

    cache = module.EmbeddingCache(capacity, on_evict=on_evict)
    for step in range(OPS_PER_SEED):
        op = rng.random()
        key = make_key(rng)
        if op < 0.35:
            call(log, cache.put, key, ("v", step), make_nbytes(rng, capacity))
        elif op < 0.70:
            call(log, cache.get, key)
        elif op < 0.80:
            call(log, cache.pop, key)
        elif op < 0.90:
            log.append(("contains", key in cache))
        else:
            log.append(("len", len(cache)))
        log.append(("state", cache.current_bytes, cache.hits, cache.misses, len(cache)))
    return log, hook_calls


def run_tiered(module, seed, l1, l2):
    rng = random.Random(seed * 7919 + l1 * 31 + l2)
    log, copies = [], []
    fail_every = rng.choice([0, 11])

    def to_host(v):
        copies.append(("to_host", v))
        if fail_every and len(copies) % fail_every == 0:
            raise Raise(f"to_host {len(copies)}")
        return ("host", v)

    def to_device(v):
        copies.append(("to_device", v))
        if fail_every and len(copies) % fail_every == 0:
            raise Raise(f"to_device {len(copies)}")
        return ("dev", v)

    cache = module.TieredEmbeddingCache(l1, l2, to_host=to_host, to_device=to_device)
    for step in range(OPS_PER_SEED):
        op = rng.random()
        key = make_key(rng)
        if op < 0.4:
            call(log, cache.put, key, ("v", step), make_nbytes(rng, max(l1, l2)))
        elif op < 0.85:
            call(log, cache.get, key)
        elif op < 0.95:
            log.append(("contains", key in cache, key in cache.l1, key in cache.l2))
        else:
            log.append(("len", len(cache), len(cache.l1), len(cache.l2)))
        log.append(
            (
                "state",
                cache.hits,
                cache.l1_hits,
                cache.l2_hits,
                cache.misses,
                cache.promotions,
                cache.demotions,
                cache.l1.current_bytes,
                cache.l2.current_bytes,
                cache.l1.hits,
                cache.l1.misses,
                cache.l2.hits,
                cache.l2.misses,
            )
        )
    return log, copies


def run_scheduler(module_sched, seed):
    rng = random.Random(seed)
    log = []
    sched = module_sched.EncodeScheduler(rng.choice([1, 100, 1000]), rng.choice([1, 3, 8]))
    for _ in range(OPS_PER_SEED):
        op = rng.random()
        if op < 0.6:
            item = module_sched.PendingEncodeItem(f"req-{rng.randrange(30)}", rng.randrange(4), rng.randrange(0, 400))
            sched.add(item)
        elif op < 0.9:
            log.append([(i.request_id, i.item_index, i.cost, i.key) for i in sched.next_batch()])
        else:
            log.append(("pending", sched.pending_size()))
    while sched.pending_size():
        log.append([(i.request_id, i.item_index, i.cost) for i in sched.next_batch()])
    log.append(("empty", sched.next_batch()))
    return log


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("capacity", CAPACITIES)
def test_embedding_cache_parity(reference, seed, capacity):
    ref_log, ref_hooks = run_single(reference.cache, seed, capacity)
    our_log, our_hooks = run_single(epd, seed, capacity)
    assert len(ref_log) == len(our_log) >= 2 * OPS_PER_SEED
    for i, (r, o) in enumerate(zip(ref_log, our_log)):
        assert r == o, f"entry {i}: reference {r!r} != epd {o!r}"
    assert ref_hooks == our_hooks


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("l1,l2", [(0, 0), (0, 100), (100, 0), (60, 200), (300, 100), (2000, 5000), (10**9, 10**9)])
def test_tiered_cache_parity(reference, seed, l1, l2):
    ref_log, ref_copies = run_tiered(reference.cache, seed, l1, l2)
    our_log, our_copies = run_tiered(epd, seed, l1, l2)
    for i, (r, o) in enumerate(zip(ref_log, our_log)):
        assert r == o, f"entry {i}: reference {r!r} != epd {o!r}"
    assert len(ref_log) == len(our_log)
    assert ref_copies == our_copies


@pytest.mark.parametrize("seed", SEEDS)
def test_scheduler_parity(reference, seed):
    assert run_scheduler(reference.scheduler, seed) == run_scheduler(epd, seed)


class FakeTensor:
    """Stands in for torch.Tensor: .cpu() and .to(device) return tagged copies."""

    def __init__(self, where, payload):
        self.where, self.payload = where, payload

    def cpu(self):
        return FakeTensor("cpu", self.payload)

    def to(self, device):
        return FakeTensor(device, self.payload)

    def __eq__(self, other):
        return isinstance(other, FakeTensor) and (self.where, self.payload) == (other.where, other.payload)

    def __repr__(self):
        return f"FakeTensor({self.where!r}, {self.payload!r})"


def test_default_copies_match_reference(reference):
    """Default to_host/to_device: .cpu()/.to(device) on a bare value or each tuple element, keeping None."""
    results = []
    for module in (reference.cache, epd):
        t = module.TieredEmbeddingCache(100, 300, device="cuda:1")
        t.put("bare", FakeTensor("cuda:1", 1), 100)
        t.put("pair", (FakeTensor("cuda:1", 2), None), 100)  # demotes "bare"
        t.put("pair2", (FakeTensor("cuda:1", 3), FakeTensor("cuda:1", 4)), 100)  # demotes "pair"
        snapshot = [t.l2.pop("bare"), t.l2.pop("pair")]
        t.l2.put("bare", snapshot[0][0], 100)
        t.l2.put("pair", snapshot[1][0], 100)
        results.append((snapshot, t.get("bare"), t.get("pair")))
    assert results[0] == results[1]
    assert results[1][1] == FakeTensor("cuda:1", 1)
    assert results[1][2] == (FakeTensor("cuda:1", 2), None)
    assert results[1][0][1][0] == (FakeTensor("cpu", 2), None)


def test_to_host_returning_none_is_stored_like_the_reference(reference):
    """The reference stores whatever to_host returns, None included."""
    states = []
    for module in (reference.cache, epd):
        t = module.TieredEmbeddingCache(100, 100, to_host=lambda v: None, to_device=lambda v: v)
        t.put("a", 1, 100)
        t.put("b", 2, 100)
        states.append(("a" in t.l2, t.demotions, t.get("a"), t.misses, t.l2_hits, len(t)))
    assert states[0] == states[1]

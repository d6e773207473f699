"""Caches shared by threads, and callbacks that call back into the cache.

Python code run from inside a cache call (a key's __hash__/__eq__, a value's
__del__, on_evict, to_host, to_device) lets the interpreter switch threads or
re-enter the cache. These tests check the cache stays consistent and live under
both. The threaded tests run a fixed number of operations per thread in a
child process; the child's timeout only detects a hang (the reported fault
spun forever holding the GIL), it asserts nothing about speed.

Expected values are derived here from what each test itself put, never from
the cache's own output."""

import os
import re
import subprocess
import sys
import textwrap

import pytest

import epd

HANG_GUARD_S = 120  # far beyond the seconds the runs take; only a hang reaches it

STRESS = textwrap.dedent(
    """
    import dataclasses, random, sys, threading
    import epd

    sys.setswitchinterval(1e-5)  # switch threads often, inside __hash__ and __eq__ too
    THREADS, OPS, CAPACITY, KIND = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

    @dataclasses.dataclass(frozen=True)
    class Key:  # hashes and compares in Python
        owner: int
        n: int

    class ListKey:  # an explicit Python __hash__/__eq__ with a loop inside
        def __init__(self, owner, n):
            self.owner, self.n = owner, n
        def __hash__(self):
            h = 0
            for c in (self.owner, self.n, 7):
                h = h * 31 + c
            return h
        def __eq__(self, other):
            return isinstance(other, ListKey) and (self.owner, self.n) == (other.owner, other.n)

    failures = []
    def check(ok, what):
        if not ok:
            failures.append(what)

    def on_evict(key, value, nbytes):
        check(value[0] == key and value[1] == nbytes, f"on_evict({key!r}, {value!r}, {nbytes})")

    # The "reentrant" kinds add callbacks that call back into the same cache
    # while other threads use it: every value's __del__, on_evict, and the
    # tiered cache's copy functions look up another key. Off once the threads
    # are done, so the final accounting below pops a still cache.
    reenter = KIND.startswith("reentrant")
    def touch(seed):
        if reenter:
            other = SHARED_KEYS[seed % len(SHARED_KEYS)]
            got = cache.get(other)
            check(got is None or got[0] == other, f"re-entrant get({other!r}) -> {got!r}")
            len(cache)

    class Toucher:  # a value part whose __del__ re-enters the cache
        def __init__(self, seed):
            self.seed = seed
        def __del__(self):
            touch(self.seed)

    def on_evict_reentrant(key, value, nbytes):
        on_evict(key, value, nbytes)
        key in cache
        touch(nbytes * 31 + 1)

    def copy(v):
        touch(v[3])
        return v

    if KIND == "tiered":
        cache = epd.TieredEmbeddingCache(CAPACITY, 2 * CAPACITY, to_host=lambda v: v, to_device=lambda v: v)
    elif KIND == "reentrant-tiered":
        cache = epd.TieredEmbeddingCache(CAPACITY, 2 * CAPACITY, to_host=copy, to_device=copy)
    elif KIND == "hooked":
        cache = epd.EmbeddingCache(CAPACITY, on_evict=on_evict)
    elif KIND == "reentrant":
        cache = epd.EmbeddingCache(CAPACITY, on_evict=on_evict_reentrant)
    else:
        cache = epd.EmbeddingCache(CAPACITY)

    SHARED = -1
    def keys_of(owner):
        return [Key(owner, n) for n in range(200)] + [ListKey(owner, n) for n in range(40)]
    SHARED_KEYS = keys_of(SHARED)

    def work(me):
        rng = random.Random(me)
        mine, shared = keys_of(me), keys_of(SHARED)
        last = {}  # my keys: the value I put last (nobody else writes them)
        for step in range(OPS):
            own = rng.random() < 0.3
            key = rng.choice(mine if own else shared)
            op = rng.random()
            if op < 0.45:
                nbytes = rng.randrange(0, 10)
                value = (key, nbytes, me, step, Toucher(step)) if reenter else (key, nbytes, me, step)
                cache.put(key, value, nbytes)
                if own:
                    last[key] = value
            elif op < 0.85:
                got = cache.get(key)
                check(got is None or got[0] == key, f"get({key!r}) -> {got!r}")
                if own:
                    check(got is None or got == last.get(key), f"get({key!r}) -> {got!r}, put {last.get(key)!r}")
            elif op < 0.95 and "tiered" not in KIND:
                got = cache.pop(key)
                check(got is None or (got[0][0] == key and got[0][1] == got[1]), f"pop({key!r}) -> {got!r}")
                if own:
                    check(got is None or got[0] == last.get(key), f"pop({key!r}) -> {got!r}")
            else:
                key in cache
                len(cache)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    reenter = False
    every_key = [k for owner in [SHARED] + list(range(THREADS)) for k in keys_of(owner)]
    tiered = "tiered" in KIND
    tiers = [cache.l1, cache.l2] if tiered else [cache]
    if tiered:
        check(len(cache) == len(cache.l1) + len(cache.l2), "len(tiered) != len(l1) + len(l2)")
        check(not any(k in cache.l1 and k in cache.l2 for k in every_key), "a key in both tiers")
    for tier in tiers:
        size, charged = len(tier), tier.current_bytes
        check(charged <= tier.capacity_bytes, f"{charged} bytes over capacity {tier.capacity_bytes}")
        popped = [p for p in (tier.pop(k) for k in every_key) if p is not None]
        check(len(popped) == size, f"len {size}, but {len(popped)} keys popped")
        check(sum(p[1] for p in popped) == charged, f"current_bytes {charged} != {sum(p[1] for p in popped)} popped")
        check(len(tier) == 0 and tier.current_bytes == 0, "not empty after popping every key")
    if failures:
        print(f"{len(failures)} failures, first: {failures[:5]}")
        sys.exit(1)
    print("ok")
    """
)

# One thread switch placed exactly: inside a callback of the main thread's
# call, a second thread runs `interleaved` on the same cache. The callback waits
# for that thread at most GATE_WAIT_S: a correct cache makes it wait for the
# lock until the main thread's call is done, so the wait runs out and the main
# call finishes first; a cache without the lock let it run in the middle.
INTERLEAVE = textwrap.dedent(
    """
    import sys, threading
    import epd

    GATE_WAIT_S = 0.5
    SCENARIO = sys.argv[1]

    class Gate:
        armed = None  # the function the second thread runs, once
        def fire(self):
            fn, self.armed = self.armed, None
            if fn is not None:
                t = threading.Thread(target=fn)
                t.start()
                t.join(GATE_WAIT_S)
                threads.append(t)
    gate, threads = Gate(), []

    class GateKey:  # fires the gate from __hash__ or __eq__, as the scenario says
        def __init__(self, name):
            self.name = name
        def __hash__(self):
            if SCENARIO == "hash":
                gate.fire()
            return hash(self.name)
        def __eq__(self, other):
            if SCENARIO == "eq":
                gate.fire()
            return isinstance(other, GateKey) and self.name == other.name
        def __repr__(self):
            return f"GateKey({self.name!r})"

    class GateValue:  # fires the gate from __del__
        def __del__(self):
            gate.fire()

    def grow(cache, n=1000):
        for i in range(n):
            cache.put(("grow", i), i, 1)

    def finish():
        for t in threads:
            t.join()

    if SCENARIO == "hash":  # the victim's __hash__ during its eviction
        c = epd.EmbeddingCache(20)
        victim = GateKey("victim")
        c.put(victim, "v", 10)
        c.put("other", "o", 10)
        gate.armed = lambda: c.pop(GateKey("victim"))
        c.put("new", "n", 10)  # evicts the victim (a correct cache does not hash it again)
        gate.armed = None
        finish()
        assert victim not in c
        assert len(c) == 2 and c.current_bytes == 20, (len(c), c.current_bytes)
        assert c.pop("other") == ("o", 10) and c.pop("new") == ("n", 10) and len(c) == 0
    elif SCENARIO == "eq":  # __eq__ while a lookup probes
        c = epd.EmbeddingCache(10**9)
        c.put(GateKey("k"), "v", 1)
        def drop_and_grow():
            c.pop(GateKey("k"))
            grow(c)
        gate.armed = drop_and_grow
        got = c.get(GateKey("k"))
        finish()
        assert got == "v", got  # the lookup completed before the other thread's pop
        assert GateKey("k") not in c and len(c) == 1000 and c.current_bytes == 1000
        assert [c.get(("grow", i)) for i in range(1000)] == list(range(1000))
    elif SCENARIO == "del":  # a replaced value's __del__
        c = epd.EmbeddingCache(10**9)
        c.put("k", GateValue(), 10)
        gate.armed = lambda: grow(c)
        c.put("k", "new", 20)
        finish()
        assert len(c) == 1001 and c.current_bytes == 1020, (len(c), c.current_bytes)
        assert c.pop("k") == ("new", 20)
    elif SCENARIO == "on_evict":
        evicted = []
        def on_evict(key, value, nbytes):
            evicted.append(key)
            gate.fire()
        c = epd.EmbeddingCache(30, on_evict=on_evict)
        for k in "abc":
            c.put(k, k, 10)
        gate.armed = lambda: (c.pop("b"), c.put("d", "d", 10))
        c.put("e", "e", 10)  # evicts a; then the other thread pops b and puts d (30 bytes: no eviction)
        finish()
        assert evicted == ["a"], evicted
        assert sorted(k for k in "abcde" if k in c) == ["c", "d", "e"] and c.current_bytes == 30
    elif SCENARIO in ("to_host", "to_device"):
        def copy(direction):
            def f(v):
                if direction == SCENARIO:
                    gate.fire()
                return v
            return f
        t = epd.TieredEmbeddingCache(20, 100, to_host=copy("to_host"), to_device=copy("to_device"))
        t.put("a", "a", 10)
        t.put("b", "b", 10)
        other = lambda: [t.put(k, k, 10) for k in "xyz"] + [t.get(k) for k in "abxyz"]
        if SCENARIO == "to_host":
            gate.armed = other
            t.put("c", "c", 10)  # demotes a
        else:
            t.put("c", "c", 10)
            gate.armed = other
            assert t.get("a") == "a"  # promotes a
        finish()
        keys = "abcxyz"
        assert all((k in t.l1) + (k in t.l2) == 1 for k in keys), [(k, k in t.l1, k in t.l2) for k in keys]
        assert len(t) == 6 and t.l1.current_bytes == 20 and t.l2.current_bytes == 40
    else:
        raise SystemExit(f"unknown scenario {SCENARIO}")
    print("ok")
    """
)


def run_child(script, *args):
    try:
        return subprocess.run(
            [sys.executable, "-c", script, *map(str, args)],
            capture_output=True,
            text=True,
            timeout=HANG_GUARD_S,
            env=dict(os.environ),
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the child process hung (no exit in {HANG_GUARD_S} s): {args}")


@pytest.mark.parametrize("scenario", ["hash", "eq", "del", "on_evict", "to_host", "to_device"])
def test_a_thread_switch_inside_a_callback_cannot_interleave_with_the_call(scenario):
    """Regression: with keys that hash in Python, a thread switch inside
    __hash__ during an eviction let another thread remove the victim, and the
    eviction then spun forever holding the GIL. The same for every callback."""
    run = run_child(INTERLEAVE, scenario)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip() == "ok"


@pytest.mark.parametrize("kind", ["plain", "hooked", "tiered", "reentrant", "reentrant-tiered"])
@pytest.mark.parametrize("threads", [2, 4])
def test_threads_sharing_a_cache_with_python_hashed_keys_stay_consistent_and_live(threads, kind):
    """Random put/get/pop from several threads on frozen-dataclass and other
    Python-hashed keys; a fixed number of operations per thread. The
    "reentrant" kinds also call back into the cache from every value's
    __del__, from on_evict and from the copy functions, while the other
    threads run: re-entry and thread switches at once."""
    run = run_child(STRESS, threads, 8000 // threads, 20, kind)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.strip() == "ok"


# --- re-entry from one thread -------------------------------------------------


class ReentrantValue:
    """A value whose __del__ runs `action` (once)."""

    def __init__(self, action):
        self.action = action

    def __del__(self):
        action, self.action = self.action, None
        if action is not None:
            action()


def test_replaced_value_whose_del_grows_the_cache_keeps_the_count_exact():
    """Regression: put() wrote the new charge into freed memory when the
    replaced value's __del__ grew the cache, and current_bytes drifted."""
    c = epd.EmbeddingCache(10**9)
    seen = {}

    def grow():
        seen["current_bytes"] = c.current_bytes
        seen["k"] = c.get("k")
        for i in range(1000):
            c.put(("grow", i), i, 1)

    c.put("k", ReentrantValue(grow), 10)
    c.put("k", "new", 20)
    assert seen == {"current_bytes": 20, "k": "new"}  # __del__ ran after the replacement was booked
    assert len(c) == 1001
    assert c.current_bytes == 20 + 1000
    assert c.pop("k") == ("new", 20)
    assert c.current_bytes == 1000


def test_evicted_and_popped_values_whose_del_re_enters_leave_the_cache_consistent():
    c = epd.EmbeddingCache(30)
    c.put("a", ReentrantValue(lambda: c.put("from-del-a", "x", 5)), 10)
    c.put("b", ReentrantValue(lambda: c.pop("c")), 10)
    c.put("c", "c", 10)
    # Evicts a (LRU); its __del__ puts 5 more bytes, which evicts b, whose __del__ pops c.
    c.put("d", "d", 10)
    assert "a" not in c and "b" not in c and "c" not in c
    assert sorted(k for k in ["d", "from-del-a"] if k in c) == ["d", "from-del-a"]
    assert len(c) == 2 and c.current_bytes == 15


class ReentrantKey:
    """A key with a Python __hash__ and an __eq__ that runs `on_eq` (once)."""

    on_eq = None

    def __init__(self, name):
        self.name = name

    def __hash__(self):
        return hash(self.name)

    def __eq__(self, other):
        action, ReentrantKey.on_eq = ReentrantKey.on_eq, None
        if action is not None:
            action()
        return isinstance(other, ReentrantKey) and self.name == other.name


def test_eq_that_changes_the_cache_does_not_serve_a_stale_entry():
    c = epd.EmbeddingCache(10**9)
    c.put(ReentrantKey("k"), "v", 1)

    def drop_k_and_grow():
        c.pop(ReentrantKey("k"))
        for i in range(1000):
            c.put(("grow", i), i, 1)

    ReentrantKey.on_eq = drop_k_and_grow
    assert c.get(ReentrantKey("k")) is None
    assert (c.hits, c.misses) == (0, 1)
    assert len(c) == 1000 and c.current_bytes == 1000
    assert c.get(("grow", 0)) == 0


def test_on_evict_that_re_enters_the_cache_sees_it_consistent():
    log = []
    c = None

    def on_evict(key, value, nbytes):
        log.append((key, len(c), c.current_bytes, key in c))
        if key == "a":
            c.put("from-hook", "x", 10)  # evicts b in turn (nested)

    c = epd.EmbeddingCache(30, on_evict=on_evict)
    c.put("a", 1, 10)
    c.put("b", 2, 10)
    c.put("c", 3, 10)
    c.put("d", 4, 5)  # 35 > 30: evicts a, whose hook's put (35 again) evicts b
    assert log == [("a", 3, 25, False), ("b", 3, 25, False)]  # each victim gone when its hook runs
    assert "from-hook" in c and "c" in c and "d" in c
    assert len(c) == 3 and c.current_bytes == 25


def test_copy_functions_that_re_enter_the_tiered_cache_keep_the_tiers_exclusive():
    t = None
    seen = []

    def to_host(v):
        seen.append(("to_host", v, len(t.l1), len(t.l2)))
        t.get("other")  # re-enters: a lookup in the middle of a demotion
        return ("host", v)

    def to_device(v):
        seen.append(("to_device", v, len(t.l1), len(t.l2)))
        t.put("during-promote", "p", 1)  # re-enters: a put in the middle of a promotion
        return v[1]

    t = epd.TieredEmbeddingCache(20, 100, to_host=to_host, to_device=to_device)
    t.put("a", "A", 10)
    t.put("b", "B", 10)
    t.put("c", "C", 10)  # demotes a: to_host runs with a gone from L1, not yet in L2
    assert seen == [("to_host", "A", 2, 0)]
    assert "a" in t.l2 and "a" not in t.l1
    assert t.get("a") == "A"  # promotes a: to_device runs with a gone from L2, not yet in L1
    assert seen[1] == ("to_device", ("host", "A"), 2, 0)
    for key in ["a", "b", "c", "during-promote"]:
        assert (key in t.l1) + (key in t.l2) == 1, key
    assert len(t) == len(t.l1) + len(t.l2) == 4
    assert t.l1.current_bytes <= 20 and t.l2.current_bytes <= 100


def test_key_whose_hash_starts_raising_is_still_evicted():
    """Regression: eviction hashed the victim again; a key whose __hash__ then
    raised stayed cached (and charged) forever."""

    class FlakyKey:
        broken = False

        def __hash__(self):
            if FlakyKey.broken:
                raise RuntimeError("hash failed")
            return 7

    evicted = []
    c = epd.EmbeddingCache(10, on_evict=lambda k, v, n: evicted.append(v))
    flaky = FlakyKey()
    c.put(flaky, "flaky", 10)
    FlakyKey.broken = True
    c.put("next", "next", 10)
    assert evicted == ["flaky"]
    assert len(c) == 1 and c.current_bytes == 10 and "next" in c


# --- counters that cannot hold the value --------------------------------------


def test_capacity_and_nbytes_beyond_the_counters_are_value_errors():
    """Regression: EmbeddingCache(2**63 - 1) plus two puts of 2**63 - 1 left
    current_bytes at -2."""
    bound = "capacity_bytes must be <= 4611686018427387903 (2^62 - 1), got 9223372036854775807"
    with pytest.raises(ValueError, match=re.escape(bound) + "$"):
        epd.EmbeddingCache(2**63 - 1)
    for big in (2**62, 2**63, 2**70):
        with pytest.raises(ValueError, match=f"capacity_bytes must be <= 4611686018427387903 .*, got {big}$"):
            epd.EmbeddingCache(big)
        with pytest.raises(ValueError, match=f"capacity_bytes must be <= .*, got {big}$"):
            epd.TieredEmbeddingCache(10, big)
    with pytest.raises(ValueError, match=r"capacity_bytes must be >= 0, got -1180591620717411303424$"):
        epd.EmbeddingCache(-(2**70))
    c = epd.EmbeddingCache(2**62 - 1)
    c.put("a", 1, 2**62 - 1)
    c.put("b", 2, 2**62 - 1)
    assert (len(c), c.current_bytes, "b" in c) == (1, 2**62 - 1, True)
    for big in (2**62, 2**63 - 1, 2**64):
        with pytest.raises(ValueError, match=f"nbytes must be <= .*, got {big}$"):
            c.put("c", 3, big)
    assert (len(c), c.current_bytes) == (1, 2**62 - 1)
    with pytest.raises(TypeError):
        c.put("c", 3, 1.5)  # not an integer, as before


def test_tiered_put_beyond_the_counter_drops_the_stale_l2_copy_first_like_a_negative_one():
    t = epd.TieredEmbeddingCache(10, 100, to_host=lambda v: v, to_device=lambda v: v)
    t.put("a", 1, 10)
    t.put("b", 2, 10)  # demotes a
    assert "a" in t.l2
    with pytest.raises(ValueError, match="nbytes must be <= "):
        t.put("a", 3, 2**64)
    assert "a" not in t  # the reference pops L2 before L1.put checks nbytes


def test_scheduler_costs_beyond_the_counters_are_value_errors():
    with pytest.raises(ValueError, match="cost must fit in a signed 64-bit integer, got 9223372036854775808"):
        epd.PendingEncodeItem("r", 0, 2**63)
    with pytest.raises(ValueError, match="max_tokens_per_batch must fit in a signed 64-bit integer"):
        epd.EncodeScheduler(2**64, 1)
    s = epd.EncodeScheduler(10, 4)
    s.add(epd.PendingEncodeItem("r", 0, 2**63 - 1))
    with pytest.raises(ValueError, match=r"cost 1 would take the pending token total \(9223372036854775807\)"):
        s.add(epd.PendingEncodeItem("r", 1, 1))
    with pytest.raises(ValueError, match="cost must be >= 0"):
        s.add(epd.PendingEncodeItem("r", 2, -1))
    assert s.pending_size() == 1
    assert [i.cost for i in s.next_batch()] == [2**63 - 1]

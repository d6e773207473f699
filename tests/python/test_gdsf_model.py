"""GDSF: the C++ EmbeddingCache (through src/core/gdsf_driver) against a model
of the rule written here from its statement, on seeded random traces. Every
victim, in order, every hit and miss, and the final clock must agree.

The rule (Cherkasova 1998, as epd/core/embedding_cache.h states it):
priority = clock + frequency * cost / max(size, 1); the victim is the lowest
priority, ties to the oldest touch; the clock becomes max(clock, victim's
priority); a put never evicts the key it puts, and the newcomer is ranked
with the clock its victims left. A put of a key counts a reference; an item
larger than the capacity is skipped; a pop removes without counting.

Frequency, two rules. "resident" (Cherkasova's): the count of references
while the entry is held, back to 1 when it re-enters. The history (the
default): from the cache's first eviction on, each reference (put or hit) is
also counted per key in a window; each key's count is 1 for its first
reference in a window plus what its earlier references left, every count is
halved (rounded down) when a window of references ends, and the sketch part
saturates at 255; the frequency is the larger of the resident count and that
count. The window is given, or 0: 30 x the entries held when the first victim
is chosen, at least 1024.

With probation (CacheOptions::gdsf_probation), once the history exists (never
under "resident"), an entry whose frequency is at most 1 when it is ranked
gets priority = clock alone; every other rule is as above. The driver's header "CAPACITY FREQUENCY probation" turns it on. The model keeps exact per-key counts: the C++
sketch agrees with it while no hashes collide, which on 30 keys in 1024 or
more slots they do not.
"""

import os
import random
import subprocess

import pytest

DRIVER = os.environ.get("EPD_GDSF_DRIVER")
DEFAULT_SECONDS_PER_BYTE = 1e-9


class History:
    """Per-key reference counts of the current window (seen, carried)."""

    def __init__(self, window):
        self.window = window
        self.seen = set()  # keys referenced in this window
        self.carried = {}  # key -> count beyond the first reference, <= 255
        self.in_window = 0

    def record(self, key):
        if key in self.seen:
            self.carried[key] = min(self.carried.get(key, 0) + 1, 255)
        else:
            self.seen.add(key)
        count = 1 + self.carried.get(key, 0)
        self.in_window += 1
        if self.in_window >= self.window:
            self.seen.clear()
            self.carried = {k: c // 2 for k, c in self.carried.items() if c // 2}
            self.in_window = 0
        return count


class GdsfModel:
    def __init__(self, capacity, frequency="resident", probation=False):
        self.capacity = capacity
        self.probation = probation
        self.entries = {}  # key -> dict(nbytes, cost, freq, prio, seq)
        self.clock = 0.0
        self.seq = 0
        self.frequency = frequency  # "resident", or the history's window (0: auto)
        self.history = None  # started at the first eviction
        self.raised = 0  # references where the history's count beat the resident one
        self.on_probation = 0  # ranks at the clock alone where GDSF's term was > 0

    def _referenced(self, key, resident):
        if self.history is None:
            return resident
        count = self.history.record(key)
        self.raised += count > resident
        return max(resident, count)

    def _rank(self, e):
        if self.probation and self.history is not None and e["freq"] <= 1:
            e["prio"] = self.clock
            self.on_probation += e["cost"] > 0
        else:
            e["prio"] = self.clock + e["freq"] * e["cost"] / max(e["nbytes"], 1)

    def used(self):
        return sum(e["nbytes"] for e in self.entries.values())

    def put(self, key, nbytes, cost, out):
        if nbytes > self.capacity:
            out.append("ok")
            return
        if cost is None:
            cost = nbytes * DEFAULT_SECONDS_PER_BYTE
        self.seq += 1
        e = self.entries.get(key)
        if e is None:
            e = self.entries[key] = {"freq": self._referenced(key, 1)}
        else:
            e["freq"] = self._referenced(key, e["freq"] + 1)
        e.update(nbytes=nbytes, cost=cost, seq=self.seq)
        while self.used() > self.capacity:
            victim = min((k for k in self.entries if k != key),
                         key=lambda k: (self.entries[k]["prio"], self.entries[k]["seq"]))
            if self.history is None and self.frequency != "resident":
                self.history = History(self.frequency or max(1024, 30 * len(self.entries)))
            self.clock = max(self.clock, self.entries[victim]["prio"])
            del self.entries[victim]
            out.append(f"evict {victim}")
        self._rank(e)
        out.append("ok")

    def get(self, key, out):
        e = self.entries.get(key)
        if e is None:
            out.append(f"miss {key}")
            return
        self.seq += 1
        e["freq"] = self._referenced(key, e["freq"] + 1)
        e["seq"] = self.seq
        self._rank(e)
        out.append(f"hit {key}")

    def pop(self, key, out):
        out.append(f"{'popped' if self.entries.pop(key, None) is not None else 'absent'} {key}")


def random_ops(rng, capacity, n):
    # A few cost levels, so that priorities tie and the sequence decides.
    costs = [None, 0.0, 0.001, 0.002, 0.005, 0.05]
    ops = []
    for _ in range(n):
        key = f"k{rng.randrange(30)}"
        r = rng.random()
        if r < 0.45:
            nbytes = rng.choice([0, 1, 10, 25, 60, 100, capacity + 1])
            ops.append(("put", key, nbytes, rng.choice(costs)))
        elif r < 0.9:
            ops.append(("get", key))
        else:
            ops.append(("pop", key))
    return ops


def run_driver(capacity, frequency, ops, policy=None):
    lines = [f"{capacity} {frequency}" + (f" {policy}" if policy else "")]
    for op in ops:
        if op[0] == "put":
            lines.append(f"put {op[1]} {op[2]} {'-' if op[3] is None else repr(op[3])}")
        else:
            lines.append(f"{op[0]} {op[1]}")
    r = subprocess.run([DRIVER], input="\n".join(lines) + "\n", capture_output=True, text=True, check=True)
    return r.stdout.splitlines()


@pytest.mark.skipif(not DRIVER, reason="EPD_GDSF_DRIVER not set (ctest gdsf_model_test sets it)")
@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("capacity", [0, 100, 250, 1000])
@pytest.mark.parametrize("frequency", ["resident", 0, 200])
@pytest.mark.parametrize("probation", [False, True])
def test_same_victims_hits_and_clock_as_the_model(seed, capacity, frequency, probation):
    rng = random.Random(seed * 1009 + capacity)
    ops = random_ops(rng, capacity, 3000)
    model = GdsfModel(capacity, frequency, probation)
    expected = []
    for op in ops:
        if op[0] == "put":
            model.put(op[1], op[2], op[3], expected)
        elif op[0] == "get":
            model.get(op[1], expected)
        else:
            model.pop(op[1], expected)
    got = run_driver(capacity, frequency, ops, "probation" if probation else None)
    assert got[-1].startswith("clock ")
    assert got[:-1] == expected
    assert float(got[-1].split()[1]) == model.clock
    if capacity in (100, 250):  # the traces must exercise eviction, not only hits
        assert sum(1 for line in expected if line.startswith("evict")) > 50
        if frequency != "resident":  # and the history must decide some frequencies
            assert model.raised > 10
        if probation and frequency != "resident":  # and probation must rank some entries
            assert model.on_probation > 10
        if frequency == "resident":  # probation needs the history: never applies
            assert model.on_probation == 0

"""The shared L3 tier on Redis Cluster end to end: three real `epd-encode
serve` processes with --l3 redis-cluster://... against a real six-node
cluster (three masters, three replicas) that each test builds with
redis-cli on free loopback ports (tests/python/redis_cluster_harness.py).

What is checked, each against what the cluster itself says (CLUSTER SLOTS,
CLUSTER NODES, EXISTS on a node) or against counts made here:
- a master killed under load: its replica is promoted; no request fails;
  an image whose value was on the dead master is served as a miss while the
  failover runs; afterwards a new value is written on the promoted node and
  served from it as an l3 hit, and so is a value written before the crash
  (it was replicated);
- slots moved with `redis-cli --cluster reshard` under load: no request
  fails, MOVED is followed, and values moved with their slot are l3 hits;
- a slot stopped in migration (as a reshard leaves it between its steps):
  a new image's lease and value go to the importing node through ASK, and
  another server reads the value there through ASK;
- the same images sent to the three servers at once run the tower once each
  in the cluster, and a server started again serves them all as l3 hits;
- a corrupt value planted on the node that serves its key is refused,
  counted, re-encoded and rewritten there."""

import concurrent.futures as cf
import threading
import time

import pytest

import l3_harness
import redis_cluster_harness as rch
import server_harness as h
from l3_harness import Server, wait_for

l3_harness.skip_module_unless_runnable()
if rch.redis_cli() is None:
    pytest.skip("redis-cli is not installed (scripts/install-deps.sh installs redis-tools)", allow_module_level=True)


def image(i: int) -> bytes:
    """4096 distinct images: h.png repeats its pixels every 256 seeds, so the
    size changes with each block of 256."""
    block = i // 256
    return h.png(56 + 28 * (block % 4), 56 + 28 * (block // 4 % 4), i % 256)


@pytest.fixture
def cluster():
    c = rch.RedisCluster(masters=3, replicas=1)
    yield c
    c.close()


@pytest.fixture
def three(cluster):
    started = []
    try:
        for name in ("a", "b", "c"):
            started.append(Server(cluster.url, name))
        yield started
    finally:
        for s in started:
            if s.proc.poll() is None:
                s.stop()


class Load:
    """Three threads encoding fresh images (from `first` on) on the servers
    in turn until stop(); every result and every exception is kept."""

    def __init__(self, servers, first: int):
        self.results, self.failures = [], []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._next = first
        self._threads = [threading.Thread(target=self._run, args=(i, servers)) for i in range(3)]
        for t in self._threads:
            t.start()

    def _run(self, i, servers):
        n = 0
        while not self._stop.is_set():
            with self._lock:
                seed, self._next = self._next, self._next + 1
            try:
                r = servers[(i + n) % len(servers)].encode([image(seed)])[0]
                with self._lock:
                    (self.results if r.ok else self.failures).append(r)
            except Exception as e:  # noqa: BLE001 (a failed request is what is counted)
                with self._lock:
                    self.failures.append(e)
            n += 1

    def stop(self):
        self._stop.set()
        for t in self._threads:
            t.join()

    def next_seed(self) -> int:
        """The first seed no thread has encoded (after stop())."""
        with self._lock:
            return self._next


def value_key(server, img) -> str:
    return "epd:v:{" + server.client.key_for(img).hex() + "}"


def images_on(cluster, server, node, first: int, want: int):
    """`want` images, searched from `first` on, whose values `node` serves."""
    out, i = [], first
    while len(out) < want:
        if cluster.master_of_key(value_key(server, image(i))) is node:
            out.append(image(i))
        i += 1
    return out


def total(servers, name):
    return sum(s.counters().get(name, 0) for s in servers)


def test_killed_master_is_replaced_by_its_replica_and_no_request_fails(cluster, three):
    a, b, c = three
    victim = cluster.masters()[0]
    replica = cluster.replica_of(victim)
    before = images_on(cluster, a, victim, 0, 2)
    assert [r.source for r in a.encode(before)] == ["miss", "miss"]
    a.await_writes(2)
    cluster.wait_synced(victim)

    load = Load(three, 1000)
    time.sleep(0.5)
    cluster.kill(victim)
    during = c.encode(before[:1])[0]
    promoted_already = replica in cluster.masters()
    cluster.wait_promoted(replica)
    time.sleep(1.0)
    load.stop()

    assert load.failures == [], f"{len(load.failures)} requests failed during the failover"
    assert len(load.results) > 0
    assert during.ok
    if not promoted_already:
        assert during.source == "miss", "a value on the dead master is a miss until its replica takes over"
    # A new value lands on the promoted node and is served from it.
    # Past every seed the load encoded: no server has seen it (b would hit L1).
    after = images_on(cluster, a, replica, load.next_seed(), 1)[0]
    key = value_key(a, after)
    wait_for(lambda: a.encode([after])[0].ok and replica.command("EXISTS", key) == 1, "a write on the promoted node")
    assert b.encode([after])[0].source == "l3"
    # The value written before the crash was replicated: b serves it as a hit.
    assert b.encode(before[1:])[0].source == "l3"
    assert sum(s.stats()["l3_node_errors"].get(f"127.0.0.1:{victim.port}/0", 0) for s in three) > 0
    assert total(three, "slot_map_refreshes") >= 3 + 1


def test_resharding_under_load_follows_moved_and_no_request_fails(cluster, three):
    a, b, c = three
    source, target = cluster.masters()[0], cluster.masters()[1]
    first_slot = min(int(s.split("-")[0]) for e in cluster.cluster_nodes() if e["port"] == source.port
                     for s in e["slots"])
    # Values in the first 1000 slots of `source`: the ones a reshard of 1000 slots moves.
    moved = []
    i = 0
    while len(moved) < 3:
        img = image(i)
        slot = int(source.command("CLUSTER", "KEYSLOT", value_key(a, img)))
        if first_slot <= slot < first_slot + 1000:
            moved.append(img)
        i += 1
    assert all(r.source == "miss" for r in a.encode(moved))
    a.await_writes(len(moved))
    assert b.encode([image(3000)])[0].ok  # b has read the slot map

    load = Load(three, 1500)
    cluster.reshard(source, target, 1000)
    time.sleep(0.5)
    load.stop()

    assert load.failures == [], f"{len(load.failures)} requests failed during the reshard"
    assert len(load.results) > 0
    assert all(cluster.master_of_key(value_key(a, img)) is target for img in moved)
    assert [r.source for r in b.encode(moved)] == ["l3"] * len(moved)
    assert b.counters().get("redirects_moved", 0) >= 1


def test_a_slot_in_migration_is_followed_through_ask(cluster, three):
    a, b, c = three
    assert b.encode([image(3100)])[0].ok  # b and c have read the slot map
    assert c.encode([image(3101)])[0].ok
    img = image(3200)
    key = value_key(c, img)
    slot = int(cluster.live()[0].command("CLUSTER", "KEYSLOT", key))
    source = cluster.master_of_key(key)
    target = next(m for m in cluster.masters() if m is not source)
    # Stopped between the first and the last step of a reshard: a new key of
    # the slot goes to the importing node (its lease, then its value).
    cluster.begin_move(slot, source, target)
    r = c.encode([img])[0]
    assert r.ok and r.source == "miss"
    c.await_writes(1)
    assert c.counters().get("redirects_ask", 0) >= 2  # the lease's SET NX and the value's SET
    assert [x.source for x in b.encode([img])] == ["l3"]  # GET at the source, ASK, found at the target
    assert b.counters().get("redirects_ask", 0) == 1
    assert b.counters().get("redirects_moved", 0) == 0  # ASK leaves the map alone
    cluster.finish_move(slot, target)
    assert target.command("EXISTS", key) == 1


def test_same_images_to_three_servers_at_once_run_the_tower_once_each_and_survive_a_restart(cluster, three):
    images = [image(10 + i) for i in range(4)]
    with cf.ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(n.encode, [img]) for img in images for n in three]
        results = [f.result() for f in futures]
    assert all(r[0].ok for r in results)
    assert sum(n.stats()["misses"] for n in three) == len(images), "one encode per distinct image in the cluster"
    assert sum(n.stats()["tower_items"] for n in three) == len(images)
    assert sum(n.stats()["hits_l3"] for n in three) == 2 * len(images)
    # Warm restart: a server started again (empty L1/L2) serves them from the cluster.
    wait_for(lambda: total(three, "writes") == len(images), "the four L3 writes")
    three[0].stop()
    restarted = Server(cluster.url, "a")
    try:
        assert [r.source for r in restarted.encode(images)] == ["l3"] * len(images)
        assert restarted.stats()["tower_items"] == 0
    finally:
        restarted.stop()


def test_corrupt_value_planted_on_its_node_is_refused_and_rewritten(cluster, three):
    a, b, _ = three
    img = image(40)
    key = value_key(a, img)
    node = cluster.master_of_key(key)
    assert node.command("SET", key, b"EPL3" + b"\x00" * 200) == "OK"
    r = a.encode([img])[0]
    assert r.ok and r.source == "miss"
    assert a.counters()["corrupt"] == 1
    wait_for(lambda: a.counters().get("writes", 0) == 1, "the rewrite")
    value = node.command("GET", key)
    assert value[:4] == b"EPL3" and len(value) == 120 + len(r.main) + len(r.deepstack)
    assert b.encode([img])[0].source == "l3"

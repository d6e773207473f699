"""The shared L3 tier end to end: real `epd-encode serve` processes with
--l3 sharing one real redis-server that this module starts on a free port
(tests/python/redis_harness.py).

What is checked, each against an independent count (images sent, servers
started), never against the code's own output:
- a second server, and a restarted one, serve what the first encoded as
  `l3` hits with the same bytes;
- the same images sent to three servers at once run the tower once each in
  the cluster (sum of misses over the servers == distinct images);
- Redis killed: every request still succeeds, Health says l3 "degraded",
  errors are counted; Redis restarted: the servers reconnect and L3 hits
  resume;
- a corrupt value is rejected (counted), re-encoded and rewritten;
- a full Redis (noeviction, over maxmemory) refuses writes, serving goes on;
- a lease left by a holder that died is taken over once it lapses."""

import concurrent.futures as cf
import urllib.request

import l3_harness
import server_harness as h
from l3_harness import redis, servers, wait_for  # noqa: F401 (fixtures)

l3_harness.skip_module_unless_runnable()


def test_second_and_restarted_servers_serve_what_the_first_encoded(redis, servers):
    images = [h.png(56, 56, 1), h.png(84, 56, 2), h.png(56, 84, 3)]
    a = servers("a")
    first = a.encode(images)
    assert [r.source for r in first] == ["miss"] * 3
    wait_for(lambda: a.stats()["l3_counters"].get("writes", 0) == 3, "a's three L3 writes")
    assert a.client.health().l3 == "ok"

    b = servers("b")
    second = b.encode(images)
    assert [r.source for r in second] == ["l3"] * 3
    assert [r.main for r in second] == [r.main for r in first]
    assert [r.deepstack for r in second] == [r.deepstack for r in first]
    assert [r.grid_thw for r in second] == [r.grid_thw for r in first]
    st = b.stats()
    assert st["hits_l3"] == 3 and st["misses"] == 0 and st["tower_items"] == 0
    # Promoted to b's L1.
    assert [r.source for r in b.encode(images[:1])] == ["l1"]
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{b.metrics_port}/metrics", timeout=10).read().decode()
    assert 'epd_cache_hits_total{tier="l3"} 3' in metrics
    assert "epd_l3_degraded 0" in metrics

    a.stop()
    a2 = servers("a")  # restarted: empty L1/L2
    assert [r.source for r in a2.encode(images)] == ["l3"] * 3


def test_same_images_to_three_servers_at_once_run_the_tower_once_each(redis, servers):
    nodes = [servers(n) for n in ("a", "b", "c")]
    images = [h.png(56, 56, 10 + i) for i in range(4)]
    with cf.ThreadPoolExecutor(12) as pool:
        futures = [pool.submit(n.encode, [img]) for img in images for n in nodes]
        results = [f.result() for f in futures]
    assert all(r[0].ok for r in results)
    misses = sum(n.stats()["misses"] for n in nodes)
    tower_items = sum(n.stats()["tower_items"] for n in nodes)
    hits_l3 = sum(n.stats()["hits_l3"] for n in nodes)
    assert misses == len(images), "single flight: one encode per distinct image in the cluster"
    assert tower_items == len(images)
    assert hits_l3 == 2 * len(images)


def test_killed_redis_degrades_and_restarted_redis_is_used_again(redis, servers):
    a = servers("a", ["--cache-mb", "16"])
    assert a.encode([h.png(56, 56, 20)])[0].source == "miss"
    redis.kill()
    for i in range(3):
        r = a.encode([h.png(56, 56, 21 + i)])[0]
        assert r.ok and r.source == "miss"
    assert a.encode([h.png(56, 56, 20)])[0].source == "l1"
    assert a.client.health().serving
    assert a.client.health().l3 == "degraded"
    st = a.stats()
    assert st["l3_degraded"] and sum(st["l3_errors"].values()) > 0

    redis.restart()
    writes_before = a.stats()["l3_counters"].get("writes", 0)
    fresh = [h.png(56, 56, 30 + i) for i in range(20)]
    i = 0

    def wrote():
        nonlocal i
        a.encode([fresh[i % len(fresh)]])
        i += 1
        return a.stats()["l3_counters"].get("writes", 0) > writes_before

    wait_for(wrote, "a write after Redis came back")
    assert a.client.health().l3 == "ok"
    b = servers("b")
    last = fresh[(i - 1) % len(fresh)]
    wait_for(lambda: b.encode([last])[0].source in ("l3", "l1"), "b to see a's value")
    assert b.stats()["hits_l3"] == 1


def test_corrupt_value_is_rejected_reencoded_and_rewritten(redis, servers):
    a = servers("a")
    img = h.png(56, 56, 40)
    key = a.client.key_for(img).hex()
    redis.command("SET", f"epd:v:{key}", b"EPL3" + b"\x00" * 200)
    r = a.encode([img])[0]
    assert r.ok and r.source == "miss"
    assert a.stats()["l3_counters"]["corrupt"] == 1
    wait_for(lambda: a.stats()["l3_counters"].get("writes", 0) == 1, "the rewrite")
    value = redis.command("GET", f"epd:v:{key}")
    # Format 1 with the encode cost field: a 120-byte header.
    assert value[:4] == b"EPL3" and len(value) == 120 + len(r.main) + len(r.deepstack)
    b = servers("b")
    assert b.encode([img])[0].source == "l3"


def test_full_redis_refuses_writes_and_serving_goes_on(redis, servers):
    redis.command("CONFIG", "SET", "maxmemory-policy", "noeviction")
    for i in range(20):
        redis.command("SET", f"filler{i}", b"x" * 200_000)
    assert redis.command("CONFIG", "SET", "maxmemory", "1mb") == "OK"
    a = servers("a")
    images = [h.png(56, 56, 50 + i) for i in range(3)]
    assert all(r.ok for r in a.encode(images))
    wait_for(lambda: a.stats()["l3_counters"].get("write_drops", 0) == 3, "three refused writes")
    st = a.stats()
    assert st["l3_counters"].get("writes", 0) == 0
    assert st["l3_errors"].get("oom", 0) > 0
    assert st["misses"] == 3


def test_lease_of_a_dead_holder_is_taken_over_after_it_lapses(redis, servers):
    a = servers("a")
    img = h.png(56, 56, 60)
    key = a.client.key_for(img).hex()
    # What a holder killed mid-encode leaves behind: its lease, lapsing on
    # Redis's own clock.
    assert redis.command("SET", f"epd:lease:{key}", "dead-server", "PX", "800") == "OK"
    r = a.encode([img])[0]
    assert r.ok and r.source == "miss"
    c = a.stats()["l3_counters"]
    assert c["lease_waits"] == 1 and c["lease_takeovers"] == 1 and c.get("lease_wait_timeouts", 0) == 0
    # a's own lease is released after its write.
    wait_for(lambda: a.stats()["l3_counters"].get("leases_released", 0) == 1, "a's lease release")
    assert redis.command("GET", f"epd:lease:{key}") is None

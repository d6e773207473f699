"""Clients that stop reading (issue 27, faults 4 and 5; docs/SERVER.md,
"Clients that stop reading") against a real `epd-encode serve`.

The non-reading client is h2_peer.H2Peer: a raw HTTP/2 connection whose
SETTINGS_INITIAL_WINDOW_SIZE is 0, so the server may send it headers and
trailers but not one byte of DATA. Its requests name a cached item by caller
key (a few bytes each), the way the issue's attacker sent 3 KB of requests
for 1.3 GB of replies.

Expected values come from outside the code under test: token counts and
reply sizes from the tower's shape (tokens = (w/28) * (h/28); bytes = tokens
* hidden * 4 * (1 + deepstack layers)), how many replies fit a budget from
those sizes, memory from the kernel (/proc/<pid>/status), and what the peer
itself received on the wire.
"""

import os
import time

import pytest

import server_harness as h
import pngs

reason = h.missing_reason()
if reason:
    pytest.skip(reason, allow_module_level=True)
try:
    from epd import client as ec
except ImportError as e:  # stubs not generated: EPD_WITH_PYTHON/EPD_WITH_GRPC off
    pytest.skip(f"epd.client is not importable ({e}); build target epd_python_stubs", allow_module_level=True)

import h2_peer  # noqa: E402

CANCELLED, RESOURCE_EXHAUSTED = 1, 8
MIB = 1 << 20


def striped_png(width: int, height: int, seed: int) -> bytes:
    return pngs.striped_png(width, height, seed)


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def wait_until(predicate, timeout: float = 30.0, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


def seed_item(c, key: bytes, width: int, height: int, hidden: int, deepstack: int) -> int:
    """Encodes one image under caller key `key` (so it is cached) and checks its
    size against the tower's shape; returns its bytes."""
    [r] = c.encode([ec.Item(image=striped_png(width, height, 1), caller_key=key)])
    tokens = (width // 28) * (height // 28)
    assert r.tokens == tokens
    assert len(r.main) + len(r.deepstack) == tokens * hidden * 4 * (1 + deepstack)
    return len(r.main) + len(r.deepstack)


def stall(port: int, key: bytes, items: int = 256, calls: int = 2):
    """The issue's attacker: `calls` Encode streams of `items` cached items each,
    tenant "stalled", from one connection that reads nothing."""
    peer = h2_peer.H2Peer(port)
    sids = [peer.open_encode(h2_peer.encode_request(f"stalled-{i}", [key] * items), tenant="stalled")
            for i in range(calls)]
    return peer, sids


# --- fault 4: one client that stops reading halts the tower for all ------------------

# The tiny tower (src/server/CMakeLists.txt): hidden 64, 1 deepstack layer. A
# 980x980 image is 35 x 35 = 1225 tokens: 627,200 bytes a reply, so 2 x 256
# of them are 321 MB, past the default --max-buffered-mb of 256.
TINY_HIDDEN, TINY_DEEPSTACK, STALL_SIDE = 64, 1, 980


def test_a_client_that_stops_reading_does_not_hold_up_another_clients_miss():
    proc, port, _ = h.start_server(h.tiny_serve_args() + ["--write-timeout-s", "0"])
    try:
        with ec.EncodeClient(f"127.0.0.1:{port}", timeout=60) as c:
            item = seed_item(c, b"stall-item", STALL_SIDE, STALL_SIDE, TINY_HIDDEN, TINY_DEEPSTACK)
            peer, sids = stall(port, b"stall-item")
            # Every result is delivered (hits) and waits on its call.
            assert wait_until(lambda: c.stats()["buffered_bytes"] == 2 * 256 * item), c.stats()
            assert 2 * 256 * item > 256 * MIB
            # Another client's fresh miss runs on the tower while they wait
            # (before the fix it waited as long as the stalled reader did).
            with ec.EncodeClient(f"127.0.0.1:{port}", timeout=20) as other:
                [miss] = other.encode([striped_png(56, 56, 7)], request_id="fresh-miss")
            assert miss.ok and miss.source == "miss" and miss.tokens == 4
            # Both stalled calls went past their tenant's share (a quarter of
            # 256 MiB): throttled, their results wait on them alone.
            s = c.stats()
            assert s["throttled_calls"] == 2
            assert s["sink_full_stalls"] == 0
            # The stalled calls are still open and were sent nothing.
            assert peer.ended(sids) == []
            assert all(peer.stream(sid).data_bytes == 0 for sid in sids)
            peer.close()
            # The connection's end ends both calls and frees what they held.
            assert wait_until(lambda: c.stats()["rpc_errors"].get("CANCELLED") == 2), c.stats()
            assert wait_until(lambda: c.stats()["buffered_bytes"] == 0 and c.stats()["reply_held_bytes"] == 0)
    finally:
        assert h.stop_server(proc) == 0


def test_a_stalled_call_is_throttled_then_cancelled_by_the_write_timeout():
    proc, port, _ = h.start_server(h.tiny_serve_args() + ["--write-timeout-s", "1"])
    try:
        with ec.EncodeClient(f"127.0.0.1:{port}", timeout=60) as c:
            seed_item(c, b"stall-item", STALL_SIDE, STALL_SIDE, TINY_HIDDEN, TINY_DEEPSTACK)
            opened = time.monotonic()
            peer, sids = stall(port, b"stall-item")
            # And a single-item call (its one write goes out with its status).
            single = peer.open_encode(h2_peer.encode_request("stalled-single", [b"stall-item"]), tenant="other")
            every = sids + [single]
            assert peer.wait(lambda p: all(p.streams[s].ended for s in every), timeout=30)
            elapsed = time.monotonic() - opened
            assert elapsed >= 1.0, elapsed  # not before the timeout
            for sid in every:
                st = peer.stream(sid)
                assert st.grpc_status() == CANCELLED, (st.rst, st.headers)
                assert st.data_bytes == 0
            assert wait_until(lambda: c.stats()["write_timeouts"] == 3), c.stats()
            s = c.stats()
            assert s["throttled_calls"] == 2  # the two 256-item calls; the single one is within its share
            assert wait_until(lambda: c.stats()["rpc_errors"].get("CANCELLED") == 3), c.stats()
            assert wait_until(lambda: c.stats()["buffered_bytes"] == 0 and c.stats()["reply_held_bytes"] == 0)
            # The server logged each one, naming the timeout.
            assert h.server_stderr(proc).count("accepted no reply bytes for 1.0 s (--write-timeout-s)") == 3
            # And goes on serving.
            [again] = c.encode([striped_png(56, 56, 8)])
            assert again.ok and again.source == "miss"
            peer.close()
    finally:
        assert h.stop_server(proc) == 0


# --- fault 5: unread streams pin memory without bound -------------------------------

# The default tower (build/models/default_tower.pt): hidden 512, 2 deepstack
# layers. A 560x588 image is 20 x 21 = 420 tokens, 2,580,480 bytes a reply.
DEFAULT_HIDDEN, DEFAULT_DEEPSTACK = 512, 2
BUDGET_MB, CONNECTION_MB = 96, 40
CONNECTIONS, STREAMS_EACH = 3, 80


def default_tower():
    path = os.path.join(h.build_dir(), "models", "default_tower.pt")
    if not os.path.exists(path):
        pytest.skip(f"{path} is not built (target default_tower)")
    return path


def test_b_unread_streams_are_refused_past_the_reply_budget_and_their_memory_comes_back():
    proc, port, _ = h.start_server(["--model", default_tower(), "--threads", "1", "--write-timeout-s", "0",
                                    "--max-reply-mb", str(BUDGET_MB), "--max-reply-mb-per-connection",
                                    str(CONNECTION_MB)])
    try:
        with ec.EncodeClient(f"127.0.0.1:{port}", timeout=60) as c:
            item = seed_item(c, b"big-item", 560, 588, DEFAULT_HIDDEN, DEFAULT_DEEPSTACK)
            assert item == 2_580_480
            time.sleep(1.0)
            before = rss_bytes(proc.pid)
            peers = [h2_peer.H2Peer(port) for _ in range(CONNECTIONS)]
            streams = [[p.open_encode(h2_peer.encode_request(f"unread-{n}-{i}", [b"big-item"]))
                        for i in range(STREAMS_EACH)] for n, p in enumerate(peers)]
            total = CONNECTIONS * STREAMS_EACH
            # A reply held for gRPC is charged twice its message: the rows plus
            # at most a few hundred bytes of other fields.
            lo, hi = 2 * item, 2 * (item + 400)

            def open_now():
                return [len(ss) - len(p.ended(ss)) for p, ss in zip(peers, streams)]

            def settled():  # every stream refused (ended) or held
                return sum(open_now()) == total - c.stats()["reply_refusals"] == c.stats()["reply_held_bytes"] // lo

            assert wait_until(settled, timeout=90, step=0.2), (c.stats(), open_now())
            time.sleep(0.5)
            s = c.stats()
            held_streams = sum(open_now())
            # What fits: each connection at most floor(budget / charge) (the
            # charge is within [lo, hi]); in all, the total budget's worth.
            per_connection = CONNECTION_MB * MIB // lo
            assert per_connection == CONNECTION_MB * MIB // hi == 8
            assert all(n <= per_connection for n in open_now()), open_now()
            assert held_streams == BUDGET_MB * MIB // lo == BUDGET_MB * MIB // hi == 19
            assert held_streams * lo <= s["reply_held_bytes"] <= held_streams * hi <= BUDGET_MB * MIB
            # Every other stream was refused, naming the budget it met.
            refused = [p.stream(sid) for p, ss in zip(peers, streams) for sid in ss if p.stream(sid).ended]
            assert len(refused) == total - held_streams
            for st in refused:
                assert st.grpc_status() == RESOURCE_EXHAUSTED, (st.rst, st.headers)
                assert "--max-reply-mb" in st.grpc_message(), st.grpc_message()
                assert st.data_bytes == 0
            assert s["reply_refusals"] == total - held_streams
            assert s["rpc_errors"].get("RESOURCE_EXHAUSTED") == total - held_streams
            # The kernel's view: what the held replies pin stays within the
            # budget plus a slack for per-call state (generous: 48 MiB).
            during = rss_bytes(proc.pid)
            assert during - before <= BUDGET_MB * MIB * 1.1 + 48 * MIB, (before, during)
            # The connections go: their calls end and the memory comes back.
            for p in peers:
                p.close()
            assert wait_until(lambda: c.stats()["reply_held_bytes"] == 0 and c.stats()["buffered_bytes"] == 0), \
                c.stats()
            assert wait_until(lambda: c.stats()["rpc_errors"].get("CANCELLED") == held_streams), c.stats()
            # (Measured: 0 to 37 MB stay resident after a trim; heap fragments.)
            assert wait_until(lambda: rss_bytes(proc.pid) <= before + 64 * MIB, timeout=10), \
                (before, rss_bytes(proc.pid))
    finally:
        assert h.stop_server(proc) == 0


def test_max_concurrent_streams_is_advertised_and_a_peer_past_it_loses_its_connection():
    proc, port, _ = h.start_server(h.tiny_serve_args() + ["--max-concurrent-streams", "8", "--write-timeout-s", "0"])
    try:
        with ec.EncodeClient(f"127.0.0.1:{port}", timeout=60) as c:
            item = seed_item(c, b"small-item", 56, 56, TINY_HIDDEN, TINY_DEEPSTACK)
            peer = h2_peer.H2Peer(port)
            assert peer.wait(lambda p: p.server_settings_seen, timeout=10)
            assert peer.server_settings.get(h2_peer.SETTINGS_MAX_CONCURRENT_STREAMS) == 8
            # The server counts the limit once its SETTINGS are acked (the
            # peer acks them as it reads them, before this point).
            time.sleep(0.2)
            sids = [peer.open_encode(h2_peer.encode_request(f"s{i}", [b"small-item"])) for i in range(8)]
            # Eight unread calls: each holds its one reply, none ends.
            assert wait_until(lambda: c.stats()["buffered_bytes"] == 8 * item), c.stats()
            assert peer.ended(sids) == [] and not peer.closed
            # A ninth stream breaks the limit the peer was told: gRPC treats
            # that as a connection error (RFC 9113 allows a stream error;
            # gRPC 1.51 closes the connection), which ends all eight calls and
            # frees what they held.
            peer.open_encode(h2_peer.encode_request("s8", [b"small-item"]))
            assert peer.wait(lambda p: p.closed, timeout=10)
            assert wait_until(lambda: c.stats()["buffered_bytes"] == 0 and c.stats()["reply_held_bytes"] == 0), \
                c.stats()
            assert wait_until(lambda: c.stats()["rpc_errors"].get("CANCELLED") == 8), c.stats()
            # Another connection is served as before.
            [again] = c.encode([ec.Item(caller_key=b"small-item")])
            assert again.ok and again.source == "l1"
    finally:
        assert h.stop_server(proc) == 0

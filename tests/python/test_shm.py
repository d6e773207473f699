"""Shared-memory delivery and Unix sockets with real server processes
(docs/SHM.md): the Python client's zero-copy numpy views equal the inline
bytes, leases end by release or expiry, a client killed with leases held
loses them at once through its lease session (and a clean close releases
them), a client whose host vanishes loses them through keepalive, unknown or malformed session ids, the session cap, another user cannot
map the arena, and the CLI client's --shm."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

import child_process
import server_harness as h

if h.missing_reason():
    pytest.skip(h.missing_reason(), allow_module_level=True)
try:
    import grpc
    import numpy as np
    from epd import client as ec
except ImportError as e:  # stubs not generated, or no numpy
    pytest.skip(f"epd.client or numpy is not importable ({e})", allow_module_level=True)


def wait_for(pred, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def server():
    d = tempfile.mkdtemp(prefix="epd-shm-test-")
    sock = os.path.join(d, "epd.sock")
    proc, port, _ = h.start_server(h.tiny_serve_args() + ["--shm-arena-mb", "8", "--listen", f"unix:{sock}"])
    yield {"tcp": f"127.0.0.1:{port}", "unix": f"unix:{sock}", "pid": proc.pid}
    assert h.stop_server(proc) == 0
    shutil.rmtree(d, ignore_errors=True)


def test_shm_views_equal_inline_bytes_without_a_copy(server):
    img = h.png(84, 56, 1)
    with ec.EncodeClient(server["tcp"]) as c:
        [want] = c.encode([img])
        assert want.lease is None
    with ec.EncodeClient(server["unix"], shm=True) as c:
        [r] = c.encode([img])
        assert r.lease is not None and r.source == "l1"
        assert (r.tokens, r.hidden, r.grid_thw) == (want.tokens, want.hidden, want.grid_thw)
        main = r.main_array()
        assert main.shape == (want.tokens, want.hidden)
        assert not main.flags.writeable
        assert np.array_equal(main, want.main_array())
        assert np.array_equal(r.deepstack_array(), want.deepstack_array())
        # A view on the mapping: its data pointer lies at the lease's offset
        # into this process's mapping of the arena.
        arena = np.frombuffer(c._arenas[next(iter(c._arenas))], dtype=np.uint8)
        assert main.__array_interface__["data"][0] == arena.__array_interface__["data"][0] + r.lease.offset
        before = c.stats()
        r.release()
        after = c.stats()
        assert after["shm_leases"] == before["shm_leases"] - 1
        assert after["shm_released"] == before["shm_released"] + 1
        with pytest.raises(ec.EncodeError) as e:
            r.lease.release()  # twice: refused, harmless
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert c.stats()["shm_refused_releases"] == after["shm_refused_releases"] + 1


def test_context_manager_and_batch_release(server):
    imgs = [h.png(56, 56, 10 + i) for i in range(3)]
    with ec.EncodeClient(server["tcp"], shm=True) as c:
        base = c.stats()["shm_leases"]
        rs = c.encode(imgs)
        assert all(r.lease is not None for r in rs)
        assert c.stats()["shm_leases"] == base + 3
        with rs[0]:
            pass
        assert c.stats()["shm_leases"] == base + 2
        c.release(rs)  # rs[0] is skipped: released already
        assert c.stats()["shm_leases"] == base
        # Per-call override: inline bytes from a shm client.
        [r] = c.encode([imgs[0]], shm=False)
        assert r.lease is None and isinstance(r.main, bytes)


def test_unix_socket_serves_inline_too(server):
    img = h.png(56, 84, 4)
    with ec.EncodeClient(server["unix"]) as c, ec.EncodeClient(server["tcp"]) as t:
        [a] = c.encode([img])
        [b] = t.encode([img])
        assert a.lease is None and a.main == b.main and a.deepstack == b.deepstack


HOLDER = r"""
import sys, time
from epd import client as ec
import server_harness as h
c = ec.EncodeClient(sys.argv[1], shm=True)
rs = c.encode([h.png(56, 56, 100 + i) for i in range(2)])
assert all(r.lease is not None for r in rs), "expected shared-memory replies"
print("HELD", sum(len(r.main) + len(r.deepstack) for r in rs), flush=True)
time.sleep(600)
"""


def test_killed_client_loses_its_leases_through_its_session_and_the_memory_is_reclaimed():
    # Leases of ten minutes: only the session's end can release them while the
    # test runs. One session at most, so the cap is exercised on the way.
    d = tempfile.mkdtemp(prefix="epd-shm-kill-")
    sock = os.path.join(d, "epd.sock")
    proc, port, _ = h.start_server(h.tiny_serve_args() + ["--shm-arena-mb", "1", "--shm-lease-ms", "600000",
                                                          "--shm-max-sessions", "1", "--listen", f"unix:{sock}"])
    try:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")]))
        holder = child_process.popen([sys.executable, "-c", HOLDER, f"unix:{sock}"], stdout=subprocess.PIPE,
                                     text=True, env=env)
        line = holder.stdout.readline()
        assert line.startswith("HELD"), line
        held = int(line.split()[1])
        with ec.EncodeClient(f"127.0.0.1:{port}") as c:
            s = c.stats()
            assert s["shm_leases"] == 2
            assert s["shm_leased_bytes"] >= held
            assert (s["shm_sessions"], s["shm_sessions_opened"]) == (1, 1)
            # The cap: a second session is refused, naming it ...
            stub = ec.encoder_pb2_grpc.EncoderStub(c._channel)
            with pytest.raises(grpc.RpcError) as e:
                next(iter(stub.Session(iter(()), timeout=10)))
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "--shm-max-sessions" in e.value.details(), e.value.details()
            # ... and a shared-memory client refused one is still served.
            with ec.EncodeClient(f"unix:{sock}", shm=True) as other:
                [r] = other.encode([h.png(56, 56, 150)])
                assert r.lease is not None
                r.release()
            assert c.stats()["shm_sessions_refused"] == 2
            holder.kill()  # SIGKILL: no release is ever sent; the kernel closes the socket
            holder.wait()
            holder.stdout.close()
            assert wait_for(lambda: c.stats()["shm_leases"] == 0)
            s = c.stats()
            assert s["shm_leased_bytes"] == 0 and s["shm_sessions"] == 0
            assert s["shm_session_reclaimed"] == 2
            assert s["shm_expired"] == 0 and s["shm_released"] == 1  # the refused client's own release
        # The reclaimed memory serves new references, under a new session.
        with ec.EncodeClient(f"unix:{sock}", shm=True) as c:
            rs = c.encode([h.png(56, 56, 160 + i) for i in range(2)])
            assert all(r.lease is not None for r in rs)
            assert c.stats()["shm_sessions_opened"] == 2
            c.release(rs)
    finally:
        assert h.stop_server(proc) == 0
        shutil.rmtree(d, ignore_errors=True)


class VanishingHost:
    """A TCP proxy on a free loopback port to 127.0.0.1:`port`. Until
    vanish() it forwards both ways; after it, it forwards nothing and reads
    nothing more, but closes no socket, as a host that lost power would: no
    FIN, no RST, and the server's pings go unanswered."""

    def __init__(self, port):
        self._port = port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._gone = threading.Event()
        self._socks = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                near, _ = self._listener.accept()
            except OSError:
                return
            far = socket.create_connection(("127.0.0.1", self._port))
            self._socks += [near, far]
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, a, b):
        while not self._gone.is_set():
            try:
                data = a.recv(1 << 16)
                if not data or self._gone.is_set():
                    return
                b.sendall(data)
            except OSError:
                return

    def vanish(self):
        self._gone.set()

    def close(self):
        self._listener.close()
        for s in self._socks:
            s.close()


def test_a_client_whose_host_vanishes_loses_its_session_and_leases_through_keepalive():
    # Ten-minute leases: only the session's end can release them in time.
    # Keepalive every 0.5 s, 0.5 s to answer (the defaults are 60 s and 20 s).
    proc, port, _ = h.start_server(h.tiny_serve_args() + ["--shm-arena-mb", "1", "--shm-lease-ms", "600000",
                                                          "--keepalive-s", "0.5", "--keepalive-timeout-s", "0.5"])
    host = VanishingHost(port)
    far = ec.EncodeClient(f"127.0.0.1:{host.port}", shm=True, timeout=5)
    try:
        with ec.EncodeClient(f"127.0.0.1:{port}") as near:
            rs = far.encode([h.png(56, 56, 700 + i) for i in range(2)])
            assert all(r.lease is not None for r in rs)
            # Idle but answering the server's pings, the session outlives six
            # keepalive periods; and the server goes on pinging an idle session.
            time.sleep(3)
            s = near.stats()
            assert (s["shm_sessions"], s["shm_leases"]) == (1, 2)
            host.vanish()
            t0 = time.monotonic()
            assert wait_for(lambda: near.stats()["shm_sessions"] == 0, timeout=15)
            noticed_s = time.monotonic() - t0
            s = near.stats()
            assert s["shm_leases"] == 0 and s["shm_leased_bytes"] == 0
            assert s["shm_session_reclaimed"] == 2 and s["shm_expired"] == 0
            print(f"vanished host noticed after {noticed_s:.2f} s")
    finally:
        host.close()
        far.close()
        assert h.stop_server(proc) == 0


def test_keepalive_flags_refuse_values_that_would_round_to_grpc_defaults():
    # Kept in whole milliseconds, 0.0004 s was 0 ms, which means gRPC's
    # default (two hours for --keepalive-s): the opposite of what was asked.
    for flag in ("--keepalive-s", "--keepalive-timeout-s"):
        r = child_process.run([h.encode_binary(), "serve", "--host", "127.0.0.1", "--port", "0", *h.tiny_serve_args(),
                               flag, "0.0004"], capture_output=True, text=True, timeout=30)
        assert r.returncode != 0, f"{flag} 0.0004 was accepted"
        assert f"{flag}: expected 0 or a number from 0.001 to 86400 (s), got '0.0004'" in r.stderr


def test_closing_the_client_ends_its_session_and_releases_its_leases(server):
    imgs = [h.png(84, 84, 500 + i) for i in range(2)]
    with ec.EncodeClient(server["tcp"]) as watch:
        before = watch.stats()
        c = ec.EncodeClient(server["unix"], shm=True)
        rs = c.encode(imgs)
        assert all(r.lease is not None for r in rs)
        mid = watch.stats()
        assert mid["shm_leases"] == before["shm_leases"] + 2
        assert mid["shm_sessions"] == before["shm_sessions"] + 1
        c.close()  # returns once the server has ended the session
        after = watch.stats()
        assert after["shm_leases"] == before["shm_leases"]
        assert after["shm_sessions"] == before["shm_sessions"]
        assert after["shm_session_reclaimed"] == before["shm_session_reclaimed"] + 2
        assert after["shm_released"] == before["shm_released"]


def test_unknown_session_ids_are_served_outside_any_session_and_malformed_ones_refused(server):
    with ec.EncodeClient(server["tcp"]) as c:
        stub = ec.encoder_pb2_grpc.EncoderStub(c._channel)
        before = c.stats()
        req = ec.encoder_pb2.EncodeRequest(id="unknown-session", delivery=ec.encoder_pb2.DELIVERY_SHM)
        req.items.add(image=h.png(56, 56, 600))
        [m] = list(stub.Encode(req, timeout=30, metadata=[(ec.SESSION_HEADER, "0123456789abcdef" * 2)]))
        assert m.HasField("shm") and not m.shm.in_session
        s = c.stats()
        assert s["shm_session_unknown"] == before["shm_session_unknown"] + 1
        assert s["shm_leases"] == before["shm_leases"] + 1
        c._release([(m.shm.offset, m.shm.generation)])
        with pytest.raises(grpc.RpcError) as e:
            list(stub.Encode(req, timeout=30, metadata=[(ec.SESSION_HEADER, "not-a-session")]))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert ec.SESSION_HEADER in e.value.details()


def test_full_arena_falls_back_to_inline_and_counts_it():
    proc, port, _ = h.start_server(h.tiny_serve_args() + ["--shm-arena-mb", "0.02"])  # ~20 KB
    try:
        with ec.EncodeClient(f"127.0.0.1:{port}", shm=True) as c:
            # A 56x56 image: 4 tokens x 64 x (1 + 1 deepstack) x 4 bytes = 2 KB per item.
            rs = c.encode([h.png(56, 56, 200 + i) for i in range(12)])
            by_ref = [r for r in rs if r.lease is not None]
            inline = [r for r in rs if r.lease is None]
            s = c.stats()
            assert len(by_ref) + len(inline) == 12
            assert len(inline) > 0 and s["shm_fallbacks"] == len(inline)
            assert s["shm_items"] == len(by_ref)
            with ec.EncodeClient(f"127.0.0.1:{port}") as plain:
                for r, w in zip(rs, plain.encode([h.png(56, 56, 200 + i) for i in range(12)])):
                    assert bytes(r.main) == w.main and bytes(r.deepstack) == w.deepstack
            c.release(by_ref)
    finally:
        assert h.stop_server(proc) == 0


OTHER_USER = r"""
import sys
import grpc
from epd import client as ec
c = ec.EncodeClient(sys.argv[1], shm=True)
rs = c.encode([bytes.fromhex(sys.argv[2])], check=False)
print(rs[0].code.name, rs[0].message, flush=True)
"""


def test_another_user_cannot_map_the_arena(server):
    if os.geteuid() != 0:
        pytest.skip("needs root to run the client as another user (nobody)")
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is not installed")
    # nobody runs a copy of this build's package from a folder it may read:
    # the checkout may sit where only root can (a home folder of mode 700),
    # and Python skips a sys.path entry it cannot read without saying so.
    import epd
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        shutil.copytree(os.path.dirname(epd.__file__), os.path.join(tmp, "epd"))
        r = subprocess.run([setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c", OTHER_USER,
                            server["tcp"], h.png(56, 56, 300).hex()],
                           capture_output=True, text=True, timeout=60, cwd=tmp, env=dict(os.environ, PYTHONPATH=tmp))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("PERMISSION_DENIED"), r.stdout
    assert "own user" in r.stdout


def run_cli(*args):
    return subprocess.run([h.encode_binary(), "client", *args], capture_output=True, text=True, timeout=60)


def test_cli_client_shm_writes_the_same_embeddings_as_inline(server):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "img.png")
        with open(path, "wb") as f:
            f.write(h.png(84, 56, 400))
        outs = {}
        for mode, extra in (("inline", []), ("shm", ["--shm"])):
            outs[mode] = os.path.join(d, f"{mode}.safetensors")
            r = run_cli("--server", server["tcp"], "--out", outs[mode], *extra, path)
            assert r.returncode == 0, r.stderr
            assert f"delivery={mode}" in r.stdout, r.stdout
        with open(outs["inline"], "rb") as a, open(outs["shm"], "rb") as b:
            assert a.read() == b.read()

"""What the L3 server tests share (tests/python/test_l3_*.py): an
`epd-encode serve` process with --l3 and its client, and the fixtures that
start a redis-server of the test's own (redis_harness.py) and servers on it,
all stopped by PID at the end.

    import l3_harness
    from l3_harness import Server, redis, servers, wait_for  # noqa: F401 (fixtures)
    l3_harness.skip_module_unless_runnable()

    def test_x(redis, servers):
        a = servers("a", ["--l3-key-file", path])
        a.encode([png])
        a.await_writes(1)

Not a test module (pytest collects only test_*.py)."""

import time

import pytest

import redis_harness as rh
import server_harness as h


def skip_module_unless_runnable(*modules: str) -> None:
    """Skips the calling test module (at import) when L3 server tests cannot
    run here: no epd-encode or tiny tower, no redis-server, epd.client or
    one of `modules` not importable."""
    reason = h.missing_reason()
    if reason:
        pytest.skip(reason, allow_module_level=True)
    if rh.redis_binary() is None:
        pytest.skip("redis-server is not installed (scripts/install-deps.sh installs it)", allow_module_level=True)
    for m in ("epd.client",) + modules:
        try:
            __import__(m)
        except ImportError as e:
            pytest.skip(f"{m} is not importable ({e}; scripts/install-deps.sh installs the python3-* packages)",
                        allow_module_level=True)


def wait_for(pred, what, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class Server:
    """`epd-encode serve` with the tiny tower and --l3 `redis_url` (500 ms
    command timeout, 20 s lease, `wait_ms` lease wait), plus `extra` flags."""

    def __init__(self, redis_url: str, name: str, extra=(), wait_ms: int = 20000):
        from epd import client as ec  # importable whenever server tests run (h.missing_reason)

        args = h.tiny_serve_args() + ["--server-id", name, "--metrics-port", "0", "--l3", redis_url,
                                      "--l3-timeout-ms", "500", "--l3-lease-ms", "20000",
                                      "--l3-wait-ms", str(wait_ms)]
        self.proc, self.port, self.metrics_port = h.start_server(args + list(extra))
        self.client = ec.EncodeClient(f"127.0.0.1:{self.port}", timeout=60)

    def encode(self, images):
        return self.client.encode(images)

    def stats(self):
        return self.client.stats()

    def counters(self):
        """The Stats RPC's l3_counters."""
        return self.client.stats()["l3_counters"]

    def await_writes(self, n):
        wait_for(lambda: self.counters().get("writes", 0) >= n, f"{n} L3 writes")

    def stop(self):
        self.client.close()
        assert h.stop_server(self.proc) == 0


@pytest.fixture
def redis():
    r = rh.RedisServer()
    r.start()
    yield r
    r.close()


@pytest.fixture
def servers(redis):
    """start(name, extra=(), wait_ms=20000, url=redis.url) -> a Server."""
    started = []

    def start(name, extra=(), wait_ms=20000, url=None):
        s = Server(url or redis.url, name, extra, wait_ms)
        started.append(s)
        return s

    yield start
    for s in started:
        if s.proc.poll() is None:
            s.stop()

"""A real redis-server for tests and benchmarks, the one launcher they all use
(tests/python/test_l3_servers.py, tests/python/cluster_harness.py): its own
free loopback port, its own directory, persistence off (--save ''
--appendonly no) unless asked, started and stopped by PID, and a minimal RESP
client (one command per connection) so tests need no Redis library.

    redis = RedisServer()            # a temp dir of its own; RedisServer(dir) for one inside `dir`
    redis.start()
    redis.command("SET", "k", b"v")  # -> "OK"
    redis.kill()                     # SIGKILL, as a crash
    redis.restart()                  # same port, nothing persisted
    redis.close()                    # stopped; its own temp dir removed

Not a test module (pytest collects only test_*.py). The C++ tests have their
own launcher with the same arguments (src/testing/redis_server.h)."""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
from typing import List, Optional, Sequence, Union

import child_process
import server_harness as h


def redis_binary() -> Optional[str]:
    """$EPD_REDIS_SERVER, else redis-server on PATH; None when neither runs."""
    p = os.environ.get("EPD_REDIS_SERVER") or shutil.which("redis-server")
    return p if p and os.access(p, os.X_OK) else None


class RedisError(RuntimeError):
    """An error reply (-ERR ...) or a reply this client cannot read."""


def _resp_encode(args: Sequence) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


class _RespReader:
    def __init__(self, sock: socket.socket):
        self.sock, self.buf = sock, b""

    def _line(self) -> bytes:
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("redis closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n: int) -> bytes:
        while len(self.buf) < n + 2:
            chunk = self.sock.recv(max(65536, n + 2 - len(self.buf)))
            if not chunk:
                raise ConnectionError("redis closed the connection")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def read(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RedisError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._exact(n)
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self.read() for _ in range(n)]
        raise RedisError(f"unexpected RESP reply {line[:40]!r}")


def command_at(port: int, *args: Union[str, bytes, int], timeout: float = 10.0):
    """One command to whatever speaks RESP on 127.0.0.1:port (a RedisServer,
    or a TLS tunnel's local end), on a fresh connection; the reply as
    RedisServer.command returns it."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(_resp_encode(args))
        return _RespReader(s).read()


class RedisServer:
    """A redis-server of our own on a free loopback port; stopped by PID.
    restart() keeps the port.

    workdir: its directory is workdir/redis (the caller removes workdir);
      None: a temporary directory of its own, removed by close().
    maxmemory_mb: maxmemory with allkeys-lru (None: unlimited).
    extra: further redis-server arguments (e.g. ["--requirepass", "pw"])."""

    def __init__(self, workdir: Optional[str] = None, maxmemory_mb: Optional[float] = None,
                 extra: Sequence[str] = ()):
        if workdir is None:
            self.dir = tempfile.mkdtemp(prefix="epd-redis-")
            self._own_dir = True
        else:
            self.dir = os.path.join(workdir, "redis")
            os.makedirs(self.dir, exist_ok=True)
            self._own_dir = False
        self.maxmemory_mb, self.extra = maxmemory_mb, list(extra)
        self.port = 0
        self.proc: Optional[subprocess.Popen] = None
        self.log = os.path.join(self.dir, "redis.log")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> None:
        """Starts it and waits until it answers PING. A port taken between
        choosing it and binding it is replaced by another (10 tries)."""
        for _ in range(10):
            if not self.port:
                [self.port] = h.free_ports(1)
            args = [redis_binary(), "--bind", "127.0.0.1", "--port", str(self.port), "--dir", self.dir,
                    "--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", self.log,
                    "--protected-mode", "no"]
            if self.maxmemory_mb is not None:
                args += ["--maxmemory", f"{int(self.maxmemory_mb * 1024 * 1024)}",
                         "--maxmemory-policy", "allkeys-lru"]
            args += self.extra
            self.proc = child_process.popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                h.wait_port(self.port, timeout, self.proc)
                self.command("PING")
                return
            except (RuntimeError, OSError):
                h.stop_pid(self.proc, signal.SIGKILL)
                self.proc = None
                self.port = 0  # taken meanwhile: another one
        raise RuntimeError(f"redis-server did not start (log {self.log})")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """`sig` (SIGTERM; SIGKILL for a crash) to our PID, then waits."""
        if self.proc is not None:
            h.stop_pid(self.proc, sig)
            self.proc = None

    def kill(self) -> None:
        """SIGKILL by PID, as a crash."""
        self.stop(signal.SIGKILL)

    def restart(self) -> None:
        """Stops it and starts it again on the same port, empty."""
        self.stop()
        self.start()

    def close(self) -> None:
        """Stops it; removes its directory when it made its own."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def command(self, *args: Union[str, bytes, int], timeout: float = 10.0):
        """One command on a fresh connection; the decoded reply: a status
        string, an integer, bulk bytes, a list, or None. An error reply raises
        RedisError."""
        return command_at(self.port, *args, timeout=timeout)

    def keys(self, pattern: str = "*") -> List[bytes]:
        """Every key matching `pattern` (SCAN, so it never blocks Redis)."""
        out, cursor = [], b"0"
        while True:
            cursor, batch = self.command("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
            out += batch
            if cursor in (b"0", 0):
                return out

    def dbsize(self) -> int:
        return int(self.command("DBSIZE"))

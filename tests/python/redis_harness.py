"""A real redis-server for tests: its own free loopback port, a temp dir,
persistence off (--save '' --appendonly no), stopped by PID; and a minimal
RESP client (one command per connection) so tests need no Redis library.
Not a test module."""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import List, Optional, Union

import server_harness as h


def redis_binary() -> Optional[str]:
    return shutil.which("redis-server")


class Redis:
    def __init__(self, extra: Optional[List[str]] = None):
        self.dir = tempfile.mkdtemp(prefix="epd-redis-")
        self.port = h.free_ports(1)[0]
        self.extra = extra or []
        self.proc: Optional[subprocess.Popen] = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        args = [redis_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", self.dir, "--save", "",
                "--appendonly", "no", "--logfile", os.path.join(self.dir, "redis.log")] + self.extra
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if self.cmd("PING") == "PONG":
                    return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise RuntimeError("redis-server exited at start")
            time.sleep(0.02)
        self.kill()
        raise RuntimeError("redis-server did not answer PING")

    def kill(self) -> None:
        """SIGKILL by PID, as a crash."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def cmd(self, *args: Union[str, bytes]) -> Union[str, int, bytes, None]:
        """One command; returns a status string, an integer, bulk bytes or None.
        An error reply raises RuntimeError."""
        parts = [a.encode() if isinstance(a, str) else a for a in args]
        req = b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(req)
            f = s.makefile("rb")
            line = f.readline()
            kind, rest = line[:1], line[1:-2]
            if kind == b"+":
                return rest.decode()
            if kind == b"-":
                raise RuntimeError(rest.decode())
            if kind == b":":
                return int(rest)
            if kind == b"$":
                n = int(rest)
                return None if n < 0 else f.read(n + 2)[:-2]
            raise RuntimeError(f"unexpected reply {line!r}")

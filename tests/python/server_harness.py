"""Helpers for tests that run real epd-encode server processes: finding the
binary and the tiny test tower, making PNG fixtures, starting and stopping
servers. Not a test module (pytest collects only test_*.py)."""

import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

import child_process
import hang_report
import pngs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def build_dir() -> str:
    return os.environ.get("EPD_BUILD_DIR", os.path.join(REPO, "build"))


def encode_binary() -> Optional[str]:
    """The epd-encode binary, or None when this build has none."""
    for p in (os.environ.get("EPD_ENCODE_BIN"), os.path.join(build_dir(), "tools", "epd-encode")):
        if p and os.access(p, os.X_OK):
            return p
    return None


def tiny_tower() -> Optional[str]:
    """models/tiny_tower.pt (src/server/CMakeLists.txt), or None."""
    for p in (os.environ.get("EPD_TINY_TOWER"), os.path.join(build_dir(), "models", "tiny_tower.pt")):
        if p and os.path.exists(p):
            return p
    return None


def missing_reason() -> Optional[str]:
    """Why server-process tests cannot run here, or None when they can."""
    if encode_binary() is None:
        return ("epd-encode is not built (needs EPD_WITH_GRPC and EPD_WITH_TORCH); looked at $EPD_ENCODE_BIN and "
                f"{os.path.join(build_dir(), 'tools', 'epd-encode')}")
    if tiny_tower() is None:
        return "models/tiny_tower.pt is not built (target tiny_tower)"
    return None


def png(width: int, height: int, seed: int) -> bytes:
    """An 8-bit RGB PNG whose pixels depend on seed (distinct seeds, distinct bytes)."""
    return pngs.pattern_png(width, height, seed)


def free_ports(n: int) -> List[int]:
    """n distinct loopback ports that were free a moment ago."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


# --- processes, by PID ----------------------------------------------------------

# Every child is started through child_process.popen / run, so that it dies
# with the test even when the test is killed.


def stop_pid(proc: subprocess.Popen, sig: int = signal.SIGTERM, grace: float = 20.0) -> Optional[int]:
    """Sends `sig` to proc's PID, waits up to `grace` s, then SIGKILLs it;
    before the SIGKILL of a process that outlived its grace, its thread
    stacks go to stderr (hang_report.process_stacks), so a stop that hangs
    says where. Returns the exit status (None if it could not be reaped)."""
    if proc.poll() is None:
        try:
            os.kill(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            if sig != signal.SIGKILL:
                print(f"process {proc.pid} still runs {grace:.0f} s after signal {sig}; its stacks before the "
                      f"SIGKILL:\n{hang_report.process_stacks(proc.pid)}", file=sys.stderr, flush=True)
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    return proc.returncode


def read_ready(proc: subprocess.Popen, timeout: float) -> Optional[Dict[str, str]]:
    """The fields of the READY line `epd-encode serve` prints on its stdout
    (a pipe), within `timeout` s; None when the process closes its stdout
    (exits) first or the time runs out. Reads the pipe's file descriptor
    itself, so a server that never prints cannot block the caller past the
    timeout (a readline() would)."""
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    pending = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        if not select.select([fd], [], [], min(left, 1.0))[0]:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            return None
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.startswith(b"READY "):
                return dict(kv.split("=", 1) for kv in line.decode(errors="replace").split()[1:])


def not_ready(proc: subprocess.Popen, timeout: float) -> str:
    """Why `proc` gave no READY line (for the caller's error), SIGKILLing it
    when it still runs: then with its thread stacks, taken first."""
    if proc.poll() is not None:
        return f"it exited with status {proc.returncode}"
    why = f"no READY line in {timeout:.0f} s; its stacks:\n{hang_report.process_stacks(proc.pid)}"
    stop_pid(proc, signal.SIGKILL)
    return why


def wait_port(port: int, timeout: float, proc: Optional[subprocess.Popen] = None) -> None:
    """Until something accepts connections on 127.0.0.1:port; RuntimeError
    when `proc` exits first or after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process {proc.pid} exited with {proc.returncode} before listening on {port}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


# --- encode servers ----------------------------------------------------------------


def tiny_serve_args() -> List[str]:
    """serve flags for a fast test server: the tiny tower on one thread."""
    return ["--model", tiny_tower(), "--threads", "1"]


def start_server(extra: List[str], timeout: float = 240.0) -> Tuple[subprocess.Popen, int, int]:
    """Starts `epd-encode serve --port 0` plus `extra`; returns (process,
    port, metrics_port) once it printed READY. RuntimeError, with the
    server's stacks, when it has not within `timeout` s (libtorch's static
    initialisation alone took over 60 s at a load of 16 on two cores)."""
    args = [encode_binary(), "serve", "--host", "127.0.0.1", "--port", "0"] + extra
    # stderr to a file: a pipe nobody reads would block the server once full.
    err = tempfile.TemporaryFile(mode="w+")
    proc = child_process.popen(args, stdout=subprocess.PIPE, stderr=err, text=True)
    proc.err_file = err
    proc.err_text = None
    STARTED.append(proc)
    fields = read_ready(proc, timeout)
    if fields is not None:
        proc.ready = fields  # every field of the READY line (http_port, ...)
        return proc, int(fields["port"]), int(fields["metrics_port"])
    why = not_ready(proc, timeout)
    err.seek(0)
    raise RuntimeError(f"epd-encode serve did not get ready ({why}); its stderr: {err.read()}")


def stop_server(proc: subprocess.Popen, timeout: float = 30.0) -> int:
    """SIGTERM, wait up to `timeout` s (then stacks and SIGKILL, stop_pid),
    return the exit status."""
    stop_pid(proc, signal.SIGTERM, grace=timeout)
    proc.stdout.close()
    proc.err_text = server_stderr(proc)
    proc.err_file.close()
    return proc.returncode


# Every server start_server started in this process, in order, so that a
# failing test can show what its servers wrote (conftest.py adds their stderr
# to the failure report: a server that crashed, or a sanitizer report, is
# otherwise invisible).
STARTED: List[subprocess.Popen] = []


def server_stderr(proc: subprocess.Popen, max_chars: int = 20000) -> str:
    """What a server of start_server wrote on stderr so far (the last
    max_chars characters), also after stop_server."""
    if proc.err_text is not None:
        text = proc.err_text
    else:
        proc.err_file.flush()
        proc.err_file.seek(0)
        text = proc.err_file.read()
        proc.err_file.seek(0, os.SEEK_END)
    return text if len(text) <= max_chars else "[...]\n" + text[-max_chars:]

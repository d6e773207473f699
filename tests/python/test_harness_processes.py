"""The test launcher's promise (child_process.py): every server a harness
starts dies with the test process, even when that process is SIGKILLed and
runs no cleanup (as ctest's timeout does). Issue 27, fault 8: a test killed
by ctest left its redis-server alive, which held ctest's output pipe open.

Each case starts harnesses in a child interpreter (the "test"), reads the
PIDs of the servers it started, SIGKILLs that child alone, and requires every
one of those PIDs gone within a second."""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

import child_process
import cluster_harness as ch
import redis_harness
import server_harness as h

HERE = os.path.dirname(os.path.abspath(__file__))

# Runs in the child: starts what argv[1] names, prints its PIDs and ports as
# one JSON line, then sleeps until killed.
CHILD = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[2])
import cluster_harness as ch, redis_harness, server_harness as h, child_process
what, workdir = sys.argv[1], sys.argv[3]
pids, ports = [], []
if what == "redis":
    r = redis_harness.RedisServer(workdir)
    r.start()
    pids, ports = [r.proc.pid], [r.port]
elif what == "serve":
    proc, port, metrics_port = h.start_server(h.tiny_serve_args())
    pids, ports = [proc.pid], [p for p in (port, metrics_port) if p > 0]
elif what == "nginx":
    n = ch.Nginx(workdir)
    n.start(["127.0.0.1:9"])
    pids, ports = [n.proc.pid] + n.workers(), [n.front_port]
elif what == "on_death":
    child_process.on_death([sys.executable, "-c", "open(%r, 'w').write('ran')" % os.path.join(workdir, "ran")])
print(json.dumps({"pids": pids, "ports": ports}), flush=True)
time.sleep(3600)
"""


def start_and_kill(what: str, workdir: str):
    """Runs CHILD for `what`, SIGKILLs it once it has started; returns the
    PIDs and ports it reported and the time the kill was sent."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, what, HERE, workdir], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])))
    try:
        line = proc.stdout.readline()
        assert line, f"the child exited ({proc.wait()}) before starting {what}"
        started = json.loads(line)
        pids, ports = started["pids"], started["ports"]
        assert all(child_process.alive(p) for p in pids), pids
        assert all(listening(p) for p in ports), ports
    finally:
        proc.kill()  # SIGKILL: the child runs no atexit, no finally, no destructor
        proc.wait()
        proc.stdout.close()
    return pids, ports, time.monotonic()


def listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            return True
    except OSError:
        return False


def gone_within(pids, since: float, limit: float = 1.0):
    """The PIDs still alive `limit` s after `since` (those are then killed)."""
    while time.monotonic() < since + limit and any(child_process.alive(p) for p in pids):
        time.sleep(0.01)
    left = [p for p in pids if child_process.alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    return left


@pytest.mark.skipif(redis_harness.redis_binary() is None, reason="redis-server is not installed")
def test_a_redis_server_dies_with_its_killed_test():
    with tempfile.TemporaryDirectory() as d:
        pids, ports, t = start_and_kill("redis", d)
        assert gone_within(pids, t) == []
        assert not any(listening(p) for p in ports)


@pytest.mark.skipif(h.missing_reason() is not None, reason=str(h.missing_reason()))
def test_an_encode_server_dies_with_its_killed_test():
    with tempfile.TemporaryDirectory() as d:
        pids, ports, t = start_and_kill("serve", d)
        assert gone_within(pids, t) == []
        assert not any(listening(p) for p in ports)


@pytest.mark.skipif(ch.nginx_binary() is None, reason="nginx is not installed")
def test_nginx_and_its_workers_die_with_their_killed_test():
    # The workers are nginx's own children: the death signal reaches only the
    # master; the watchdog kills the group, workers included.
    with tempfile.TemporaryDirectory() as d:
        pids, ports, t = start_and_kill("nginx", d)
        assert len(pids) >= 2, f"no nginx worker among {pids}"
        assert gone_within(pids, t) == []
        assert not any(listening(p) for p in ports)


def test_a_cleanup_registered_with_on_death_runs_when_the_test_is_killed():
    with tempfile.TemporaryDirectory() as d:
        _, _, t = start_and_kill("on_death", d)
        ran = os.path.join(d, "ran")
        while time.monotonic() < t + 5 and not os.path.exists(ran):
            time.sleep(0.01)
        assert os.path.exists(ran)


def test_a_child_started_by_a_living_test_keeps_running():
    # The other half of the promise: nothing is killed while its test lives.
    proc = child_process.popen([sys.executable, "-c", "import time; time.sleep(3600)"], group=True)
    try:
        time.sleep(0.5)
        assert proc.poll() is None
    finally:
        assert child_process.stop_group(proc, signal.SIGTERM) == -signal.SIGTERM
    assert not child_process.alive(proc.pid)


@pytest.mark.skipif(not child_process.has_setpriv(), reason="setpriv (util-linux) is not installed")
def test_a_lock_another_thread_holds_does_not_keep_the_launcher_from_starting_a_child():
    # With a preexec_fn, CPython runs its at-fork handlers before forking, and
    # logging's takes logging's module lock; a test's main thread once stayed
    # blocked for good inside such a fork (cluster_scale_test). The launcher
    # runs no Python code around the fork, so a thread holding that lock (as
    # one inside logging does) cannot hold up a start.
    import logging
    import threading
    held, release = threading.Event(), threading.Event()

    def hold():
        with logging._lock:  # what logging's at-fork handler acquires
            held.set()
            release.wait(120)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert held.wait(30)
    result = {}
    # In a thread of its own, so that a start that blocks fails the test
    # instead of hanging it; run() waits for the child in the same thread
    # (the child's death signal follows the thread that started it).
    starter = threading.Thread(target=lambda: result.update(rc=child_process.run(["true"]).returncode), daemon=True)
    try:
        starter.start()
        starter.join(60)  # `true` takes milliseconds; a start that waits for the lock never ends
        started = not starter.is_alive()
    finally:
        release.set()
        holder.join(30)
        starter.join(60)
    assert started, "starting a child waited for a lock another thread held"
    assert result == {"rc": 0}


def test_the_child_runs_with_a_death_signal_and_no_trace_of_the_check():
    # What the child sees (the program exec'ed in place of the wrapper): its
    # PID is the one Popen reports, its death signal is SIGKILL, and the
    # wrapper's variable is gone from its environment.
    probe = ("import ctypes, os; v = ctypes.c_int(); ctypes.CDLL(None).prctl(2, ctypes.byref(v)); "
             "print(os.getpid(), v.value, os.environ.get('EPD_DIE_WITH'))")
    p = child_process.popen([sys.executable, "-c", probe], stdout=subprocess.PIPE, text=True)
    out, _ = p.communicate(timeout=120)
    assert out.split() == [str(p.pid), str(int(signal.SIGKILL)), "None"]
    with pytest.raises(FileNotFoundError):
        child_process.popen(["epd-no-such-program"])

"""What a stuck test leaves in its log (hang_report.py), and the bounded
READY wait of the server harnesses (server_harness.read_ready): a hung test
must say who waits on what before ctest kills it, and a server that never
gets ready must be an error, not a wait until ctest's timeout.

Each case runs real processes: a child interpreter blocked in a function of
a known name, a `sleep` it started; what is expected (the function's name,
the system call a sleeping process is in, the READY fields) follows from
what those processes do, not from the code under test."""

import os
import select
import shutil
import subprocess
import sys
import time

import pytest

import cluster_harness as ch
import hang_report
import server_harness as h

HERE = os.path.dirname(os.path.abspath(__file__))

# The "test": starts a sleeping child, adds report sections (one that
# raises, one removed again), arms the report from $EPD_TEST_TIMEOUT_S,
# prints the child's PID, then blocks in a function whose name the report
# must show. It arms last, so that however slow the machine (a sanitizer's
# preload, a loaded CI), the report finds it blocked there.
STUCK = r"""
import subprocess, sys, time
sys.path.insert(0, sys.argv[1])
import hang_report
child = subprocess.Popen(["sleep", "300"])
hang_report.add_section("the child", lambda: f"child {child.pid} running: {child.poll() is None}")
hang_report.add_section("a broken part", lambda: 1 // 0)
hang_report.remove_section(hang_report.add_section("removed", lambda: "never shown"))
assert hang_report.arm_from_env()
print(child.pid, flush=True)
def stuck_waiting_for_the_server():
    time.sleep(300)
stuck_waiting_for_the_server()
"""


def test_report_after_leaves_time_for_the_attaches_before_ctests_timeout():
    # 0.75 of the timeout, or 120 s before it when that is later.
    assert hang_report.report_after(400) == 300
    assert hang_report.report_after(600) == 480
    assert hang_report.report_after(2400) == 2280


def test_arm_from_env_needs_a_positive_timeout(monkeypatch):
    monkeypatch.setattr(hang_report, "_armed", False)
    monkeypatch.delenv("EPD_TEST_TIMEOUT_S", raising=False)
    assert not hang_report.arm_from_env()
    for bad in ("", "soon", "0", "-5"):
        monkeypatch.setenv("EPD_TEST_TIMEOUT_S", bad)
        assert not hang_report.arm_from_env()


def test_an_armed_test_writes_its_python_stack_and_its_childrens_stacks():
    # Timeout 4 s: the report comes at 3 s; the test is killed after it.
    proc = subprocess.Popen([sys.executable, "-c", STUCK, HERE], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, EPD_TEST_TIMEOUT_S="4"))
    child_pid, err = None, b""
    try:
        child_pid = int(proc.stdout.readline().decode())
        deadline = time.monotonic() + 3 + 2 * hang_report.GDB_TIMEOUT_S
        while b"end of hang report" not in err and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            if select.select([proc.stderr.fileno()], [], [], 0)[0]:
                err += os.read(proc.stderr.fileno(), 1 << 20)
    finally:
        proc.kill()
        proc.wait()
        if child_pid is not None:
            os.kill(child_pid, 9)
    text = err.decode(errors="replace")
    assert "end of hang report" in text, text
    # faulthandler: the main thread's Python stack, by function name.
    assert "stuck_waiting_for_the_server" in text, text
    # The child, by PID and command line, with its threads.
    assert f"=== process {child_pid} " in text and "sleep 300" in text, text
    if shutil.which("gdb"):
        assert "nanosleep" in text, text  # sleep(1) waits in clock_nanosleep
    else:
        assert "state S" in text, text
    # The sections, computed when the report is written; one that raises
    # says so in its place; a removed one is absent.
    assert f"=== the child\nchild {child_pid} running: True" in text, text
    assert "=== a broken part\n(failed: ZeroDivisionError" in text, text
    assert "=== removed" not in text, text
    # This process's own C stacks come first (a lock below Python shows there).
    assert f"=== process {proc.pid} " in text, text


def _wait_asleep(pid: int, exe: str) -> None:
    """Until process `pid` runs `exe` and sleeps (state S: sleep(1) blocks
    nowhere but in its nanosleep), however slow the machine; at most 60 s."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            if os.path.realpath(f"/proc/{pid}/exe") == os.path.realpath(exe) and state == "S":
                return
        except (OSError, IndexError):
            pass
        time.sleep(0.05)


def test_process_stacks_shows_where_a_sleeping_process_waits():
    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        _wait_asleep(sleeper.pid, shutil.which("sleep"))
        text = hang_report.process_stacks(sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert text.startswith(f"=== process {sleeper.pid} ") and "sleep 300" in text, text
    assert ("nanosleep" in text) if shutil.which("gdb") else ("state S" in text), text


def _printer(script: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)


def test_read_ready_returns_the_ready_fields_after_other_lines():
    p = _printer("import time; print('loading', flush=True); time.sleep(0.3); "
                 "print('READY port=123 metrics_port=-1 server_id=a:1 http_port=-1', flush=True); time.sleep(30)")
    try:
        fields = h.read_ready(p, timeout=60)
    finally:
        p.kill()
        p.wait()
        p.stdout.close()
    assert fields == {"port": "123", "metrics_port": "-1", "server_id": "a:1", "http_port": "-1"}


def test_read_ready_gives_up_on_a_silent_process_and_on_one_that_exits():
    silent = _printer("import time; print('loading', flush=True); time.sleep(300)")
    try:
        start = time.monotonic()
        assert h.read_ready(silent, timeout=1.0) is None
        # Bounded by its timeout, not by the process (which would sleep 300 s):
        # a generous bound.
        assert time.monotonic() - start < 60
        assert silent.poll() is None
        why = h.not_ready(silent, 1.0)
        assert "no READY line in 1 s" in why and f"=== process {silent.pid} " in why, why
        assert silent.poll() is not None  # SIGKILLed after its stacks were taken
    finally:
        if silent.poll() is None:
            silent.kill()
        silent.wait()
        silent.stdout.close()
    quitter = _printer("print('no ready here')")
    try:
        assert h.read_ready(quitter, timeout=60) is None
        quitter.wait(timeout=30)
        assert h.not_ready(quitter, 60) == "it exited with status 0"
    finally:
        quitter.stdout.close()


@pytest.mark.skipif(ch.missing_reason(need_redis=False, need_nginx=False) is not None,
                    reason=str(ch.missing_reason(need_redis=False, need_nginx=False)))
def test_a_clusters_section_shows_each_running_servers_counters():
    with ch.Cluster(h.tiny_serve_args(), l3=False) as c:
        c.start_server("s0")
        s0 = c.servers["s0"]
        with c.client(s0.address) as cl:
            cl.encode([h.png(28, 28, seed=1)])
        text = c.hang_text()
        # One encode of one image: the server counted one request.
        assert f"--- s0 pid {s0.proc.pid} at {s0.address}: " in text, text
        assert "'requests': 1," in text, text
        assert f"--- s0 ({s0.log}) tail" in text, text  # then the logs' tails
        c.stop_server("s0")
        assert "--- s0 pid" not in c.hang_text()  # a stopped server has no counters to ask for

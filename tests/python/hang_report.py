"""What a stuck test leaves in its log before it is killed: the Python stack
of every thread of the test process, its C stacks, and the thread stacks of
every process it started (servers, nginx, redis, a forked child that never
reached exec).
Not a test module (pytest collects only test_*.py).

A hang that ctest's timeout ends shows nothing but the last line the test
printed; these reports say who waits on what.

- arm_from_env(): called once per test process (tests/python/conftest.py,
  cluster_harness.preflight). ctest passes each entry's TIMEOUT as
  $EPD_TEST_TIMEOUT_S (python/CMakeLists.txt, src/server/CMakeLists.txt);
  at report_after(timeout) seconds the report is written to stderr, once,
  and the test goes on (ctest still ends it at its timeout). Without the
  variable (a run by hand) nothing is armed.
- add_section(title, fn) / remove_section(token): text the report adds
  after the stacks, e.g. a cluster's Stats and log tails (cluster_harness):
  a request lost in a queue leaves no thread waiting on it, but shows in
  the counters. `fn` runs on the report's thread; what it raises is
  reported in its place.
- process_stacks(pid): one process's thread stacks as text, for a harness
  about to SIGKILL a server that did not stop or did not get ready
  (server_harness.stop_pid, server_harness.wait_ready): `gdb -batch
  -ex "thread apply all bt"` when gdb is installed, else each thread's name,
  state, wait channel and current system call from /proc.

The Python stacks come from faulthandler (written by a C thread, without the
GIL, so also when a thread holds it forever); the process stacks from a
daemon thread of this module, which needs the GIL. Each gdb attach is limited
to GDB_TIMEOUT_S and the processes are attached in parallel.

Thread safety: arm_from_env() from the main thread; the rest from any thread.
"""

import faulthandler
import os
import shutil
import subprocess
import sys
import threading
from typing import Callable, Dict, List, Optional, Tuple

# How long one gdb attach may take (attaching to a server that maps libtorch
# takes seconds on a loaded machine), s.
GDB_TIMEOUT_S = 90.0
_armed = False
_sections_lock = threading.Lock()
_sections: Dict[int, Tuple[str, Callable[[], str]]] = {}
_next_section = 0


def report_after(timeout_s: float) -> float:
    """When to report in a test with ctest timeout `timeout_s`: early enough
    that the gdb attaches (GDB_TIMEOUT_S, in parallel) end before ctest kills
    the test (400 s -> 300 s, 600 s -> 480 s, 2400 s -> 2280 s)."""
    return max(0.75 * timeout_s, timeout_s - 120.0)


def arm_from_env() -> bool:
    """Arms the report at report_after($EPD_TEST_TIMEOUT_S) seconds from now;
    False (nothing armed) when the variable is unset or not a positive
    number. Idempotent."""
    global _armed
    try:
        timeout_s = float(os.environ.get("EPD_TEST_TIMEOUT_S", ""))
    except ValueError:
        return False
    if _armed or timeout_s <= 0:
        return _armed
    _armed = True
    after = report_after(timeout_s)
    faulthandler.dump_traceback_later(after, repeat=False, file=sys.stderr, exit=False)
    timer = threading.Timer(after, lambda: write_report(f"still running {after:.0f} s after it started "
                                                        f"(ctest's timeout: {timeout_s:.0f} s)"))
    timer.daemon = True
    timer.start()
    return True


def add_section(title: str, fn: Callable[[], str]) -> int:
    """Adds `fn()`'s text, under `title`, to every report from now on;
    returns the token for remove_section()."""
    global _next_section
    with _sections_lock:
        _next_section += 1
        _sections[_next_section] = (title, fn)
        return _next_section


def remove_section(token: int) -> None:
    """Undoes add_section(); a token already removed is ignored."""
    with _sections_lock:
        _sections.pop(token, None)


def _section_texts() -> List[str]:
    with _sections_lock:
        sections = list(_sections.values())
    out = []
    for title, fn in sections:
        try:
            text = fn()
        except Exception as e:  # noqa: BLE001 - the report goes on
            text = f"(failed: {e!r})"
        out.append(f"=== {title}\n{text}")
    return out


def descendants(root: int) -> List[int]:
    """The PIDs of every live process below `root` (children, theirs, ...),
    parents before children, read from /proc."""
    children: Dict[int, List[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop(0)
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read().replace("\0", " ").strip()
    except OSError:
        return "?"


def _proc_threads(pid: int) -> str:
    """Each thread's name, state, wait channel and system call (/proc): the
    fallback without gdb."""
    lines = []
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError:
        return "(gone)"
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        state = _read(f"{base}/stat").rsplit(")", 1)[-1].split()[:1]
        lines.append(f"  thread {tid} {_read(base + '/comm')!r} state {state[0] if state else '?'} "
                     f"wchan {_read(base + '/wchan')} syscall {_read(base + '/syscall')}")
    return "\n".join(lines)


def _header(pid: int) -> str:
    fields = _read(f"/proc/{pid}/stat").rsplit(")", 1)[-1].split()
    parent = fields[1] if len(fields) > 1 else "?"
    return f"=== process {pid} (parent {parent}, state {fields[0] if fields else '?'}): {_read(f'/proc/{pid}/cmdline')}"


def _gdb_env() -> Dict[str, str]:
    """This process's environment without the sanitizer preload. Under
    EPD_ASAN, ctest starts the Python tests with LD_PRELOAD=libasan.so
    (cmake/epd_sanitizers.cmake), and a gdb that inherits it never starts:
    `gdb --version` with it sat 20 s at 0.01 s of CPU before its timeout, so
    every attach ran into GDB_TIMEOUT_S and the report came after the test's
    own deadline (docs/SANITIZERS.md). gdb needs no preload to read an
    instrumented process."""
    return {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")}


def _start_gdb(pid: int) -> Optional[subprocess.Popen]:
    gdb = shutil.which("gdb")
    if gdb is None:
        return None
    return subprocess.Popen([gdb, "-p", str(pid), "-batch", "-nx", "-ex", "set pagination off",
                             "-ex", "thread apply all bt"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=_gdb_env())


def _finish_gdb(pid: int, gdb: Optional[subprocess.Popen]) -> str:
    if gdb is None:
        return "(gdb is not installed; /proc says:)\n" + _proc_threads(pid)
    try:
        out, _ = gdb.communicate(timeout=GDB_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        gdb.kill()
        out, _ = gdb.communicate()
        out += f"\n(gdb did not finish in {GDB_TIMEOUT_S:.0f} s; /proc says:)\n" + _proc_threads(pid)
    # Only the stacks: gdb's start-up chatter (symbol loading) is noise here.
    keep = [ln for ln in out.splitlines() if ln.startswith(("Thread ", "#", "(gdb", "  thread")) or not ln]
    return "\n".join(keep).strip() or out


def process_stacks(pid: int) -> str:
    """Thread stacks of process `pid`, headed by its command line."""
    return _header(pid) + "\n" + _finish_gdb(pid, _start_gdb(pid))


def write_report(why: str, out=None) -> None:
    """Writes the stacks of this process and of every process it started
    (attached in parallel) to `out` (default stderr), headed by `why`."""
    out = out or sys.stderr
    # This process first: its C stacks say where a thread blocks below
    # Python (a lock inside fork, a gRPC call), which faulthandler cannot.
    pids = [os.getpid()] + [p for p in descendants(os.getpid()) if not _is_gdb(p)]
    gdbs = [(p, _header(p), _start_gdb(p)) for p in pids]
    parts = [f"\n##### hang report: this test ({os.getpid()}) is {why}; stacks of it and of the "
             f"{len(pids) - 1} processes it started #####"]
    parts += [header + "\n" + _finish_gdb(p, g) for p, header, g in gdbs]
    parts += _section_texts()
    parts.append("##### end of hang report #####\n")
    out.write("\n".join(parts) + "\n")
    out.flush()


def _is_gdb(pid: int) -> bool:
    return os.path.basename(_read(f"/proc/{pid}/cmdline").split(" ")[0]) == "gdb"

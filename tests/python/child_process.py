"""Child processes that die with the test that started them, even when the
test itself is killed outright (ctest's timeout, a SIGKILL, a crash).

The one launcher of the Python tests, benchmarks and tools that start
servers (redis-server, nginx, `epd-encode serve`, `epd-encode replay`):
server_harness.py, redis_harness.py and cluster_harness.py start every
process through popen() or run() here. Not a test module.

Two mechanisms (Linux):

- PR_SET_PDEATHSIG(SIGKILL), set in the child before the program runs: the
  kernel SIGKILLs the child when the thread that forked it ends. A child
  whose parent died before prctl ran kills itself at once (the parent's PID
  is compared with getppid()). The child is started as `setpriv
  --pdeathsig KILL -- sh -c 'check the parent; exec PROGRAM' PROGRAM ARGS`
  (death_argv), so no Python code runs between fork and exec: with a
  preexec_fn, CPython runs its at-fork handlers and takes the import lock
  before forking, and uses fork() instead of vfork(), and a test process
  with gRPC's threads once stayed blocked inside that fork for good
  (cluster_scale_test: its main thread in _posixsubprocess.fork_exec, no
  child created). die_with_parent, a preexec_fn doing the same, is the
  fallback where setpriv (util-linux) is missing.
  Caveat: the "parent" is the forking *thread*; start servers from a thread
  that lives as long as they should (the test's main thread).
- group=True, for servers that fork children of their own (nginx: the death
  signal is not inherited across fork, and nginx's workers outlive their
  master): the child leads a new process group, and a watchdog process, one
  per test process, SIGKILLs every group still registered once the test
  process is gone. The watchdog holds the read end of a pipe whose only
  write end is the test's (close-on-exec, so no server inherits it); EOF on
  it means the test has exited, however it exited. The watchdog's
  stdin/stdout/stderr are not ctest's pipe, so it never keeps ctest waiting.
  on_death() registers a cleanup command with the same watchdog, for a tool
  that leaves its servers detached (deploy/nginx/run-local.sh).

Thread safety: popen() and run() may be called from any thread (see the
caveat above); the watchdog's registry is guarded by a lock.
"""

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from typing import List, Optional

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent(parent: Optional[int] = None):
    """A preexec_fn: SIGKILL this child when its parent dies. `parent` is
    the parent's PID, read before the fork (default: now, which is right
    when the function is called in the parent, as popen() does)."""
    parent = os.getpid() if parent is None else parent

    def preexec() -> None:
        if _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            os._exit(126)  # cannot promise to die with the test: do not start
        if os.getppid() != parent:  # the parent died before prctl
            os.kill(os.getpid(), signal.SIGKILL)

    return preexec


_SETPRIV = shutil.which("setpriv")
_SH = shutil.which("sh") or "/bin/sh"
# Run by sh after setpriv set the death signal: a parent that died before
# that leaves the child with another parent; then the child ends itself.
_CHECK_PARENT = 'if [ "$PPID" != "$EPD_DIE_WITH" ]; then kill -KILL $$; fi; unset EPD_DIE_WITH; exec "$@"'


def death_argv(argv: List[str]) -> List[str]:
    """`argv` prefixed so that it runs with PR_SET_PDEATHSIG(SIGKILL) and a
    check that the process that started it is still its parent, with no
    Python code in the child: setpriv sets the signal, sh compares $PPID
    with $EPD_DIE_WITH (the parent's PID, _launch_kwargs) and execs
    the program in the same process (its PID is the child's). Only where
    setpriv exists (has_setpriv())."""
    return [_SETPRIV, "--pdeathsig", "KILL", "--", _SH, "-c", _CHECK_PARENT, argv[0], *argv]


def has_setpriv() -> bool:
    return _SETPRIV is not None


def _launch_kwargs(argv: List[str], kwargs: dict) -> List[str]:
    """The argv to start and the kwargs (updated in place) that make the
    child die with this process: death_argv with EPD_DIE_WITH in its
    environment, or the die_with_parent preexec_fn without setpriv. Raises
    FileNotFoundError, as Popen itself would, for a program not found."""
    if not has_setpriv():
        kwargs["preexec_fn"] = die_with_parent()
        return list(argv)
    env = dict(os.environ if kwargs.get("env") is None else kwargs["env"])
    program = argv[0]
    found = program if os.sep in program else shutil.which(program, path=env.get("PATH", os.defpath))
    if found is None or not os.access(found, os.X_OK):
        raise FileNotFoundError(2, "No such file or directory", program)
    env["EPD_DIE_WITH"] = str(os.getpid())
    kwargs["env"] = env
    return death_argv(list(argv))


# --- the watchdog ---------------------------------------------------------------------

# Reads "+ID JSON" (register {"pgid": N} or {"argv": [...]}) and "-ID"
# (forget) lines; at EOF (the test process is gone) SIGKILLs every group and
# runs every command still registered, in order.
_WATCHDOG = r"""
import json, os, signal, subprocess, sys
todo = {}
for line in sys.stdin:
    key, _, body = line.rstrip("\n").partition(" ")
    if key[0] == "+":
        todo[key[1:]] = json.loads(body)
    else:
        todo.pop(key[1:], None)
for what in todo.values():
    try:
        if "pgid" in what:
            os.killpg(what["pgid"], signal.SIGKILL)
        else:
            subprocess.run(what["argv"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=120)
    except (OSError, subprocess.SubprocessError):
        pass
"""


class _Watchdog:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pipe = None
        self._owner = 0  # the PID that started it (a forked child starts its own)
        self._next = 0

    def _write(self, line: str) -> None:
        if self._pipe is None or self._owner != os.getpid():
            read, write = os.pipe()  # both close-on-exec
            subprocess.Popen([sys.executable, "-c", _WATCHDOG], stdin=read, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
            os.close(read)
            self._pipe, self._owner = os.fdopen(write, "w", buffering=1), os.getpid()
        self._pipe.write(line + "\n")

    def add(self, what: dict) -> int:
        with self._lock:
            self._next += 1
            self._write(f"+{self._next} {json.dumps(what)}")
            return self._next

    def discard(self, token: int) -> None:
        with self._lock:
            self._write(f"-{token}")


_watchdog = _Watchdog()


def on_death(argv: List[str]) -> int:
    """Registers `argv` to be run (by the watchdog, with a 120 s limit) if
    this process dies before forget(token) is called: the cleanup of a tool
    that leaves servers detached (deploy/nginx/run-local.sh stop). Returns
    the token for forget()."""
    return _watchdog.add({"argv": list(argv)})


def forget(token: int) -> None:
    """Undoes on_death()."""
    _watchdog.discard(token)


# --- starting and stopping ----------------------------------------------------------


def popen(argv: List[str], group: bool = False, **kwargs) -> subprocess.Popen:
    """subprocess.Popen(argv, **kwargs) whose process dies with this one
    (death_argv). group=True: it also leads a new process group (its
    PID is the group's id), which the watchdog SIGKILLs if this process dies;
    stop such a process with stop_group(). stdin defaults to /dev/null."""
    kwargs.setdefault("stdin", subprocess.DEVNULL)
    if group:
        kwargs["process_group"] = 0
    argv = _launch_kwargs(argv, kwargs)
    proc = subprocess.Popen(argv, **kwargs)
    proc.epd_watch = _watchdog.add({"pgid": proc.pid}) if group else None
    return proc


def run(argv: List[str], **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run(argv, **kwargs) whose process dies with this one."""
    argv = _launch_kwargs(argv, kwargs)
    return subprocess.run(argv, **kwargs)


def stop_group(proc: subprocess.Popen, sig: int = signal.SIGTERM, grace: float = 20.0) -> Optional[int]:
    """For a popen(group=True) process: `sig` to its PID, a wait of up to
    `grace` s, then SIGKILL to the whole group (children that outlived it
    included), and the group leaves the watchdog. Returns the exit status."""
    if proc.poll() is None:
        try:
            os.kill(proc.pid, sig)
            proc.wait(timeout=grace)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:  # the group is empty: all exited
        pass
    if proc.poll() is None:
        proc.wait(timeout=10)
    if proc.epd_watch is not None:
        _watchdog.discard(proc.epd_watch)
        proc.epd_watch = None
    return proc.returncode


def _state(path: str) -> str:
    """The state letter of path/stat ("R", "S", "Z", ...); "" if none."""
    try:
        with open(os.path.join(path, "stat")) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def alive(pid: int) -> bool:
    """Whether process `pid` has not finished exiting. A zombie (dead, not
    yet reaped by its parent) is gone once all its threads are: the main
    thread of a multi-threaded server turns zombie first, while its other
    threads may still be closing its files (its listening socket)."""
    base = f"/proc/{pid}"
    state = _state(base)
    if state in ("Z", "X", ""):
        try:
            tasks = os.listdir(os.path.join(base, "task"))
        except OSError:
            return False
        return any(_state(os.path.join(base, "task", t)) not in ("Z", "X", "") for t in tasks)
    return True

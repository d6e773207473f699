"""A cluster on loopback for tests and benchmarks: one real redis-server, N
`epd-encode serve` processes, and nginx in front of them with content-key
affinity (deploy/nginx/nginx.conf.template, the deployment's own file).

Not a test module (pytest collects only test_*.py). Standard library plus the
project's Python client (epd.client, for Stats).

    with Cluster(serve_args=h.tiny_serve_args(), l3=True) as c:
        c.start_servers(["s0", "s1", "s2"])
        c.start_nginx()                       # upstream = the running servers
        with c.client() as cl:
            cl.encode([image])
        c.start_server("s3"); c.stop_server("s0")
        c.set_upstream(["s1", "s2", "s3"])    # rewrite + `nginx -s reload`
        print(c.total("misses"))

A cluster test script (tests/deploy/test_cluster_*.py) starts with
preflight(), counts with Checks, and reads the servers' Stats through
stats(), total(), field_sum() and field_delta(). Redis comes from
redis_harness.py, the one launcher of the Python tests.

Every process is started by this module, recorded by PID, and stopped by that
PID (SIGTERM, then SIGKILL after a grace) in close(), which __exit__ and an
atexit hook both call, so a failing test leaves nothing running. Children are
started through child_process.popen, so they die with the test process if it
is killed outright (nginx in a process group of its own, which the watchdog
kills with its workers). Each Cluster keeps its state (nginx config and logs, redis
dir, server logs) in one temporary directory, removed on close unless
keep_dir is set or EPD_KEEP_CLUSTER_DIR=1.

The L3 flags (--l3 redis://HOST:PORT, --l3-timeout-ms, --l3-lease-ms 0 for
no single flight, ...) are those of tools/l3_flags.h; their spelling lives in
L3_FLAGS below, in one place.
"""

import atexit
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Dict, Iterable, List, Optional, Sequence

import child_process
import hang_report
import server_harness as h
from redis_harness import RedisServer, redis_binary  # noqa: F401 - redis_binary is part of this API
from server_harness import stop_pid

NGINX_TEMPLATE = os.path.join(h.REPO, "deploy", "nginx", "nginx.conf.template")

# The serve flags of the L3 tier (issue 14, tools/l3_flags.h): one home for
# their spelling here.
L3_FLAGS = {
    "url": "--l3",
    "ttl_s": "--l3-ttl-s",
    "timeout_ms": "--l3-timeout-ms",
    "lease_ms": "--l3-lease-ms",
}
# Single flight off: no cluster lease (--l3-lease-ms 0).
NO_SINGLE_FLIGHT = [L3_FLAGS["lease_ms"], "0"]
# Tests and benchmarks are not about Redis timeouts: on this shared machine a
# GET can stall past the 50 ms default, which would turn an L3 hit into a
# tower run. Fault tests that want timeouts pass their own.
PATIENT_L3 = [L3_FLAGS["timeout_ms"], "2000"]


def nginx_binary() -> Optional[str]:
    for p in (os.environ.get("NGINX"), shutil.which("nginx"), "/usr/sbin/nginx"):
        if p and os.access(p, os.X_OK):
            return p
    return None


def missing_reason(need_redis: bool = True, need_nginx: bool = True) -> Optional[str]:
    """Why cluster tests cannot run here, or None when they can."""
    reason = h.missing_reason()
    if reason:
        return reason
    if need_redis and redis_binary() is None:
        return "redis-server is not installed (scripts/install-deps.sh build)"
    if need_nginx and nginx_binary() is None:
        return "nginx is not installed (scripts/install-deps.sh build)"
    try:
        import epd.client  # noqa: F401
    except ImportError as e:
        return f"epd.client is not importable ({e}); build target epd_python_stubs and set PYTHONPATH"
    return None


def serve_supports(flag: str) -> bool:
    """Whether this build's `epd-encode serve` knows `flag`."""
    out = subprocess.run([h.encode_binary(), "serve", "--help"], capture_output=True, text=True, timeout=30)
    return flag in out.stdout + out.stderr


def preflight(need_redis: bool = True, need_nginx: bool = True, serve_flags: Sequence[str] = ()) -> Optional[int]:
    """None when a cluster test script can run here (and, under ctest, the
    hang report is armed: hang_report.arm_from_env). Otherwise it prints why
    and returns the status its main() should exit with: 77 (CTest
    SKIP_RETURN_CODE) when a binary or module is missing (missing_reason),
    1 when this `epd-encode serve` lacks one of `serve_flags` (e.g. built
    without epd::l3)."""
    hang_report.arm_from_env()  # stacks in the log if the script hangs (ctest's TIMEOUT)
    reason = missing_reason(need_redis=need_redis, need_nginx=need_nginx)
    if reason:
        print(f"SKIP: {reason}")
        return 77
    for flag in serve_flags:
        if not serve_supports(flag):
            print(f"FAIL: this epd-encode serve has no {flag} flag (built without epd::l3?)")
            return 1
    return None


# --- checks and stats ------------------------------------------------------------


class Checks:
    """The lines a cluster test script prints: check(cond, what) prints "ok"
    or "FAIL" before `what` and keeps each failure in `failures`; the script
    exits 1 when any is there. A failed check does not stop the script, so one
    run reports every failure."""

    def __init__(self):
        self.failures: List[str] = []

    def __call__(self, cond: bool, what: str) -> bool:
        print(("ok   " if cond else "FAIL ") + what, flush=True)
        if not cond:
            self.failures.append(what)
        return bool(cond)


def field_sum(stats: Dict[str, Dict[str, object]], field: str, names: Optional[Iterable[str]] = None) -> int:
    """`field` of the servers' Stats (name -> Stats, as Cluster.stats()
    returns them) summed over `names` (default: every server in `stats`);
    0 where a server does not report the field."""
    names = stats.keys() if names is None else names
    return sum(int(stats[n].get(field, 0) or 0) for n in names)


def field_delta(before: Dict[str, Dict[str, object]], after: Dict[str, Dict[str, object]], field: str,
                names: Optional[Iterable[str]] = None) -> int:
    """How much `field` grew between two Cluster.stats() snapshots, summed
    over `names` (default: every server in `after`). A server missing from
    `before` (started in between) counts from 0."""
    names = after.keys() if names is None else names
    return sum(int(after[n].get(field, 0) or 0) - int(before.get(n, {}).get(field, 0) or 0) for n in names)


# --- encode servers ------------------------------------------------------------


class EncodeServer:
    """One `epd-encode serve` process. The first start takes a free port; a
    restart reuses it, so nginx's upstream line stays valid."""

    def __init__(self, name: str, args: List[str], log_dir: str):
        self.name, self.args = name, args
        self.port = 0
        self.metrics_port = 0
        self.proc: Optional[subprocess.Popen] = None
        self.log = os.path.join(log_dir, f"{name}.log")
        self.starts = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 240.0) -> None:
        self.spawn()
        self.wait_ready(timeout)

    def spawn(self) -> None:
        """Starts the process; wait_ready() waits for it (so several servers
        can load their models at once)."""
        argv = [h.encode_binary(), "serve", "--host", "127.0.0.1", "--port", str(self.port),
                "--metrics-port", "-1", "--server-id", self.name] + self.args
        with open(self.log, "a") as log:
            log.write(f"--- start {self.starts}: {' '.join(argv)}\n")
            log.flush()
            self.proc = child_process.popen(argv, stdout=subprocess.PIPE, stderr=log, text=True)
        self.starts += 1

    def wait_ready(self, timeout: float = 240.0) -> None:
        """Until the server printed READY (and its port is known)."""
        fields = h.read_ready(self.proc, timeout)
        if fields is not None:
            self.port = int(fields["port"])
            # Nothing else is printed on stdout; drop the pipe so a late
            # line can never block the server.
            self.proc.stdout.close()
            return
        why = h.not_ready(self.proc, timeout)
        raise RuntimeError(f"{self.name} did not get ready ({why}); tail of {self.log}:\n{tail(self.log)}")

    def stop(self, sig: int = signal.SIGTERM) -> Optional[int]:
        if self.proc is None:
            return None
        rc = stop_pid(self.proc, sig)
        self.proc = None
        return rc

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stats(self, timeout: float = 30.0) -> Dict[str, object]:
        from epd import client as ec
        with ec.EncodeClient(self.address, timeout=timeout) as c:
            return c.stats()


def tail(path: str, n: int = 30) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return "(no log)"


# --- nginx -----------------------------------------------------------------------


class Nginx:
    """nginx in the foreground (`daemon off`), so our Popen PID is the master:
    SIGHUP reloads, SIGQUIT stops. The config is the deployment template with
    the upstream lines filled in."""

    def __init__(self, workdir: str):
        self.dir = os.path.join(workdir, "nginx")
        os.makedirs(os.path.join(self.dir, "logs"), exist_ok=True)
        os.makedirs(os.path.join(self.dir, "tmp"), exist_ok=True)
        self.conf = os.path.join(self.dir, "nginx.conf")
        self.front_port, self.rr_port = h.free_ports(2)
        self.proc: Optional[subprocess.Popen] = None
        self.upstream: List[str] = []

    @property
    def front(self) -> str:
        return f"127.0.0.1:{self.front_port}"

    def render(self, addresses: Sequence[str]) -> None:
        with open(NGINX_TEMPLATE) as f:
            text = f.read()
        servers = "".join(f"    server {a} max_fails=1 fail_timeout=10s;\n" for a in addresses)
        text = (text.replace("@RUN_DIR@", self.dir)
                .replace("@USER_LINE@", "user root root;" if os.getuid() == 0 else "")
                .replace("@FRONT_PORT@", str(self.front_port)).replace("@RR_PORT@", str(self.rr_port)))
        text = "\n".join(servers.rstrip("\n") if line == "@SERVERS@" else line for line in text.split("\n"))
        tmp = self.conf + ".new"
        with open(tmp, "w") as f:
            f.write(text)
        check = subprocess.run([nginx_binary(), "-p", self.dir, "-c", tmp, "-e", self._log("error.log"), "-t", "-q"],
                               capture_output=True, text=True, timeout=30)
        if check.returncode != 0:
            raise RuntimeError(f"nginx rejected the config: {check.stderr}")
        os.replace(tmp, self.conf)
        self.upstream = list(addresses)

    def _log(self, name: str) -> str:
        return os.path.join(self.dir, "logs", name)

    def start(self, addresses: Sequence[str]) -> None:
        self.render(addresses)
        # Its own process group: the watchdog kills the workers too if the
        # test dies (they outlive their master otherwise).
        with open(self._log("stderr.log"), "a") as err:
            self.proc = child_process.popen([nginx_binary(), "-p", self.dir, "-c", self.conf, "-e",
                                             self._log("error.log"), "-g", "daemon off;"], group=True,
                                            stdout=subprocess.DEVNULL, stderr=err)
        h.wait_port(self.front_port, 20, self.proc)
        self._wait_workers(set())

    def workers(self) -> List[int]:
        """The PIDs of the master's worker processes now."""
        out = []
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == self.proc.pid and fields[0] != "Z":
                out.append(int(pid))
        return out

    def _wait_workers(self, old: set, timeout: float = 30.0) -> None:
        """Until a worker runs that is not in `old` and no worker of `old` is left."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            now = set(self.workers())
            if now - old and not (now & old):
                return
            time.sleep(0.05)
        raise RuntimeError(f"nginx workers did not turn over after reload (old {sorted(old)}, "
                           f"now {self.workers()}); {tail(self._log('error.log'))}")

    def reload(self, addresses: Sequence[str]) -> None:
        """New upstream, `nginx -s reload` (SIGHUP to our master), and waits
        until only workers with the new configuration are left. Close client
        channels first: an old worker drains its open connections before it
        exits."""
        old = set(self.workers())
        self.render(addresses)
        os.kill(self.proc.pid, signal.SIGHUP)
        self._wait_workers(old)

    def stop(self) -> None:
        if self.proc is not None:
            # SIGQUIT: a graceful stop; then SIGKILL to the group, for a
            # worker outliving its master (never expected).
            child_process.stop_group(self.proc, signal.SIGQUIT)
            self.proc = None


# --- the cluster -------------------------------------------------------------------

_open_clusters: List["Cluster"] = []


@atexit.register
def _close_all() -> None:
    for c in list(_open_clusters):
        c.close()


class Cluster:
    """redis (when l3), encode servers by name, nginx. See the module docstring.

    serve_args: flags for every server (model, threads, cache sizes).
    l3: start a redis-server and pass --l3 <its url> to every server.
    l3_args: further L3 flags (default PATIENT_L3; e.g. NO_SINGLE_FLIGHT + PATIENT_L3).
    redis_maxmemory_mb: redis maxmemory with allkeys-lru (None: unlimited).
    """

    def __init__(self, serve_args: Sequence[str], l3: bool = True, l3_args: Sequence[str] = tuple(PATIENT_L3),
                 redis_maxmemory_mb: Optional[float] = None, keep_dir: bool = False, prefix: str = "epd-cluster-"):
        self.dir = tempfile.mkdtemp(prefix=prefix)
        self.keep_dir = keep_dir or os.environ.get("EPD_KEEP_CLUSTER_DIR") == "1"
        os.makedirs(os.path.join(self.dir, "logs"), exist_ok=True)
        self.serve_args, self.l3, self.l3_args = list(serve_args), l3, list(l3_args)
        self.servers: Dict[str, EncodeServer] = {}
        self.nginx: Optional[Nginx] = None
        self.redis: Optional[RedisServer] = None
        # Stats of servers that were stopped (a restart starts counting at 0):
        # name -> list of the last Stats of each earlier life.
        self.retired: Dict[str, List[Dict[str, object]]] = {}
        _open_clusters.append(self)
        # A hung test's report (hang_report) shows each server's counters
        # and the logs' tails: a request lost in a queue leaves no stack.
        self._report = hang_report.add_section(f"cluster in {self.dir}", self.hang_text)
        if l3:
            self.redis = RedisServer(self.dir, maxmemory_mb=redis_maxmemory_mb)
            self.redis.start()

    # context manager
    def __enter__(self) -> "Cluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def server_args(self) -> List[str]:
        args = list(self.serve_args)
        if self.redis is not None:
            args += [L3_FLAGS["url"], self.redis.url] + self.l3_args
        return args

    # servers
    def start_server(self, name: str) -> EncodeServer:
        s = self.servers.get(name)
        if s is None:
            s = self.servers[name] = EncodeServer(name, self.server_args(), os.path.join(self.dir, "logs"))
        s.start()
        return s

    def start_servers(self, names: Iterable[str]) -> None:
        """Starts several servers at once and waits for all of them."""
        names = list(names)
        for n in names:
            if n not in self.servers:
                self.servers[n] = EncodeServer(n, self.server_args(), os.path.join(self.dir, "logs"))
            self.servers[n].spawn()
        for n in names:
            self.servers[n].wait_ready()

    def stop_server(self, name: str, sig: int = signal.SIGTERM, keep_stats: bool = True) -> Optional[int]:
        """Stops one server by PID (SIGKILL for a crash). Its last Stats are
        kept in `retired` first (keep_stats), so totals still count them."""
        s = self.servers[name]
        if keep_stats and s.running and sig != signal.SIGKILL:
            self.retired.setdefault(name, []).append(s.stats())
        return s.stop(sig)

    def restart_server(self, name: str) -> EncodeServer:
        self.stop_server(name)
        return self.start_server(name)

    def running(self) -> List[str]:
        return [n for n, s in self.servers.items() if s.running]

    # nginx
    def start_nginx(self, names: Optional[Sequence[str]] = None) -> None:
        self.nginx = Nginx(self.dir)
        self.nginx.start([self.servers[n].address for n in (names if names is not None else self.running())])

    def set_upstream(self, names: Sequence[str]) -> None:
        """Rewrites nginx's upstream to these servers and reloads nginx."""
        self.nginx.reload([self.servers[n].address for n in names])

    @property
    def front(self) -> str:
        return self.nginx.front

    def client(self, target: Optional[str] = None, timeout: float = 60.0):
        """An EncodeClient on the nginx front (or on `target`)."""
        from epd import client as ec
        return ec.EncodeClient(target or self.front, timeout=timeout)

    # stats
    def stats(self) -> Dict[str, Dict[str, object]]:
        """Stats of every running server, by name."""
        return {n: s.stats() for n, s in self.servers.items() if s.running}

    def total(self, field: str, stats: Optional[Dict[str, Dict[str, object]]] = None) -> int:
        """`field` summed over the running servers' Stats and every retired
        life's last Stats (0 where a server does not report the field)."""
        stats = self.stats() if stats is None else stats
        lives = [s for ls in self.retired.values() for s in ls]
        return field_sum(stats, field) + sum(int(s.get(field, 0) or 0) for s in lives)

    def wait_l3_entries(self, n: int, timeout: float = 30.0, pattern: str = "*") -> int:
        """Waits until redis holds at least n keys matching pattern (the
        servers write L3 after the tower, asynchronously); returns the count."""
        deadline = time.monotonic() + timeout
        count = 0
        while time.monotonic() < deadline:
            count = len(self.redis.keys(pattern))
            if count >= n:
                return count
            time.sleep(0.05)
        return count

    def logs(self) -> str:
        parts = []
        for n, s in self.servers.items():
            parts.append(f"--- {n} ({s.log}) tail\n{tail(s.log)}")
        if self.nginx:
            parts.append(f"--- nginx error.log tail\n{tail(self.nginx._log('error.log'))}")
        if self.redis:
            parts.append(f"--- redis log tail\n{tail(self.redis.log)}")
        return "\n".join(parts)

    def hang_text(self) -> str:
        """Each running server's PID and Stats, then logs(): the cluster's
        part of a hang report."""
        parts = []
        for n, s in list(self.servers.items()):
            proc = s.proc  # read once: the test's thread may stop it meanwhile
            if proc is None or proc.poll() is not None:
                continue
            try:
                stats = s.stats(timeout=10)
            except Exception as e:  # noqa: BLE001 - the other servers still count
                stats = f"(Stats failed: {e!r})"
            parts.append(f"--- {n} pid {proc.pid} at {s.address}: {stats}")
        return "\n".join(parts + [self.logs()])

    @contextlib.contextmanager
    def logs_on_failure(self, checks: Checks):
        """Prints logs() when the block raises or when `checks` holds a
        failure after it."""
        raised = False
        try:
            yield
        except BaseException:
            raised = True
            raise
        finally:
            if raised or checks.failures:
                print(self.logs())

    def close(self) -> None:
        """Stops nginx, every server and redis, each by its PID; idempotent."""
        if self not in _open_clusters:
            return
        _open_clusters.remove(self)
        hang_report.remove_section(self._report)
        errors = []
        for step in ([self.nginx.stop] if self.nginx else []) + \
                [s.stop for s in self.servers.values()] + ([self.redis.stop] if self.redis else []):
            try:
                step()
            except Exception as e:  # noqa: BLE001 - stop the rest anyway
                errors.append(repr(e))
        if not self.keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            print(f"cluster state kept in {self.dir}")
        if errors:
            raise RuntimeError("while stopping the cluster: " + "; ".join(errors))


# --- images --------------------------------------------------------------------------


def distinct_images(n: int, side: int = 64, base_seed: int = 0) -> List[bytes]:
    """n PNGs with distinct bytes (so distinct content keys): the demo
    photographs, cropped at n different offsets and sizes, when the build has
    them (build/demo-data/originals, from scripts/demo.sh) and Pillow is
    installed; otherwise generated patterns (server_harness.png)."""
    originals = os.path.join(h.build_dir(), "demo-data", "originals")
    photos = sorted(os.path.join(originals, f) for f in os.listdir(originals)) if os.path.isdir(originals) else []
    if photos:
        try:
            import io

            from PIL import Image
        except ImportError:
            photos = []
    if not photos:
        return [h.png(side, side, base_seed + i) for i in range(n)]
    opened = [Image.open(p).convert("RGB") for p in photos]
    out = []
    for i in range(n):
        img = opened[i % len(opened)]
        k = base_seed + i // len(opened)
        # Crop origin and size vary with k; rescale to about `side` pixels.
        w, hgt = img.size
        crop = max(side, min(w, hgt) // 2 + (k * 37) % max(1, min(w, hgt) // 2))
        x = (k * 53) % max(1, w - crop + 1)
        y = (k * 29) % max(1, hgt - crop + 1)
        tile = img.crop((x, y, x + crop, y + crop)).resize((side + (k % 3) * 8, side))
        buf = io.BytesIO()
        tile.save(buf, format="PNG")
        out.append(buf.getvalue())
    return out

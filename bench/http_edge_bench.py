#!/usr/bin/python3
"""The HTTP edge under the attacks of issue 40 (docs/SERVER.md, "HTTP edge"):
one real `epd-encode serve` (the tiny tower, --http-port 0, --metrics-port 0,
--auth-token-file) and hostile clients on loopback. A benchmark, not a test:
it asserts nothing and prints what it measured.

  hit_solo     another client's cached hit: POST /v1/chat/completions with
               one small PNG as a data: URL (encoded once while warming, so
               every probe is an L1 hit), --probes of them on one keep-alive
               connection, --probe-gap-ms apart: p50 / p99 ms
  hit_slow_*   the same probes while --slow connections each send a complete
               authenticated head and then one body byte every --trickle-s
               (`content_length`: Content-Length: 100000; `chunked`:
               Transfer-Encoding: chunked, a 100000-byte chunk). A slow
               connection the server answers or closes is opened again at
               once, so all of them trickle for the whole measurement;
               the reopenings are counted. Target: p99 <= 2x hit_solo's p99.
  rss_unauth   two concurrent unauthenticated POSTs, each a chunked body of
               up to --upload-mb MiB in 1 MiB chunks, sent until the server
               closes the connection: the server's VmRSS before, its peak
               (sampled every 5 ms, and VmHWM after resetting it), what each
               client got back and how many bytes it sent before the answer
               and in all. Target: growth <= --http-max-body-mb + 10 %.
  rss_auth     the same with the token (the body limit, not the token,
               stops them: 413); informational.
  metrics_slow --metrics-slow connections send `POST /metrics` heads and
               trickle a body to the metrics port while --scrapes scrapes
               (GET /metrics, fresh connection each) are timed.
With --compare BIN (default: <build>/bench/http_server_compare when built),
it also runs the Boost.Beast / libmicrohttpd comparison and includes its
JSON. Every phase is bounded (--phase-budget-s, 60 s request timeouts).

  bench/http_edge_bench.py [--build build] [--slow 200] [--probes 200]
      [--out results.json] [--md table.md]

Prints the JSON summary, then a markdown table. Client and server share the
machine's cores."""

import argparse
import base64
import datetime
import http.client
import json
import os
import platform
import re
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))
import server_harness as h  # noqa: E402

TOKEN = "bench-edge-token"
CHAT = "/v1/chat/completions"


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else None


def status_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M).group(1))


def chat_body(png):
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    return json.dumps({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}]}]}).encode()


class Prober:
    """Cached hits on one keep-alive connection (TCP_NODELAY, as aiohttp)."""

    def __init__(self, port, body):
        self.port, self.body, self.conn = port, body, None

    def one(self):
        """(ms, status); status None on a transport error."""
        t = time.perf_counter()
        try:
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                self.conn.connect()
                self.conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.conn.request("POST", CHAT, body=self.body, headers={
                "Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
            r = self.conn.getresponse()
            r.read()
            status = r.status
            if r.getheader("Connection", "").lower() == "close":
                self.close()
        except (OSError, http.client.HTTPException):
            self.close()
            status = None
        return (time.perf_counter() - t) * 1000, status

    def run(self, n, gap_ms, budget_s):
        ms, failures, statuses = [], 0, {}
        t0 = time.monotonic()
        for _ in range(n):
            if time.monotonic() - t0 > budget_s:
                break
            dt, status = self.one()
            statuses[str(status)] = statuses.get(str(status), 0) + 1
            if status == 200:
                ms.append(dt)
            else:
                failures += 1
            time.sleep(gap_ms / 1000)
        return {"n": len(ms) + failures, "ok": len(ms), "failures": failures, "statuses": statuses,
                "p50_ms": pct(ms, 50), "p99_ms": pct(ms, 99), "max_ms": pct(ms, 100),
                "wall_s": round(time.monotonic() - t0, 2)}

    def close(self):
        if self.conn is not None:
            self.conn.close()
        self.conn = None


class Trickler:
    """`n` connections that send `head` and then one body byte every
    `period` s; reopened when the server answers or closes them."""

    def __init__(self, port, n, head, byte, period):
        self.port, self.head, self.byte, self.period = port, head, byte, period
        self.socks = [self._open() for _ in range(n)]
        self.reopened = 0
        self.answers = {}
        self.stop_flag = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _open(self):
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=10)
            s.sendall(self.head)
            s.setblocking(False)
            return s
        except OSError:
            return None

    def _answered(self, s):
        r, _, _ = select.select([s], [], [], 0)
        if not r:
            return False
        try:
            data = s.recv(4096)
            m = re.match(rb"HTTP/1\.1 (\d+)", data)
            key = m.group(1).decode() if m else "closed"
        except OSError:
            key = "reset"
        self.answers[key] = self.answers.get(key, 0) + 1
        return True

    def _run(self):
        while not self.stop_flag.is_set():
            start = time.monotonic()
            for i, s in enumerate(self.socks):
                ok = s is not None and not self._answered(s)
                if ok:
                    try:
                        ok = s.send(self.byte) == 1
                    except OSError:
                        ok = False
                if not ok:
                    if s is not None:
                        s.close()
                    self.socks[i] = self._open()
                    self.reopened += 1
            self.stop_flag.wait(max(0.0, self.period - (time.monotonic() - start)))

    def stop(self):
        """Stops; returns how many connections the server still held."""
        self.stop_flag.set()
        self.thread.join()
        held = 0
        for s in self.socks:
            if s is not None:
                r, _, _ = select.select([s], [], [], 0)
                held += not r
                s.close()
        return held


def slow_head(framing, path=CHAT, token=True):
    auth = b"Authorization: Bearer " + TOKEN.encode() + b"\r\n" if token else b""
    frame = b"Content-Length: 100000\r\n\r\n" if framing == "content_length" else \
        b"Transfer-Encoding: chunked\r\n\r\n186a0\r\n"
    return b"POST " + path.encode() + b" HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n" + auth + frame


def hits_under_slow_bodies(a, port, body, framing):
    t = Trickler(port, a.slow, slow_head(framing), b"x", a.trickle_s)
    time.sleep(a.trickle_s)  # every slow head has arrived and trickles
    p = Prober(port, body)
    out = p.run(a.probes, a.probe_gap_ms, a.phase_budget_s)
    p.close()
    out["slow_connections"] = a.slow
    out["slow_reopened"] = t.reopened
    out["slow_held_at_end"] = t.stop()
    out["slow_answers"] = t.answers
    return out


def upload(port, mb, token, result):
    """One chunked POST of up to `mb` MiB, sent until the server closes."""
    chunk = b"100000\r\n" + b"x" * 0x100000 + b"\r\n"
    sent, before_answer, answer = 0, None, None
    auth = b"Authorization: Bearer " + TOKEN.encode() + b"\r\n" if token else b""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n" +
                  auth + b"Transfer-Encoding: chunked\r\n\r\n")
        for _ in range(mb):
            if answer is None and select.select([s], [], [], 0)[0]:
                data = s.recv(4096)
                answer = data.split(b"\r\n", 1)[0].decode(errors="replace") or "closed"
                before_answer = sent
            s.sendall(chunk)
            sent += len(chunk)
    except OSError as e:
        if answer is None:  # the answer may be waiting in the receive buffer, behind the error
            try:
                s.settimeout(2)
                answer = s.recv(4096).split(b"\r\n", 1)[0].decode(errors="replace") or None
                before_answer = sent
            except (OSError, NameError):
                pass
        if answer is None:
            answer = f"{type(e).__name__}, no answer read"
    finally:
        try:
            s.close()
        except (OSError, NameError):
            pass
    result.update({"answer": answer, "mb_sent_before_answer": None if before_answer is None else round(
        before_answer / 2 ** 20, 1), "mb_sent": round(sent / 2 ** 20, 1)})


def rss_under_uploads(a, pid, port, token):
    before = status_kb(pid, "VmRSS")
    try:  # reset VmHWM to the current RSS (proc(5), clear_refs "5")
        with open(f"/proc/{pid}/clear_refs", "w") as f:
            f.write("5")
        hwm_reset = True
    except OSError:
        hwm_reset = False
    peak = [before]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], status_kb(pid, "VmRSS"))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    results = [{} for _ in range(a.uploads)]
    t0 = time.monotonic()
    threads = [threading.Thread(target=upload, args=(port, a.upload_mb, token, r)) for r in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=a.phase_budget_s)
    time.sleep(0.5)
    done.set()
    sampler.join()
    hwm = status_kb(pid, "VmHWM") if hwm_reset else None
    peak_kb = max(peak[0], hwm or 0)
    limit_mb = a.http_max_body_mb
    return {"rss_before_mb": round(before / 1024, 1), "rss_peak_mb": round(peak_kb / 1024, 1),
            "growth_mb": round((peak_kb - before) / 1024, 1), "vmhwm_used": hwm_reset,
            "target_mb": round(limit_mb * 1.1, 1), "wall_s": round(time.monotonic() - t0, 2), "uploads": results}


def scrape(port):
    t = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\nAuthorization: Bearer " +
                      TOKEN.encode() + b"\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        ok = data.startswith(b"HTTP/1.1 200")
    except OSError:
        ok = False
    return (time.perf_counter() - t) * 1000, ok


def scrapes_under_slow_posts(a, metrics_port):
    t = Trickler(metrics_port, a.metrics_slow, slow_head("content_length", "/metrics"), b"x", a.trickle_s)
    time.sleep(a.trickle_s)
    ms, failures = [], 0
    for _ in range(a.scrapes):
        dt, ok = scrape(metrics_port)
        if ok:
            ms.append(dt)
        else:
            failures += 1
    out = {"slow_connections": a.metrics_slow, "scrapes": a.scrapes, "failures": failures,
           "p50_ms": pct(ms, 50), "p99_ms": pct(ms, 99), "max_ms": pct(ms, 100),
           "slow_reopened": t.reopened, "slow_answers": t.answers}
    out["slow_held_at_end"] = t.stop()
    return out


def run_compare(a):
    binary = a.compare or os.path.join(a.build, "bench", "http_server_compare")
    if not os.access(binary, os.X_OK):
        return {"skipped": f"{binary} is not built (-DEPD_BUILD_BENCH=ON, libmicrohttpd-dev)"}
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        subprocess.run([binary, "--slow", str(a.slow), "--json", f.name], check=True, timeout=600,
                       stdout=subprocess.DEVNULL)
        return json.load(open(f.name))


def fmt(x, d=2):
    return "-" if x is None else f"{x:.{d}f}"


def render_body(d):
    """The markdown tables of a result (also used by bench/report.py)."""
    lines = [f"{d['date']}, {d['machine']}; `{d['command']}`. Client and server share the cores; load average "
             f"{' '.join(d['loadavg_before'])} before, {' '.join(d.get('loadavg_after', []))} after.", "",
             "| attack | measured | target | result |", "| --- | --- | --- | --- |"]
    solo = d["hit_solo"]
    lines.append(f"| cached hit alone ({solo['ok']} of {solo['n']}) | p50 {fmt(solo['p50_ms'])} ms, "
                 f"p99 {fmt(solo['p99_ms'])} ms | | |")
    for what, goal, value, met, _ in targets(d):
        lines.append(f"| {what} | {value} | {goal} | {'met' if met else '**missed**'} |")
    m = d.get("metrics_slow")
    if m:
        lines.append(f"| {m['scrapes']} scrapes beside {m['slow_connections']} slow `POST /metrics` | p50 "
                     f"{fmt(m['p50_ms'])} ms, p99 {fmt(m['p99_ms'])} ms, max {fmt(m['max_ms'])} ms, "
                     f"{m['failures']} failed; slow ones answered {m['slow_answers']} | | |")
    for name in ("rss_auth",):
        r = d.get(name)
        if r:
            lines.append(f"| RSS, 2 authenticated {d['config']['upload_mb']} MiB chunked bodies (informational) | "
                         f"+{r['growth_mb']} MB ({r['rss_before_mb']} -> {r['rss_peak_mb']}); answers "
                         f"{', '.join(str(u.get('answer')) for u in r['uploads'])} | | |")
    c = d.get("compare", {}).get("servers")
    if c:
        lines += ["", "| server | keep-alive req/s | keep-alive p99 ms | /health alone p50 / p99 ms | "
                  f"/health beside {d['compare']['config']['slow']} slow bodies p50 / p99 / max ms | "
                  "slow bodies reopened / held at end |", "| --- | --- | --- | --- | --- | --- |"]
        for name, r in c.items():
            lines.append(f"| {name} | {r['keepalive_requests_per_s']:.0f} | {r['keepalive_p99_ms']:.3f} | "
                         f"{r['solo_p50_ms']:.3f} / {r['solo_p99_ms']:.3f} | {r['slow_p50_ms']:.3f} / "
                         f"{r['slow_p99_ms']:.3f} / {r['slow_max_ms']:.3f} | {r['slow_reopened']:.0f} / "
                         f"{r['slow_held_at_end']:.0f} |")
    return "\n".join(lines) + "\n"


def targets(d):
    """(what, goal, value, met, margin) for each target of issue 40."""
    out = []
    solo = d["hit_solo"]["p99_ms"]
    for framing in ("content_length", "chunked"):
        r = d.get(f"hit_slow_{framing}")
        if not r or solo is None:
            continue
        p99 = r["p99_ms"]
        met = p99 is not None and r["failures"] == 0 and p99 <= 2 * solo
        value = (f"p99 {fmt(p99)} ms ({p99 / solo:.2f}x solo)" if p99 is not None else "no answer") + \
            f", {r['ok']} of {r['n']} answered 200 {r['statuses']}; slow ones reopened {r['slow_reopened']}"
        out.append((f"cached hit beside {r['slow_connections']} slow bodies ({framing.replace('_', '-')})",
                    "p99 <= 2x alone", value, met, f"{p99 / solo:.2f}x" if p99 else "n/a"))
    r = d.get("rss_unauth")
    if r:
        answers = ", ".join(f"{u.get('answer')} (read after {u.get('mb_sent_before_answer')} MiB sent; "
                            f"{u.get('mb_sent')} "
                            "MiB in all)" for u in r["uploads"])
        out.append((f"RSS, 2 unauthenticated {d['config']['upload_mb']} MiB chunked bodies",
                    f"growth <= {r['target_mb']} MB", f"+{r['growth_mb']} MB ({r['rss_before_mb']} -> "
                    f"{r['rss_peak_mb']} MB); {answers}", r["growth_mb"] <= r["target_mb"],
                    f"{r['growth_mb'] / r['target_mb']:.2f}x the target"))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(REPO, "build"))
    ap.add_argument("--slow", type=int, default=200)
    ap.add_argument("--probes", type=int, default=200)
    ap.add_argument("--probe-gap-ms", type=int, default=10)
    ap.add_argument("--trickle-s", type=float, default=2.0)
    ap.add_argument("--framings", default="content_length,chunked")
    ap.add_argument("--uploads", type=int, default=2)
    ap.add_argument("--upload-mb", type=int, default=600)
    ap.add_argument("--http-max-body-mb", type=float, default=64)
    ap.add_argument("--metrics-slow", type=int, default=10)
    ap.add_argument("--scrapes", type=int, default=20)
    ap.add_argument("--phase-budget-s", type=float, default=120)
    ap.add_argument("--compare", default="")
    ap.add_argument("--no-compare", action="store_true")
    ap.add_argument("--out", default="")
    ap.add_argument("--md", default="")
    a = ap.parse_args()
    os.environ.setdefault("EPD_BUILD_DIR", os.path.abspath(a.build))
    tmp = tempfile.mkdtemp(prefix="epd-edge-bench-")
    token_file = os.path.join(tmp, "token")
    with open(token_file, "w") as f:
        f.write(TOKEN + "\n")
    os.chmod(token_file, 0o600)
    args = h.tiny_serve_args() + ["--http-port", "0", "--metrics-port", "0", "--auth-token-file", token_file,
                                  "--http-max-body-mb", str(a.http_max_body_mb)]
    command = "bench/http_edge_bench.py " + " ".join(sys.argv[1:])
    d = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
         "machine": f"{platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}", "command": command.strip(),
         "loadavg_before": open("/proc/loadavg").read().split()[:3], "server_args": ["serve"] + args,
         "config": {k: v for k, v in vars(a).items() if k not in ("out", "md")}}
    proc, _, metrics_port = h.start_server(args, timeout=180)
    port = int(proc.ready["http_port"])
    try:
        body = chat_body(h.png(64, 64, 7))
        warm = Prober(port, body)
        assert warm.one()[1] == 200, h.server_stderr(proc)  # the miss: now cached
        warm.close()
        d["rss_unauth"] = rss_under_uploads(a, proc.pid, port, token=False)
        d["rss_auth"] = rss_under_uploads(a, proc.pid, port, token=True)
        d["hit_solo"] = Prober(port, body).run(a.probes, a.probe_gap_ms, a.phase_budget_s)
        for framing in a.framings.split(","):
            d[f"hit_slow_{framing}"] = hits_under_slow_bodies(a, port, body, framing)
        if a.metrics_slow > 0:
            d["metrics_slow"] = scrapes_under_slow_posts(a, metrics_port)
        d["server_alive"] = proc.poll() is None
    finally:
        d["server_exit"] = h.stop_server(proc)
        shutil.rmtree(tmp)
    if not a.no_compare:
        d["compare"] = run_compare(a)
    d["loadavg_after"] = open("/proc/loadavg").read().split()[:3]
    print(json.dumps(d, indent=1))
    text = render_body(d)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(d, f, indent=1)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()

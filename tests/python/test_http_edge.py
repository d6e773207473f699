"""The OpenAI front's HTTP edge against a hostile client (issue 40), with real
processes only: an `epd-encode serve --http-port` server, raw sockets, and a
media origin of this file's own on 127.0.0.2 that records what its clients
do. Each test is one attack the old edge lost to:

  - a path, Content-Type or media URL that is not valid UTF-8 aborted the
    server (B60) or got an uncounted 500 (B69);
  - a chunked body was read whole past --http-max-body-mb, and before the
    token was checked (B61);
  - slow bodies held the handler threads (B64);
  - a request's URLs were fetched one at a time, and a client that went away
    did not stop them (B65);
  - the endpoint's own 404/405/413 were not counted.

Independent values: statuses and limits written out here; memory read from
the server's /proc/<pid>/status; concurrency counted by the origin."""

import http.server
import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time

import pytest

import server_harness as h

reason = h.missing_reason()
if reason:
    pytest.skip(reason, allow_module_level=True)

TOKEN = "edge-token"
MAX_BODY_MB = 1


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"^VmRSS:\s+(\d+) kB", f.read(), re.M).group(1))


class Origin:
    """An HTTP origin on 127.0.0.2: /slow/<n> answers a PNG after 1.5 s (and
    counts how many such requests run at once); /big/<n> sends 6 MiB; /drip sends 1 KiB every 50 ms
    for a minute and records when a write fails (its client went away)."""

    def __init__(self, png):
        origin = self
        self.lock = threading.Lock()
        self.running = 0
        self.peak = 0
        self.drip_ended_at = None
        self.drip_started = threading.Event()
        self.first_slow_done_at = None

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path.startswith("/slow/"):
                    with origin.lock:
                        origin.running += 1
                        origin.peak = max(origin.peak, origin.running)
                    time.sleep(1.5)
                    with origin.lock:
                        origin.running -= 1
                        if origin.first_slow_done_at is None:
                            origin.first_slow_done_at = time.monotonic()
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(png)))
                    self.end_headers()
                    self.wfile.write(png)
                    return
                if self.path.startswith("/big/"):
                    blob = b"\0" * (6 << 20)
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(blob)))
                    self.end_headers()
                    try:
                        self.wfile.write(blob)
                    except OSError:
                        pass
                    return
                if self.path == "/drip":
                    origin.drip_started.set()
                    self.send_response(200)
                    self.send_header("Content-Length", str(60 * 20 * 1024))
                    self.end_headers()
                    try:
                        for _ in range(60 * 20):
                            self.wfile.write(b"x" * 1024)
                            self.wfile.flush()
                            time.sleep(0.05)
                    except OSError:
                        origin.drip_ended_at = time.monotonic()
                    return
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.2", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path):
        return f"http://127.0.0.2:{self.port}{path}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


class Server:
    def __init__(self, extra=()):
        self.tmp = tempfile.mkdtemp(prefix="epd-edge-")
        token_file = os.path.join(self.tmp, "token")
        with open(token_file, "w") as f:
            f.write(TOKEN + "\n")
        args = h.tiny_serve_args() + [
            "--http-port", "0", "--metrics-port", "0", "--auth-token-file", token_file,
            "--http-max-body-mb", str(MAX_BODY_MB), "--allowed-media-networks", "127.0.0.2/32",
            "--allowed-local-media-path", self.tmp, *extra]
        self.proc, self.grpc_port, self.metrics_port = h.start_server(args, timeout=120)
        self.http_port = int(self.proc.ready["http_port"])

    def close(self):
        assert h.stop_server(self.proc) == 0, h.server_stderr(self.proc)
        shutil.rmtree(self.tmp)

    def raw(self, data, read=True, timeout=30):
        """Sends `data` on a fresh connection; the status and body of the answer."""
        with socket.create_connection(("127.0.0.1", self.http_port), timeout=timeout) as s:
            s.sendall(data)
            if not read:
                return None
            got = b""
            while True:
                try:
                    chunk = s.recv(65536)
                except ConnectionResetError:
                    break
                if not chunk:
                    break
                got += chunk
                head, _, body = got.partition(b"\r\n\r\n")
                m = re.search(rb"Content-Length: (\d+)", head)
                if m and len(body) >= int(m.group(1)):
                    break
        head, _, body = got.partition(b"\r\n\r\n")
        return int(head.split(b" ")[1]), body

    def chat(self, body, token=TOKEN, content_type=b"application/json"):
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        auth = b"Authorization: Bearer " + token.encode() + b"\r\n" if token else b""
        return self.raw(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Type: " +
                        content_type + b"\r\n" + auth + b"Content-Length: " + str(len(raw)).encode() + b"\r\n\r\n" +
                        raw)

    def healthy(self):
        return self.proc.poll() is None and self.raw(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")[0] == 200

    def counter(self, name):
        with socket.create_connection(("127.0.0.1", self.metrics_port), timeout=30) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nHost: t\r\nConnection: close\r\nAuthorization: Bearer " +
                      TOKEN.encode() + b"\r\n\r\n")
            text = b""
            while chunk := s.recv(65536):
                text += chunk
        m = re.search(rf"^{re.escape(name)} ([0-9.e+]+)$", text.decode(), re.M)
        return float(m.group(1)) if m else 0.0


def image(url, **extra):
    return {"messages": [{"role": "user", "content": [dict({"type": "image_url", "image_url": {"url": url}},
                                                           **extra)]}]}


@pytest.fixture(scope="module")
def server():
    s = Server(["--max-inflight-request-mb", "16", "--max-request-mb", "8", "--http-threads", "2", "--http-min-body-rate-kb", "4", "--http-body-timeout-s", "20",
                "--media-fetch-timeout-s", "30"])
    yield s
    s.close()


@pytest.fixture(scope="module")
def origin():
    o = Origin(h.png(24, 24, 3))
    yield o
    o.close()


def test_paths_that_are_not_utf8_get_a_json_404_and_the_server_lives(server):
    for request in (b"GET /%ff HTTP/1.1\r\nHost: t\r\n\r\n", b"GET /\xff\xfe HTTP/1.1\r\nHost: t\r\n\r\n",
                    b"POST /%ff HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n",
                    b"GET /v1/models%c3 HTTP/1.1\r\nHost: t\r\n\r\n"):
        status, body = server.raw(request)
        assert status == 404, request
        page = json.loads(body.decode("utf-8"))  # strict: the page is valid UTF-8
        assert page["error"]["code"] == "not_found", page
        assert server.healthy(), request


def test_a_content_type_or_url_cut_mid_character_is_a_counted_4xx(server):
    before = server.counter('epd_http_responses_total{status="500"}')
    status, body = server.chat(image("data:image/png;base64,AAAA"), content_type=b"application/js\xc3")
    assert status == 415
    assert "js\\xC3" in json.loads(body.decode("utf-8"))["error"]["message"]
    status, body = server.chat(image("file://" + server.tmp + "/cut%c3.png"))
    assert status == 400, body
    json.loads(body.decode("utf-8"))
    assert server.counter('epd_http_responses_total{status="500"}') == before
    assert server.healthy()


def test_an_unauthenticated_body_is_refused_from_its_head(server):
    pid = server.proc.pid
    before = rss_kb(pid)
    for framing in (b"Transfer-Encoding: chunked\r\n", b"Content-Length: 629145600\r\n"):
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as s:
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n" +
                      framing + b"\r\n")
            answer = s.recv(65536)  # before any byte of the body is sent
            assert answer.startswith(b"HTTP/1.1 401"), answer
            sent = 0
            try:
                while sent < (64 << 20):  # the server no longer reads: this stops on a full window or a reset
                    s.settimeout(2)
                    sent += s.send(b"0" * (1 << 20))
            except OSError:
                pass
            assert sent < (64 << 20)
    assert rss_kb(pid) - before < 32 * 1024
    assert server.healthy()


def test_a_chunked_body_is_bounded_as_it_arrives(server):
    pid = server.proc.pid
    before = rss_kb(pid)
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + TOKEN.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"100000\r\n" + b"x" * 0x100000 + b"\r\n"  # 1 MiB a chunk
        answer = b""
        try:
            for _ in range(64):
                s.sendall(chunk)
        except OSError:
            pass
        s.settimeout(10)
        try:
            answer = s.recv(65536)
        except OSError:
            pass
    assert answer.startswith(b"HTTP/1.1 413"), answer
    assert b"over 1048576 bytes" in answer
    assert rss_kb(pid) - before < 32 * 1024
    assert server.counter('epd_http_responses_total{status="413"}') >= 1
    assert server.healthy()


def test_slow_bodies_hold_no_handler_thread(server):
    """30 connections trickle their bodies (the server has 2 handler threads);
    a whole request is answered meanwhile, and the trickles get 408 for their
    rate."""
    slow = []
    for _ in range(30):
        s = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + TOKEN.encode() + b"\r\nContent-Length: 100000\r\n\r\n{")
        slow.append(s)
    status, body = server.chat(image("data:image/png;base64," + __import__("base64").b64encode(
        h.png(16, 16, 9)).decode()))
    assert status == 200, body
    timeouts = 0
    for s in slow:
        s.settimeout(20)
        try:
            if s.recv(65536).startswith(b"HTTP/1.1 408"):
                timeouts += 1
        except OSError:
            pass
        s.close()
    assert timeouts == 30
    assert server.counter('epd_http_responses_total{status="408"}') >= 30


def test_a_requests_urls_are_fetched_in_parallel(server, origin):
    content = [{"type": "image_url", "image_url": {"url": origin.url(f"/slow/{i}")}} for i in range(4)]
    status, body = server.chat({"messages": [{"role": "user", "content": content}]})
    assert status == 200, body
    assert origin.peak == 4


def test_a_client_that_goes_away_stops_its_fetch(server, origin):
    body = json.dumps(image(origin.url("/drip"))).encode()
    s = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
              b"Authorization: Bearer " + TOKEN.encode() + b"\r\nContent-Length: " + str(len(body)).encode() +
              b"\r\n\r\n" + body)
    time.sleep(1.0)
    s.close()
    closed_at = time.monotonic()
    deadline = closed_at + 8
    while origin.drip_ended_at is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert origin.drip_ended_at is not None, "the fetch went on after its client left"
    assert server.healthy()


def test_the_endpoints_own_statuses_are_counted(server):
    before = {s: server.counter(f'epd_http_responses_total{{status="{s}"}}') for s in (404, 405, 401)}
    server.raw(b"GET /nope HTTP/1.1\r\nHost: t\r\n\r\n")
    server.raw(b"GET /v1/chat/completions HTTP/1.1\r\nHost: t\r\n\r\n")
    server.chat(image("data:,x"), token="wrong")
    for s in (404, 405, 401):
        assert server.counter(f'epd_http_responses_total{{status="{s}"}}') == before[s] + 1, s
    # The metrics port counts its own answers too.
    with socket.create_connection(("127.0.0.1", server.metrics_port), timeout=30) as s:
        s.sendall(b"GET /nope HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        assert s.recv(65536).startswith(b"HTTP/1.1 404")
    assert server.counter('epd_metrics_http_responses_total{status="404"}') == 1


def test_fetched_bytes_are_charged_to_the_request_budget(server, origin):
    """Four 6 MiB media against a 16 MiB in-flight budget: the request is
    refused 429 once its fetched bytes pass the budget, not after all of them
    are held."""
    pid = server.proc.pid
    before = rss_kb(pid)
    content = [{"type": "image_url", "image_url": {"url": origin.url(f"/big/{i}")}} for i in range(4)]
    status, body = server.chat({"messages": [{"role": "user", "content": content}]})
    assert status == 429, body
    page = json.loads(body)
    assert page["error"]["code"] == "over_capacity", page
    assert "in-flight request budget" in page["error"]["message"], page
    assert rss_kb(pid) - before < 48 * 1024
    assert server.healthy()


def test_slow_fetches_hold_no_thread_that_serves_other_clients(server, origin):
    """Six requests of four slow URLs each (24 fetches, more than the 16 fetch
    threads): another client's data: request is answered before the first
    slow fetch ends, so it waited for no fetch thread."""
    done = []

    def slow_request():
        content = [{"type": "image_url", "image_url": {"url": origin.url(f"/slow/{i}")}} for i in range(4)]
        status, _ = server.chat({"messages": [{"role": "user", "content": content}]})
        done.append((time.monotonic(), status))

    origin.first_slow_done_at = None
    threads = [threading.Thread(target=slow_request) for _ in range(6)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    status, body = server.chat(image("data:image/png;base64," + __import__("base64").b64encode(
        h.png(20, 20, 11)).decode()))
    answered = time.monotonic()
    assert status == 200, body
    for t in threads:
        t.join(60)
    assert len(done) == 6 and all(s == 200 for _, s in done), done
    assert answered < origin.first_slow_done_at
    assert origin.peak <= 16


def test_a_stop_answers_the_requests_whose_fetches_are_in_flight(origin):
    """SIGTERM while a request's media fetch runs: the request is answered
    503 (draining). Before, Stop waited 5 s for the fetch and then closed
    the connection with no answer at all."""
    s = Server(["--media-fetch-timeout-s", "60"])
    origin.drip_started.clear()
    body = json.dumps(image(origin.url("/drip"))).encode()
    conn = socket.create_connection(("127.0.0.1", s.http_port), timeout=30)
    conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                 b"Authorization: Bearer " + TOKEN.encode() + b"\r\nContent-Length: " + str(len(body)).encode() +
                 b"\r\n\r\n" + body)
    assert origin.drip_started.wait(30), "the fetch did not start"
    got = []

    def read():
        data = b""
        try:
            while chunk := conn.recv(65536):
                data += chunk
        except OSError:
            pass
        got.append(data)

    reader = threading.Thread(target=read)
    reader.start()
    s.close()  # SIGTERM; asserts exit status 0
    reader.join(60)
    conn.close()
    assert got and got[0].startswith(b"HTTP/1.1 503"), got

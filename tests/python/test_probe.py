"""The header probe end to end (docs/SERVER.md, "Probe") with a real
`epd-encode serve` process (tokens, a tenant secret, the HTTP front), stopped
by PID: the Python client's probe() against its own encode() over the Pillow
parity corpus (tests/python/test_pillow_parity.py's make_corpus: every format
and PIL mode, EXIF orientations), and POST /v1/probe against the chat route:
refused without a token with the chat route's answer, a tenant's key salted
exactly as its encode's key while the route key stays the clients' key_for,
and a refused URL answered with the chat route's status and message.

Independent values: what the server's own Encode returns for the same bytes
(a full decode and the tower) and what the client derives itself (key_for);
never the probe's own code."""

import base64
import http.client
import json
import os
import stat
import tempfile

import pytest

import server_harness as h

reason = h.missing_reason()
if reason:
    pytest.skip(reason, allow_module_level=True)

from epd import client as ec  # noqa: E402 (after the skip)

TOKENS = {"alice": "probe-tok-alice", "bob": "probe-tok-bob"}


@pytest.fixture(scope="module")
def server():
    d = tempfile.mkdtemp(prefix="epd-probe-")
    tokens, secret = os.path.join(d, "tokens"), os.path.join(d, "secret")
    with open(tokens, "w") as f:
        f.write(f"{TOKENS['alice']} alice\n{TOKENS['bob']} bob\n")
    with open(secret, "wb") as f:
        f.write(os.urandom(32))
    for p in (tokens, secret):
        os.chmod(p, stat.S_IRUSR | stat.S_IWUSR)
    flags = ["--tokens-file", tokens, "--tenant-secret-file", secret, "--http-port", "0"]
    proc, port, _ = h.start_server(h.tiny_serve_args() + flags)
    try:
        yield port, int(proc.ready["http_port"])
    finally:
        assert h.stop_server(proc) == 0, h.server_stderr(proc)


def client(port, tenant):
    return ec.EncodeClient(f"127.0.0.1:{port}", timeout=120, auth_token=TOKENS[tenant])


def post(port, path, body, token):
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.request("POST", path, body=json.dumps(body).encode(), headers=headers)
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, json.loads(data) if data else None


def image_body(url):
    return {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]}


def data_url(blob):
    return "data:image/png;base64," + base64.b64encode(blob).decode()


def test_every_corpus_file_probes_to_the_grid_and_key_of_its_encode(server):
    from test_pillow_parity import make_corpus

    port, _ = server
    corpus = make_corpus()
    names = sorted(corpus)
    with client(port, "alice") as c:
        probed = c.probe([corpus[n] for n in names], check=False)
        encoded = c.encode([corpus[n] for n in names], check=False)
        compared = 0
        for name, p, e in zip(names, probed, encoded):
            if not e.ok:
                continue
            assert p.ok, f"{name}: {p.message}"
            assert p.grid_thw == e.grid_thw, name
            assert p.tokens == e.tokens, name
            assert p.key == e.key, name
            assert p.route_key == c.key_for(corpus[name]), name
            compared += 1
        assert compared >= 20, f"only {compared} corpus files encoded"


def test_http_probe_is_refused_without_a_token_as_chat_is(server):
    _, http_port = server
    body = image_body(data_url(h.png(56, 56, 1)))
    probe = post(http_port, "/v1/probe", body, None)
    chat = post(http_port, "/v1/chat/completions", body, None)
    assert probe[0] == 401
    assert probe == chat


def test_http_probe_salts_the_key_per_tenant_exactly_as_an_encode(server):
    port, http_port = server
    blob = h.png(112, 56, 7)
    body = image_body(data_url(blob))
    got = {}
    for tenant in ("alice", "bob"):
        status, reply = post(http_port, "/v1/probe", body, TOKENS[tenant])
        assert status == 200, reply
        [item] = reply["data"]
        with client(port, tenant) as c:
            [e] = c.encode([blob])
            assert item["key"] == e.key.hex()
            assert item["route_key"] == c.key_for(blob).hex()
            assert item["grid_thw"] == list(e.grid_thw) == [1, 4, 8]
            assert item["tokens"] == e.tokens == 8
        got[tenant] = item
    assert got["alice"]["key"] != got["bob"]["key"]
    assert got["alice"]["route_key"] == got["bob"]["route_key"]


@pytest.mark.parametrize("url", ["file:///etc/passwd", "http://169.254.169.254/latest/meta-data", "ftp://x/y.png",
                                 "data:image/png;base64,@@@"])
def test_http_probe_refuses_a_bad_url_with_the_chat_routes_answer(server, url):
    _, http_port = server
    body = image_body(url)
    probe = post(http_port, "/v1/probe", body, TOKENS["alice"])
    chat = post(http_port, "/v1/chat/completions", body, TOKENS["alice"])
    assert probe[0] >= 400
    assert probe == chat


def test_python_client_probe_names_a_bad_item_and_raises_with_check(server):
    port, _ = server
    good = h.png(56, 84, 3)
    with client(port, "alice") as c:
        with pytest.raises(ec.EncodeError) as err:
            c.probe([good, b"not an image"])
        assert err.value.code.name == "INVALID_ARGUMENT"
        assert err.value.message.startswith("item 1: ")
        ok, bad = err.value.results
        assert ok.ok and ok.grid_thw == (1, 6, 4) and ok.tokens == 6
        assert not bad.ok
        [by_key] = c.probe([ec.Item(caller_key="gateway-1")])
        assert by_key.grid_thw is None and by_key.tokens == 0
        assert by_key.route_key == c.key_for(ec.Item(caller_key="gateway-1"))

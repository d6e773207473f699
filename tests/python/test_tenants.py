"""Tenant isolation end to end (docs/SECURITY.md) with real processes:
`epd-encode serve` with --tokens-file and --tenant-secret-file, over gRPC
(the Python client), over the HTTP front (POST /v1/chat/completions), and
as a two-server cluster sharing one real redis-server (redis_harness.py),
every process stopped by PID.

Independent values: the images each tenant sent (so which tower runs must
happen), the tenants the tokens file names; never the server's own keys."""

import base64
import concurrent.futures
import http.client
import json
import os
import re
import signal
import stat
import tempfile
import urllib.request

import pytest

import l3_harness
import server_harness as h
from l3_harness import redis, servers, wait_for  # noqa: F401 (fixtures)

l3_harness.skip_module_unless_runnable()

from epd import client as ec  # noqa: E402 (after the skip)

TOKENS = {"alice": "tok-alice-1", "bob": "tok-bob-2", "ops": "tok-ops-3"}


@pytest.fixture(scope="module")
def secrets_dir():
    d = tempfile.mkdtemp(prefix="epd-tenants-")
    tokens = os.path.join(d, "tokens")
    with open(tokens, "w") as f:
        f.write("# token tenant [operator]\n")
        f.write(f"{TOKENS['alice']} alice\n{TOKENS['bob']} bob\n{TOKENS['ops']} ops operator\n")
    secret = os.path.join(d, "secret")
    with open(secret, "wb") as f:
        f.write(os.urandom(32))
    for p in (tokens, secret):
        os.chmod(p, stat.S_IRUSR | stat.S_IWUSR)
    yield d, tokens, secret


def tenant_flags(secrets_dir, readers="alice,bob"):
    _, tokens, secret = secrets_dir
    return ["--tokens-file", tokens, "--tenant-secret-file", secret, "--public-readers", readers]


def client(port, tenant):
    return ec.EncodeClient(f"127.0.0.1:{port}", timeout=60, auth_token=TOKENS[tenant])


def test_salted_without_a_secret_refuses_to_start_naming_the_flag(secrets_dir):
    _, tokens, _ = secrets_dir
    with pytest.raises(RuntimeError, match="--tenant-secret-file"):
        h.start_server(h.tiny_serve_args() + ["--tokens-file", tokens])


def test_a_tokens_file_others_may_read_is_refused(secrets_dir):
    d, tokens, secret = secrets_dir
    loose = os.path.join(d, "loose")
    with open(tokens) as f, open(loose, "w") as g:
        g.write(f.read())
    os.chmod(loose, 0o644)
    with pytest.raises(RuntimeError, match="chmod 600"):
        h.start_server(h.tiny_serve_args() + ["--tokens-file", loose, "--tenant-secret-file", secret])


def test_grpc_tenants_do_not_share_entries_and_an_unknown_token_is_refused(secrets_dir):
    proc, port, _ = h.start_server(h.tiny_serve_args() + tenant_flags(secrets_dir))
    try:
        a, b, op = client(port, "alice"), client(port, "bob"), client(port, "ops")
        x = h.png(56, 56, 301)
        assert a.encode([x])[0].source == "miss"
        assert b.encode([x])[0].source == "miss"
        assert a.encode([x])[0].source == "l1"
        assert op.stats()["tower_items"] == 2
        # Public: shared by alice and bob.
        cat = h.png(56, 56, 302)
        assert a.encode([ec.Item(image=cat, public=True)])[0].source == "miss"
        assert b.encode([ec.Item(image=cat, public=True)])[0].source == "l1"
        assert b.stats()["tenant_stats"]["hits_l1"] == 1
        assert b.stats()["scope"] == "tenant" and b.stats()["tower_items"] == 0
        stranger = ec.EncodeClient(f"127.0.0.1:{port}", timeout=60, auth_token="not-a-token")
        with pytest.raises(ec.EncodeError) as e:
            stranger.encode([x])
        assert "UNAUTHENTICATED" in str(e.value.code)
        # A tenant token claiming another tenant by header is still itself.
        claim = ec.EncodeClient(f"127.0.0.1:{port}", timeout=60, auth_token=TOKENS["bob"], tenant="alice")
        assert claim.encode([h.png(56, 56, 303)])[0].source == "miss"
        assert a.stats()["tenant_stats"]["requests"] == 3
        assert b.stats()["tenant_stats"]["requests"] == 3
        for c in (a, b, op, stranger, claim):
            c.close()
    finally:
        assert h.stop_server(proc) == 0, h.server_stderr(proc)


def chat(port, token, blob, public=None):
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(blob).decode()}}
    if public is not None:
        part["epd_public"] = public  # our extension key (docs/VLLM.md)
    body = {"messages": [{"role": "user", "content": [part]}]}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data


def test_http_front_tenants_are_isolated_and_credentialed(secrets_dir):
    proc, port, _ = h.start_server(h.tiny_serve_args() + tenant_flags(secrets_dir) + ["--http-port", "0"])
    try:
        http_port = int(proc.ready["http_port"])
        x = h.png(56, 56, 311)
        assert chat(http_port, TOKENS["alice"], x)[0] == 200
        assert chat(http_port, TOKENS["bob"], x)[0] == 200
        assert chat(http_port, TOKENS["alice"], x)[0] == 200
        a, b, op = client(port, "alice"), client(port, "bob"), client(port, "ops")
        sa, sb = a.stats()["tenant_stats"], b.stats()["tenant_stats"]
        assert (sa["misses"], sa["hits_l1"]) == (1, 1)
        assert (sb["misses"], sb["hits_l1"]) == (1, 0), "bob's request for alice's image ran the tower"
        assert op.stats()["tower_items"] == 2
        # The same image over gRPC is alice's own hit: one namespace per tenant, whichever front.
        assert a.encode([x])[0].source == "l1"
        assert chat(http_port, "not-a-token", x)[0] == 401
        for c in (a, b, op):
            c.close()
    finally:
        assert h.stop_server(proc) == 0, h.server_stderr(proc)


def test_http_public_mark_is_shared_by_public_readers_only(secrets_dir):
    # Readers alice and bob; ops is not one, so its mark is ignored.
    proc, port, _ = h.start_server(h.tiny_serve_args() + tenant_flags(secrets_dir) + ["--http-port", "0"])
    try:
        http_port = int(proc.ready["http_port"])
        op = client(port, "ops")
        cat, own = h.png(56, 56, 331), h.png(56, 56, 332)
        assert chat(http_port, TOKENS["alice"], cat, public=True)[0] == 200
        assert chat(http_port, TOKENS["bob"], cat, public=True)[0] == 200
        assert op.stats()["tower_items"] == 1, "bob's public item did not hit alice's"
        assert client(port, "bob").stats()["tenant_stats"]["hits_l1"] == 1
        # gRPC's mark and HTTP's name one namespace.
        assert client(port, "alice").encode([ec.Item(image=cat, public=True)])[0].source == "l1"
        # Not marked (absent or false): each tenant's own.
        assert chat(http_port, TOKENS["alice"], own)[0] == 200
        assert chat(http_port, TOKENS["bob"], own, public=False)[0] == 200
        assert op.stats()["tower_items"] == 3
        # A tenant that is not a public reader: its mark is ignored, its item its own.
        assert chat(http_port, TOKENS["ops"], cat, public=True)[0] == 200
        assert op.stats()["tower_items"] == 4
        assert op.stats()["tenant_stats"]["misses"] == 1
        # A mark that is not a boolean is refused, naming the field; nothing else is lost.
        status, data = chat(http_port, TOKENS["alice"], cat, public="yes")
        assert status == 400 and json.loads(data)["error"]["param"] == "messages[0].content[0].epd_public"
        assert chat(http_port, TOKENS["bob"], cat, public=True)[0] == 200
        assert op.stats()["tower_items"] == 4
        op.close()
    finally:
        assert h.stop_server(proc) == 0, h.server_stderr(proc)


def test_two_server_cluster_l3_values_stay_in_their_tenants_namespace(redis, servers, secrets_dir):
    flags = tenant_flags(secrets_dir)
    s1, s2 = servers("s1", flags), servers("s2", flags)
    a1, a2, b2 = client(s1.port, "alice"), client(s2.port, "alice"), client(s2.port, "bob")
    op1, op2 = client(s1.port, "ops"), client(s2.port, "ops")
    x = h.png(56, 56, 321)
    assert a1.encode([x])[0].source == "miss"
    wait_for(lambda: op1.stats()["l3_counters"].get("writes", 0) >= 1, "s1's L3 write")
    # Bob on the other server: his L3 lookup misses alice's value.
    assert b2.encode([x])[0].source == "miss"
    # Alice on the other server: her own value, from L3 (the control).
    assert a2.encode([x])[0].source == "l3"
    assert op2.stats()["tower_items"] == 1
    # Public items cross servers and tenants through L3.
    cat = h.png(56, 56, 322)
    assert a1.encode([ec.Item(image=cat, public=True)])[0].source == "miss"
    wait_for(lambda: op1.stats()["l3_counters"].get("writes", 0) >= 2, "s1's second L3 write")
    assert b2.encode([ec.Item(image=cat, public=True)])[0].source == "l3"
    for c in (a1, a2, b2, op1, op2):
        c.close()


def test_two_server_cluster_a_tenant_never_waits_on_another_tenants_lease(redis, servers, secrets_dir):
    """Alice's single-flight lease, taken on s1 for her encode of x, is held
    for as long as s1 is stopped (SIGSTOP once the lease is in Redis, before
    the value is). Bob's request for x on s2 looks up and leases in his own
    namespace: it never waits, runs s2's tower, and is answered while s1 is
    still stopped. The control: alice's own request for x on s2 waits on her
    lease and, once s1 goes on, is answered from L3."""
    flags = tenant_flags(secrets_dir)
    s1, s2 = servers("s1", flags), servers("s2", flags)
    a1, a2, b2 = client(s1.port, "alice"), client(s2.port, "alice"), client(s2.port, "bob")
    op2 = client(s2.port, "ops")
    pool = concurrent.futures.ThreadPoolExecutor(2)
    stopped = False
    try:
        for attempt in range(8):
            x = h.png(448, 448, 340 + attempt)  # ~50 ms of tower on s1: a window to stop it in
            first = pool.submit(a1.encode, [x])
            lease = None
            while lease is None and not first.done():
                lease = next(iter(redis.keys("epd:lease:*")), None)
            if lease is None:
                first.result()
                continue
            os.kill(s1.proc.pid, signal.SIGSTOP)
            stopped = True
            value = b"epd:v:" + lease[len(b"epd:lease:"):]
            if redis.command("EXISTS", lease) == 1 and redis.command("EXISTS", value) == 0:
                break
            os.kill(s1.proc.pid, signal.SIGCONT)  # too late: s1 had written; another image
            stopped = False
            first.result()
        assert stopped, "never caught s1 holding its lease"
        r = b2.encode([x])[0]
        assert r.ok and r.source == "miss"
        c = op2.stats()["l3_counters"]
        assert c.get("lease_waits", 0) == 0, c
        assert op2.stats()["tower_items"] == 1
        assert redis.command("EXISTS", lease) == 1, "alice's lease lapsed during the test"
        # The control: alice on s2 waits on her own lease.
        second = pool.submit(a2.encode, [x])
        wait_for(lambda: op2.stats()["l3_counters"].get("lease_waits", 0) == 1, "alice's wait on her lease")
        assert not second.done()
        os.kill(s1.proc.pid, signal.SIGCONT)
        stopped = False
        assert first.result()[0].source == "miss"
        assert second.result()[0].source == "l3"
        assert op2.stats()["tower_items"] == 1
    finally:
        if stopped:
            os.kill(s1.proc.pid, signal.SIGCONT)
        pool.shutdown()
        for c in (a1, a2, b2, op2):
            c.close()


# --max-tenant-labels (docs/SECURITY.md, "Stats, metrics and `source`"): every
# per-tenant family of /metrics, the request counters (epd_tenant_*_total
# {tenant}) and the quota's cache families (epd_tenant_cache_*{tenant, tier}),
# names at most that many tenants and sums the rest into tenant="other".
# Independent values: the tokens file names four tenants, and tenant number i
# (in name order, the order the tokens file's tenants are ranked in) sends i
# distinct images of one size, each once, so it has i items, i misses and i
# equal-sized L1 entries; one entry's size is the operator's global
# l1_used_bytes over the number of images sent.
# Name order: amy, bob, cat, dan (the operator, who may scrape /metrics).
LABEL_TENANTS = {"amy": "tok-amy-1", "bob": "tok-bob-2", "cat": "tok-cat-3", "dan": "tok-dan-4"}
SENT = {"amy": 1, "bob": 2, "cat": 3, "dan": 4}


def _series(text, family):
    """{labels text: value} of one family's series on the page."""
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^" + re.escape(family) + r"\{([^}]*)\} (\S+)$", text, re.M)}


@pytest.fixture(scope="module")
def labels_server():
    d = tempfile.mkdtemp(prefix="epd-labels-")
    tokens, secret = os.path.join(d, "tokens"), os.path.join(d, "secret")
    with open(tokens, "w") as f:
        for t, tok in LABEL_TENANTS.items():
            f.write(f"{tok} {t}{' operator' if t == 'dan' else ''}\n")
    with open(secret, "wb") as f:
        f.write(os.urandom(32))
    for p in (tokens, secret):
        os.chmod(p, stat.S_IRUSR | stat.S_IWUSR)
    proc, port, metrics_port = h.start_server(
        h.tiny_serve_args() + ["--tokens-file", tokens, "--tenant-secret-file", secret, "--max-tenant-labels", "2",
                               "--tenant-quota-default", "1/0", "--cache-mb", "64", "--metrics-port", "0"])
    try:
        seed = 700
        for t, n in SENT.items():
            with ec.EncodeClient(f"127.0.0.1:{port}", timeout=60, auth_token=LABEL_TENANTS[t]) as c:
                for _ in range(n):
                    seed += 1
                    (r,) = c.encode([h.png(56, 56, seed)])
                    assert r.ok and r.source == "miss", r
        with ec.EncodeClient(f"127.0.0.1:{port}", timeout=60, auth_token=LABEL_TENANTS["dan"]) as op:
            l1_used = int(op.stats()["l1_used_bytes"])
        req = urllib.request.Request(f"http://127.0.0.1:{metrics_port}/metrics",
                                     headers={"Authorization": f"Bearer {LABEL_TENANTS['dan']}"})
        page = urllib.request.urlopen(req, timeout=10).read().decode()
        yield page, l1_used
    finally:
        assert h.stop_server(proc) == 0, h.server_stderr(proc)


@pytest.mark.parametrize("family,per_image", [("epd_tenant_items_total", 1), ("epd_tenant_misses_total", 1),
                                              ("epd_tenant_requests_total", 1), ("epd_tenant_hits_l1_total", 0)])
def test_request_families_name_two_tenants_and_fold_the_rest_into_other(labels_server, family, per_image):
    page, _ = labels_server
    got = _series(page, family)
    assert got == {'tenant="amy"': SENT["amy"] * per_image, 'tenant="bob"': SENT["bob"] * per_image,
                   'tenant="other"': (SENT["cat"] + SENT["dan"]) * per_image}, page


def test_cache_families_name_two_tenants_and_fold_the_rest_into_other(labels_server):
    page, l1_used = labels_server
    entry = l1_used / sum(SENT.values())
    got = _series(page, "epd_tenant_cache_bytes")
    l1 = {k: v for k, v in got.items() if k.endswith('tier="l1"')}
    assert l1 == {'tenant="shared",tier="l1"': 0, 'tenant="tenant:amy",tier="l1"': SENT["amy"] * entry,
                  'tenant="tenant:bob",tier="l1"': SENT["bob"] * entry,
                  'tenant="other",tier="l1"': (SENT["cat"] + SENT["dan"]) * entry}, page
    assert sum(l1.values()) == l1_used  # the counts add up to the global gauge
    for family in ("epd_tenant_cache_refusals_total", "epd_tenant_cache_evictions_total"):
        assert {k.split(",")[0] for k in _series(page, family)} == {
            'tenant="shared"', 'tenant="tenant:amy"', 'tenant="tenant:bob"', 'tenant="other"'}, family
    assert not re.search(r'tenant="[^"]*(cat|dan)"', page)

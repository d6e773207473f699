"""--max-tenant-labels on a real `epd-encode serve` (docs/SECURITY.md,
"Stats, metrics and `source`"): every per-tenant family of /metrics, the
request counters (epd_tenant_*_total{tenant}) and the quota's cache families
(epd_tenant_cache_*{tenant, tier}), names at most that many tenants and sums
the rest into tenant="other".

Independent values: the tokens file names four tenants, and tenant number i
(in name order, the order the tokens file's tenants are ranked in) sends i
distinct images of one size, each once, so it has i items, i misses and i
equal-sized L1 entries; the size of one entry is the operator's global
l1_used_bytes over the number of images sent."""

import os
import re
import stat
import tempfile
import urllib.request

import pytest

import server_harness as h

reason = h.missing_reason()
if reason:
    pytest.skip(reason, allow_module_level=True)
try:
    from epd import client as ec
except ImportError as e:
    pytest.skip(f"epd.client is not importable ({e}); build target epd_python_stubs", allow_module_level=True)

# Name order: amy, bob, cat, dan (the operator, who may scrape /metrics).
TENANTS = {"amy": "tok-amy-1", "bob": "tok-bob-2", "cat": "tok-cat-3", "dan": "tok-dan-4"}
SENT = {"amy": 1, "bob": 2, "cat": 3, "dan": 4}


def _series(text, family):
    """{labels text: value} of one family's series on the page."""
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"^" + re.escape(family) + r"\{([^}]*)\} (\S+)$", text, re.M)}


@pytest.fixture(scope="module")
def server():
    d = tempfile.mkdtemp(prefix="epd-labels-")
    tokens, secret = os.path.join(d, "tokens"), os.path.join(d, "secret")
    with open(tokens, "w") as f:
        for t, tok in TENANTS.items():
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
            with ec.EncodeClient(f"127.0.0.1:{port}", timeout=60, auth_token=TENANTS[t]) as c:
                for _ in range(n):
                    seed += 1
                    (r,) = c.encode([h.png(56, 56, seed)])
                    assert r.ok and r.source == "miss", r
        with ec.EncodeClient(f"127.0.0.1:{port}", timeout=60, auth_token=TENANTS["dan"]) as op:
            l1_used = int(op.stats()["l1_used_bytes"])
        req = urllib.request.Request(f"http://127.0.0.1:{metrics_port}/metrics",
                                     headers={"Authorization": f"Bearer {TENANTS['dan']}"})
        page = urllib.request.urlopen(req, timeout=10).read().decode()
        yield page, l1_used
    finally:
        assert h.stop_server(proc) == 0, h.server_stderr(proc)


@pytest.mark.parametrize("family,per_image", [("epd_tenant_items_total", 1), ("epd_tenant_misses_total", 1),
                                              ("epd_tenant_requests_total", 1), ("epd_tenant_hits_l1_total", 0)])
def test_request_families_name_two_tenants_and_fold_the_rest_into_other(server, family, per_image):
    page, _ = server
    got = _series(page, family)
    assert got == {'tenant="amy"': SENT["amy"] * per_image, 'tenant="bob"': SENT["bob"] * per_image,
                   'tenant="other"': (SENT["cat"] + SENT["dan"]) * per_image}, page


def test_cache_families_name_two_tenants_and_fold_the_rest_into_other(server):
    page, l1_used = server
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

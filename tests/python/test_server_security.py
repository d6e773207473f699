"""TLS, mutual TLS and the bearer token on a real `epd-encode serve` process,
with a throwaway CA and certificates made here by the `openssl` CLI.

Shown: plaintext is refused when TLS is on; a client certificate from
another CA is refused, and so is none; a wrong or missing token gets
UNAUTHENTICATED and is counted in Stats.rpc_errors; the good path works from
the Python client and from `epd-encode client`."""

import os
import shutil
import subprocess

import pytest

import child_process
import server_harness as h

reason = h.missing_reason()
if reason:
    pytest.skip(reason, allow_module_level=True)
if shutil.which("openssl") is None:
    pytest.skip("the openssl CLI is not installed (scripts/install-deps.sh installs it)", allow_module_level=True)
try:
    import grpc
    from epd import client as ec
except ImportError as e:
    pytest.skip(f"epd.client is not importable ({e}); build target epd_python_stubs", allow_module_level=True)

TOKEN = "s3cret-token-for-tests"


def _openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _make_ca(d, name):
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
             "-keyout", f"{name}.key", "-out", f"{name}.crt", cwd=d)


def _make_cert(d, ca, name, san=None):
    """A certificate for `name` signed by `ca` (server certs get a SAN)."""
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", cwd=d)
    ext = []
    if san:
        with open(os.path.join(d, f"{name}.ext"), "w") as f:
            f.write(f"subjectAltName={san}\n")
        ext = ["-extfile", f"{name}.ext"]
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-days", "2", "-out", f"{name}.crt", *ext, cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("pki"))
    _make_ca(d, "ca")
    _make_ca(d, "rogue-ca")
    _make_cert(d, "ca", "server", san="IP:127.0.0.1,DNS:localhost")
    _make_cert(d, "ca", "client")
    _make_cert(d, "rogue-ca", "rogue-client")
    with open(os.path.join(d, "token"), "w") as f:
        f.write(TOKEN + "\n")  # the trailing newline is dropped by the server
    return d


def _read(d, name):
    with open(os.path.join(d, name), "rb") as f:
        return f.read()


@pytest.fixture(scope="module")
def server(pki):
    p = lambda n: os.path.join(pki, n)  # noqa: E731
    proc, port, _ = h.start_server(h.tiny_serve_args() + [
        "--tls-cert", p("server.crt"), "--tls-key", p("server.key"), "--tls-client-ca", p("ca.crt"),
        "--auth-token-file", p("token")])
    yield f"127.0.0.1:{port}"
    assert h.stop_server(proc) == 0


def _client(server, pki, cert="client", token=TOKEN, **kw):
    args = dict(root_certificates=_read(pki, "ca.crt"), auth_token=token, timeout=10)
    if cert:
        args.update(certificate_chain=_read(pki, f"{cert}.crt"), private_key=_read(pki, f"{cert}.key"))
    args.update(kw)
    return ec.EncodeClient(server, **args)


def test_good_certificate_and_token_encode(server, pki):
    with _client(server, pki) as c:
        [r] = c.encode([h.png(56, 56, 1)])
        assert r.ok and r.tokens == 4


def test_plaintext_is_refused(server):
    with ec.EncodeClient(server, timeout=10, auth_token=TOKEN) as c:
        with pytest.raises(ec.EncodeError) as e:
            c.health()
        assert e.value.code == grpc.StatusCode.UNAVAILABLE


def test_client_certificate_from_another_ca_is_refused(server, pki):
    with _client(server, pki, cert="rogue-client") as c:
        with pytest.raises(ec.EncodeError) as e:
            c.health()
        assert e.value.code == grpc.StatusCode.UNAVAILABLE


def test_missing_client_certificate_is_refused(server, pki):
    with _client(server, pki, cert=None) as c:
        with pytest.raises(ec.EncodeError) as e:
            c.health()
        assert e.value.code == grpc.StatusCode.UNAVAILABLE


def test_server_certificate_from_another_ca_is_refused_by_the_client(server, pki):
    with _client(server, pki, root_certificates=_read(pki, "rogue-ca.crt")) as c:
        with pytest.raises(ec.EncodeError) as e:
            c.health()
        assert e.value.code == grpc.StatusCode.UNAVAILABLE


def test_wrong_or_missing_token_is_unauthenticated_and_counted(server, pki):
    with _client(server, pki) as good:
        before = good.stats()["rpc_errors"].get("UNAUTHENTICATED", 0)
    for token in ("wrong-token", TOKEN + "x", None):
        with _client(server, pki, token=token) as c:
            with pytest.raises(ec.EncodeError) as e:
                c.encode([h.png(56, 56, 2)])
            assert e.value.code == grpc.StatusCode.UNAUTHENTICATED, e.value.message
            assert TOKEN not in e.value.message
            with pytest.raises(ec.EncodeError) as e:
                c.stats()
            assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    with _client(server, pki) as good:
        # Per token: the route_by_key Health call, then stats().
        assert good.stats()["rpc_errors"].get("UNAUTHENTICATED", 0) == before + 6


def test_cli_client_with_certificate_and_token(server, pki, tmp_path):
    img = tmp_path / "a.png"
    img.write_bytes(h.png(56, 84, 3))
    p = lambda n: os.path.join(pki, n)  # noqa: E731
    base = [h.encode_binary(), "client", "--server", server, "--tls-ca", p("ca.crt")]
    good = subprocess.run(base + ["--tls-cert", p("client.crt"), "--tls-key", p("client.key"),
                                  "--auth-token-file", p("token"), str(img)],
                          capture_output=True, text=True, timeout=60)
    assert good.returncode == 0, good.stderr
    assert "tokens=6" in good.stdout
    rogue = subprocess.run(base + ["--tls-cert", p("rogue-client.crt"), "--tls-key", p("rogue-client.key"),
                                   "--auth-token-file", p("token"), str(img)],
                           capture_output=True, text=True, timeout=60)
    assert rogue.returncode == 1
    assert "UNAVAILABLE" in rogue.stderr


def test_tls_without_client_ca_and_token_alone(pki):
    """Server-only TLS (no client certificate asked) and, separately, a token
    on a plaintext server (the case of a private network behind a TLS proxy)."""
    p = lambda n: os.path.join(pki, n)  # noqa: E731
    proc, port, _ = h.start_server(h.tiny_serve_args() + ["--tls-cert", p("server.crt"), "--tls-key", p("server.key")])
    try:
        with ec.EncodeClient(f"127.0.0.1:{port}", timeout=10, root_certificates=_read(pki, "ca.crt")) as c:
            assert c.health().serving
        with ec.EncodeClient(f"localhost:{port}", timeout=10, root_certificates=_read(pki, "ca.crt")) as c:
            assert c.health().serving  # the DNS name in the SAN
    finally:
        assert h.stop_server(proc) == 0
    proc, port, _ = h.start_server(h.tiny_serve_args() + ["--auth-token-file", p("token")])
    try:
        with ec.EncodeClient(f"127.0.0.1:{port}", timeout=10, auth_token=TOKEN) as c:
            assert c.health().serving
        with ec.EncodeClient(f"127.0.0.1:{port}", timeout=10) as c:
            with pytest.raises(ec.EncodeError) as e:
                c.health()
            assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    finally:
        assert h.stop_server(proc) == 0


def test_server_refuses_a_key_that_is_not_the_certificates(pki):
    p = lambda n: os.path.join(pki, n)  # noqa: E731
    r = child_process.run([h.encode_binary(), "serve", "--host", "127.0.0.1", "--port", "0", *h.tiny_serve_args(),
                           "--tls-cert", p("server.crt"), "--tls-key", p("client.key")],
                          capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert "does not belong to the certificate" in r.stderr


def test_client_certificates_name_their_tenants_and_keep_them_apart(pki):
    """Mutual TLS without tokens: each certificate's CN is its tenant, and
    with isolation salted one image from two certificates is two entries."""
    p = lambda n: os.path.join(pki, n)  # noqa: E731
    for name in ("alice-svc", "bob-svc"):
        if not os.path.exists(p(f"{name}.crt")):
            _make_cert(pki, "ca", name)
    secret = p("tenant-secret")
    with open(secret, "wb") as f:
        f.write(os.urandom(32))
    os.chmod(secret, 0o600)
    proc, port, _ = h.start_server(h.tiny_serve_args() + [
        "--tls-cert", p("server.crt"), "--tls-key", p("server.key"), "--tls-client-ca", p("ca.crt"),
        "--tenant-isolation", "salted", "--tenant-secret-file", secret])
    try:
        target = f"127.0.0.1:{port}"
        with _client(target, pki, cert="alice-svc", token=None) as a, \
                _client(target, pki, cert="bob-svc", token=None) as b:
            x = h.png(56, 56, 7)
            assert a.encode([x])[0].source == "miss"
            assert b.encode([x])[0].source == "miss"
            assert a.encode([x])[0].source == "l1"
            sb = b.stats()
            assert (sb["scope"], sb["tenant"]) == ("tenant", "bob-svc")
            assert sb["tenant_stats"]["misses"] == 1 and sb["tower_items"] == 0
    finally:
        assert h.stop_server(proc) == 0, h.server_stderr(proc)

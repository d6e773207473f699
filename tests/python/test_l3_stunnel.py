"""L3 over TLS, the setup docs/L3.md describes: hiredis 0.14 has no TLS, so
each encode server talks plain RESP to a local stunnel client, which speaks
TLS to the Redis host. Redis here terminates TLS itself (Debian's
redis-server is built with TLS: --tls-port, plain port off); a Redis built
without it would sit behind a stunnel in server mode the same way.

Everything is real and started here: certificates made with the openssl
command (a test CA, a server certificate for 127.0.0.1, a client
certificate), a redis-server with only a TLS port that requires client
certificates, one stunnel client per encode server, two `epd-encode serve`
processes with a shared key file. Every process is stopped by PID.

Checked: values round-trip through the tunnels (the second server serves
the first's bytes as an L3 hit); and the controls that show the TLS is real:
Redis's TLS port does not answer plain RESP, a tunnel that trusts another
CA refuses the server (no man in the middle passes as Redis), and a tunnel
without a client certificate is refused by Redis."""

import os
import shutil
import signal
import subprocess

import pytest

import child_process
import l3_harness
import redis_harness as rh
import server_harness as h
from l3_harness import Server, wait_for

l3_harness.skip_module_unless_runnable()
STUNNEL = shutil.which("stunnel4") or shutil.which("stunnel")
OPENSSL = shutil.which("openssl")
if STUNNEL is None or OPENSSL is None:
    pytest.skip("needs stunnel4 and openssl (scripts/install-deps.sh installs them)", allow_module_level=True)


def openssl(*args, cwd):
    subprocess.run([OPENSSL, *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def make_pki(d):
    """A CA, and a server and a client certificate it signs (EC P-256, 1 day);
    plus a second, unrelated CA."""
    ec_key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", *ec_key, "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "1",
                "-subj", f"/CN=epd test {ca}", cwd=d)
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        openssl("req", "-new", *ec_key, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=epd {name}",
                cwd=d)
        with open(os.path.join(d, f"{name}.ext"), "w") as f:
            f.write(ext + "\n")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.pem", "-days", "1", "-extfile", f"{name}.ext", cwd=d)


def spawn(args, log):
    return child_process.popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)


@pytest.fixture
def procs():
    """Processes started by the test, stopped by PID at the end."""
    started = []
    yield started
    for p in reversed(started):
        h.stop_pid(p, signal.SIGTERM, grace=10)


def start_redis_tls(d, procs):
    """A redis-server with only a TLS port, which requires client certificates."""
    [port] = h.free_ports(1)
    procs.append(spawn([rh.redis_binary(), "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
                        "--tls-cert-file", f"{d}/server.pem", "--tls-key-file", f"{d}/server.key",
                        "--tls-ca-cert-file", f"{d}/ca.pem", "--tls-auth-clients", "yes", "--dir", d,
                        "--logfile", f"{d}/redis.log", "--save", "", "--appendonly", "no",
                        "--protected-mode", "no"], subprocess.DEVNULL))
    h.wait_port(port, 20, procs[-1])
    return port


def start_tunnel(d, procs, name, redis_port, ca="ca.pem", client_cert=True):
    """A stunnel client: plain RESP on a local port, TLS to Redis, Redis's
    certificate checked against `ca` and its IP."""
    [local] = h.free_ports(1)
    conf = os.path.join(d, f"{name}.conf")
    lines = ["foreground = yes", "pid =", f"output = {d}/{name}.log", "[redis]", "client = yes",
             f"accept = 127.0.0.1:{local}", f"connect = 127.0.0.1:{redis_port}", f"CAfile = {d}/{ca}",
             "verifyChain = yes", "checkIP = 127.0.0.1"]
    if client_cert:
        lines += [f"cert = {d}/client.pem", f"key = {d}/client.key"]
    with open(conf, "w") as f:
        f.write("\n".join(lines) + "\n")
    procs.append(spawn([STUNNEL, conf], subprocess.DEVNULL))
    h.wait_port(local, 20, procs[-1])
    return local


def ping(port):
    try:
        return rh.command_at(port, "PING", timeout=5)
    except (OSError, rh.RedisError) as e:
        return f"refused: {e}"


def logged(path, text):
    """Waits (bounded) until `text` appears in the log at `path`."""
    wait_for(lambda: os.path.exists(path) and text in open(path, errors="replace").read(), f"'{text}' in {path}")
    return True


def test_values_round_trip_through_stunnel_and_tls_is_required(tmp_path, procs):
    d = str(tmp_path)
    make_pki(d)
    redis_port = start_redis_tls(d, procs)
    t1 = start_tunnel(d, procs, "tunnel-a", redis_port)
    t2 = start_tunnel(d, procs, "tunnel-b", redis_port)
    assert ping(t1) == "PONG"
    # The controls: no plain RESP on the TLS port; no TLS to an impostor
    # (a tunnel trusting another CA); no client without a certificate.
    assert ping(redis_port) != "PONG"
    assert logged(f"{d}/redis.log", "wrong version number")
    assert ping(start_tunnel(d, procs, "wrong-ca", redis_port, ca="other-ca.pem")) != "PONG"
    assert logged(f"{d}/wrong-ca.log", "certificate verify failed")
    assert ping(start_tunnel(d, procs, "no-cert", redis_port, client_cert=False)) != "PONG"
    assert logged(f"{d}/redis.log", "peer did not return a certificate")

    keys = tmp_path / "l3.key"
    keys.write_text(f"current 1 {bytes(range(32)).hex()}\n")
    os.chmod(keys, 0o600)
    servers = []
    try:
        for name, tunnel in (("a", t1), ("b", t2)):
            servers.append(Server(f"redis://127.0.0.1:{tunnel}", name, ["--l3-key-file", str(keys)]))
        a, b = servers
        images = [h.png(56, 56, 80), h.png(84, 56, 81)]
        first = a.encode(images)
        assert [r.source for r in first] == ["miss", "miss"]
        a.await_writes(2)
        second = b.encode(images)
        assert [r.source for r in second] == ["l3", "l3"]
        assert [r.main for r in second] == [r.main for r in first]
        assert [r.deepstack for r in second] == [r.deepstack for r in first]
        assert a.client.health().l3 == "ok" and b.client.health().l3 == "ok"
        assert rh.command_at(t1, "DBSIZE") == 2
    finally:
        for s in servers:
            s.stop()

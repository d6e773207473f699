"""Authenticated L3 end to end: real `epd-encode serve` processes sharing one
real redis-server (tests/python/redis_harness.py), with --l3-key-file.

What is checked, each against values computed here and not by the servers:
- two servers with the same key file share values; a stored value is format
  2 and its GMAC tag is the one Python's `cryptography` computes under the
  subkey derived here with `hmac` (docs/L3.md);
- a forgery, another image's rows under an image's key in format 1 with a
  correct XXH3 checksum (computed here with `xxhash`), is refused, counted in
  auth_failures, re-encoded with the image's own rows and rewritten, after
  which the other server serves the rewrite;
- a forged lease holds an unkeyed server back until its wait ends (the
  control) and a keyed server not at all;
- a key rotation: a server with {current new, previous old} serves a value
  written under the old key; one with the new key alone refuses it."""

import hashlib
import hmac
import os
import struct
import urllib.request

import l3_harness
import server_harness as h
from l3_harness import redis, servers, wait_for  # noqa: F401 (fixtures)

l3_harness.skip_module_unless_runnable("xxhash", "cryptography")
import xxhash  # noqa: E402 (after the skip)
from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: E402

SECRET_OLD = bytes(range(32))
SECRET_NEW = bytes(range(100, 132))


def key_file(tmp_path, name, current, previous=None):
    """A key file (mode 600) naming (id, secret) pairs."""
    path = tmp_path / name
    lines = [f"current {current[0]} {current[1].hex()}"]
    if previous:
        lines.append(f"previous {previous[0]} {previous[1].hex()}")
    path.write_text("\n".join(lines) + "\n")
    os.chmod(path, 0o600)
    return str(path)


def gmac_tag(value: bytes, secret: bytes) -> bytes:
    """The format 2 tag of `value`: GMAC over bytes [0, 120) and what follows
    the tag (the encode cost field, when the header has one, and the rows),
    under HMAC-SHA256(secret, "epd-l3 value gmac v1"), IV at [108, 120)."""
    subkey = hmac.new(secret, b"epd-l3 value gmac v1", hashlib.sha256).digest()
    return AESGCM(subkey).encrypt(value[108:120], b"", value[:120] + value[136:])


def forged_format1(content_key: bytes, key_version: bytes, item) -> bytes:
    """`item`'s rows under `content_key` in format 1 with a correct checksum:
    what anyone who can write to the Redis can build."""
    rows = item.main + item.deepstack
    head = (b"EPL3" + struct.pack("<HH", 1, 112) + key_version + bytes([0, 0, 0, 0])
            + struct.pack("<qqq", item.tokens, item.hidden, item.deepstack_layers)
            + struct.pack("<qqq", *item.grid_thw) + struct.pack("<Q", len(rows)) + content_key)
    assert len(head) == 104 and item.dtype == "float32"
    return head + struct.pack("<Q", xxhash.xxh3_64_intdigest(head + rows)) + rows


def test_keyed_servers_share_values_and_refuse_and_rewrite_a_forgery(redis, servers, tmp_path):
    keys = key_file(tmp_path, "l3.key", (1, SECRET_OLD))
    a, b = servers("a", ["--l3-key-file", keys]), servers("b", ["--l3-key-file", keys])
    img, other, target = h.png(56, 56, 70), h.png(56, 56, 71), h.png(56, 56, 72)
    first = a.client.encode([img, other])
    assert [r.source for r in first] == ["miss", "miss"]
    a.await_writes(2)
    stored = redis.command("GET", f"epd:v:{first[0].key.hex()}")
    # Format 2 with the encode cost field (header 144: the cost at [136, 144)).
    assert stored[:4] == b"EPL3" and struct.unpack("<HH", stored[4:8]) == (2, 144)
    assert struct.unpack("<I", stored[104:108]) == (1,)  # key id
    assert stored[120:136] == gmac_tag(stored, SECRET_OLD)
    (cost,) = struct.unpack("<d", stored[136:144])
    assert 0 < cost < 60, cost  # seconds, as measured by a
    assert stored[144:] == first[0].main + first[0].deepstack
    second = b.client.encode([img])[0]
    assert second.source == "l3" and second.main == first[0].main and second.deepstack == first[0].deepstack

    target_key = a.client.key_for(target)
    redis.command("SET", f"epd:v:{target_key.hex()}", forged_format1(target_key, stored[8:12], first[1]))
    r = b.client.encode([target])[0]
    assert r.ok and r.source == "miss"
    assert r.main != first[1].main  # not the forged rows
    c = b.counters()
    assert c["auth_failures"] == 1 and c.get("corrupt", 0) == 0
    b.await_writes(1)
    rewritten = redis.command("GET", f"epd:v:{target_key.hex()}")
    assert rewritten[144:] == r.main + r.deepstack and rewritten[120:136] == gmac_tag(rewritten, SECRET_OLD)
    again = a.client.encode([target])[0]
    assert again.source == "l3" and again.main == r.main
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{b.metrics_port}/metrics", timeout=10).read().decode()
    assert "epd_l3_auth_failures_total 1" in metrics


def test_forged_lease_holds_back_an_unkeyed_server_and_not_a_keyed_one(redis, servers, tmp_path):
    img = h.png(56, 56, 73)
    # The control: without a key the forged lease is obeyed until the wait ends.
    plain = servers("plain", wait_ms=300)
    lease = f"epd:lease:{plain.client.key_for(img).hex()}"
    assert redis.command("SET", lease, "forged-holder", "PX", "600000") == "OK"
    assert plain.client.encode([img])[0].source == "miss"
    c = plain.counters()
    assert c["lease_waits"] == 1 and c["lease_wait_timeouts"] == 1
    redis.command("FLUSHALL")

    assert redis.command("SET", lease, "forged-holder", "PX", "600000") == "OK"
    keyed = servers("keyed", ["--l3-key-file", key_file(tmp_path, "l3.key", (1, SECRET_OLD))])  # would wait 20 s
    r = keyed.client.encode([img])[0]
    assert r.ok and r.source == "miss"
    c = keyed.counters()
    assert c["lease_auth_failures"] == 1 and c.get("lease_waits", 0) == 0 and c["leases_acquired"] == 1
    wait_for(lambda: keyed.counters().get("leases_released", 0) == 1, "the keyed server's own lease release")
    assert redis.command("GET", lease) is None


def test_rotation_accepts_the_previous_key_and_refuses_it_after(redis, servers, tmp_path):
    old = servers("old", ["--l3-key-file", key_file(tmp_path, "old.key", (1, SECRET_OLD))])
    rotating = servers("rotating",
                       ["--l3-key-file", key_file(tmp_path, "rotating.key", (2, SECRET_NEW), (1, SECRET_OLD))])
    new = servers("new", ["--l3-key-file", key_file(tmp_path, "new.key", (2, SECRET_NEW))])
    before, during = h.png(56, 56, 74), h.png(56, 56, 75)
    assert old.client.encode([before])[0].source == "miss"
    old.await_writes(1)
    assert rotating.client.encode([before])[0].source == "l3"  # old key, accepted during the rotation
    assert rotating.client.encode([during])[0].source == "miss"
    rotating.await_writes(1)
    stored = redis.command("GET", f"epd:v:{rotating.client.key_for(during).hex()}")
    assert struct.unpack("<I", stored[104:108]) == (2,)  # written under the new key
    assert new.client.encode([during])[0].source == "l3"
    assert new.client.encode([before])[0].source == "miss"  # old key, refused after the rotation
    assert new.counters()["auth_failures"] == 1

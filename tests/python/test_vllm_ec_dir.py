"""What epd-encode's HTTP front leaves in --ec-dir for vLLM's
ECExampleConnector, against real `epd-encode serve` processes on loopback
(docs/VLLM.md, "Tenants, ids and files"; docs/SECURITY.md): any uuid vLLM
accepts is published, an unsafe one under the mapped name a consumer
computes with hashlib; under --tenant-isolation salted each tenant's files
go to <ec-dir>/tenant=<name>/, so one tenant's file is never what another's
prefill loads (B62); the same uuid for other bytes rewrites the file (B63);
files are 0640.

Independent values: the mapped names from Python's hashlib, and each file
compared with the file the same tenant publishes for the same bytes under a
fresh uuid."""
import hashlib
import os
import re
import shutil
import stat
import tempfile

import pytest

import server_harness as h
from test_vllm_encoder import Encoder, data_url, image_part, read_safetensors

reason = h.missing_reason()
if reason:
    pytest.skip(reason, allow_module_level=True)

TOKENS = {"alice": "tok-ec-alice", "bob": "tok-ec-bob"}


def ec_name(uuid):
    """The consumer's side of the mapping (epd/openai/ec_publisher.h)."""
    if re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}", uuid):
        return uuid
    return "sha256=" + hashlib.sha256(uuid.encode()).hexdigest()


def request(blob, uuid):
    return {"messages": [{"role": "user", "content": [dict(image_part(data_url(blob)), uuid=uuid)]}]}


@pytest.fixture(scope="module")
def plain():
    e = Encoder(h.tiny_serve_args(), token=None)
    yield e
    e.close()


@pytest.fixture(scope="module")
def tenants():
    d = tempfile.mkdtemp(prefix="epd-ec-tenants-")
    tokens, secret = os.path.join(d, "tokens"), os.path.join(d, "secret")
    with open(tokens, "w") as f:
        f.write("".join(f"{tok} {name}\n" for name, tok in TOKENS.items()))
    with open(secret, "wb") as f:
        f.write(os.urandom(32))
    for p in (tokens, secret):
        os.chmod(p, stat.S_IRUSR | stat.S_IWUSR)
    e = Encoder(h.tiny_serve_args() + ["--tokens-file", tokens, "--tenant-secret-file", secret, "--tenant-isolation",
                                       "salted"], token=None)
    yield e
    e.close()
    shutil.rmtree(d)


def test_any_uuid_vllm_accepts_is_published_and_unsafe_ones_under_their_mapped_name(plain):
    for i, uuid in enumerate(["user:42", "a:b@c", "../../escape", "\u753b\u50cf", ".hidden", "plain-id_1.2"]):
        status, reply = plain.post(request(h.png(16, 16, 60 + i), uuid))
        assert status == 200, (uuid, reply)
        assert list(reply["ec_transfer_params"]) == [uuid]
        path = os.path.join(plain.ec_dir, ec_name(uuid), "encoder_cache.safetensors")
        assert os.path.isfile(path), uuid
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
        assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o750
    assert ec_name("user:42") == "sha256=ea3fd43be1e57d62e163dae19fc740bd6d660eec497235fd0ef859e2bd9fa328"
    assert not os.path.exists(os.path.join(plain.tmp, "escape"))


def test_the_same_uuid_for_other_bytes_rewrites_the_file(plain):
    old, new = h.png(16, 16, 70), h.png(48, 32, 71)
    assert plain.post(request(old, "url-hash"))[0] == 200
    status, reply = plain.post(request(new, "url-hash"))
    assert status == 200, reply
    assert plain.post(request(new, "fresh-ref"))[0] == 200
    got = read_safetensors(plain.file("url-hash"))
    assert got == read_safetensors(plain.file("fresh-ref"))
    grid = reply["ec_transfer_params"]["url-hash"]["metadata"]["image_grid_thw"]
    assert got["ec_cache"][1][0] == grid[0] * grid[1] * grid[2] // 4


def tenant_file(e, tenant, uuid):
    return os.path.join(e.ec_dir, "tenant=" + tenant, ec_name(uuid), "encoder_cache.safetensors")


def test_a_tenant_never_gets_another_tenants_file_for_the_same_uuid(tenants):
    a_img, b_img = h.png(32, 32, 81), h.png(40, 24, 82)
    # B publishes its own image under the uuid A's proxy sends for A's URL.
    assert tenants.post(request(b_img, "shared-uuid"), token=TOKENS["bob"])[0] == 200
    status, reply = tenants.post(request(a_img, "shared-uuid"), token=TOKENS["alice"])
    assert status == 200, reply
    assert tenants.post(request(a_img, "a-ref"), token=TOKENS["alice"])[0] == 200
    assert tenants.post(request(b_img, "b-ref"), token=TOKENS["bob"])[0] == 200
    a_rows = read_safetensors(tenant_file(tenants, "alice", "shared-uuid"))
    assert a_rows == read_safetensors(tenant_file(tenants, "alice", "a-ref"))
    assert read_safetensors(tenant_file(tenants, "bob", "shared-uuid")) == read_safetensors(
        tenant_file(tenants, "bob", "b-ref"))
    assert a_rows != read_safetensors(tenant_file(tenants, "bob", "b-ref"))
    assert not os.path.exists(os.path.join(tenants.ec_dir, "shared-uuid"))
    assert sorted(os.listdir(tenants.ec_dir)) == ["tenant=alice", "tenant=bob"]

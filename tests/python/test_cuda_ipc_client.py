"""The Python client's side of CUDA IPC delivery (docs/SHM.md, "CUDA IPC"),
without a GPU: a CUDA IPC reply (an EncodedItem with cuda_ipc set, built
here) becomes a result carrying the handle fields and a lease whose release
is a Release call of kind LEASE_KIND_CUDA_IPC; malformed references fail the
item and hand the lease back; the request asks for DELIVERY_CUDA_IPC with the
shared-memory fallback when shm is on. The stub is replaced by a recorder, so
no server runs (the server end to end is src/server/ipc_server_test.cc)."""

import pytest

try:
    import grpc
    from epd import client as ec
    from epd.v1 import encoder_pb2
except ImportError as e:  # stubs not generated
    pytest.skip(f"epd.client is not importable ({e})", allow_module_level=True)


class RecordingStub:
    """Stands in for EncoderStub: records Release and Encode requests."""

    def __init__(self, replies=()):
        self.releases = []
        self.encodes = []
        self.replies = list(replies)

    def Release(self, req, timeout=None, metadata=None):
        self.releases.append(req)
        return encoder_pb2.ReleaseResponse(released=len(req.leases))

    def Encode(self, req, timeout=None, metadata=None):
        self.encodes.append(req)
        return iter(self.replies)

    def Session(self, requests, metadata=None):
        # Like a server that names no lease session: the client then calls
        # without one (shm=True opens a session before its first call).
        return iter(())


class SessionStub(RecordingStub):
    """A RecordingStub whose server names a lease session, kept open until the
    client half-closes it, and which records each Encode call's metadata."""

    SESSION_ID = "ab" * 16

    def __init__(self, replies=()):
        super().__init__(replies)
        self.metadata = []

    def Encode(self, req, timeout=None, metadata=None):
        self.metadata.append(list(metadata or ()))
        return super().Encode(req, timeout, metadata)

    def Session(self, requests, metadata=None):
        def events():
            yield encoder_pb2.SessionEvent(session_id=self.SESSION_ID, lease_ms=5000)
            for _ in requests:  # the client sends nothing; this ends at its half-close
                pass
        return events()


def ipc_item(tokens=4, hidden=8, layers=2, memory=b"\x11" * 64, event=b"\x00" * 64, length=None, offset=None):
    main = tokens * hidden * 4
    m = encoder_pb2.EncodedItem(index=0, key=b"\x01" * 32, tokens=tokens, hidden=hidden, deepstack_layers=layers,
                                dtype=encoder_pb2.DTYPE_FLOAT32, source=encoder_pb2.SOURCE_L1)
    m.grid_thw.extend([1, 4, 4])
    ref = m.cuda_ipc
    ref.memory_handle = memory
    ref.event_handle = event
    ref.length = main * (1 + layers) if length is None else length
    ref.deepstack_offset = main if offset is None else offset
    ref.device = "cuda:1 (test)"
    ref.device_index = 1
    ref.pid = 4242
    ref.generation = 77
    ref.lease_ms = 5000
    return m


def client_with(stub, **kw):
    c = ec.EncodeClient("127.0.0.1:1", route_by_key=False, **kw)  # the channel is lazy: nothing connects
    c._stub = stub
    return c


def test_a_cuda_ipc_reply_carries_the_handle_fields_and_releases_with_its_kind():
    stub = RecordingStub([ipc_item()])
    c = client_with(stub, cuda_ipc=True, shm=True)
    [r] = c.encode([b"not decoded by anyone"])
    [req] = stub.encodes
    assert req.delivery == encoder_pb2.DELIVERY_CUDA_IPC
    assert req.ipc_fallback_shm is True
    assert r.ok and r.main == b"" and r.deepstack == b""
    ref = r.cuda_ipc
    assert ref.memory_handle == b"\x11" * 64 and ref.event_handle == b"\x00" * 64
    assert (ref.length, ref.deepstack_offset) == (4 * 8 * 4 * 3, 4 * 8 * 4)
    assert (ref.device, ref.device_index, ref.pid, ref.generation, ref.lease_ms) == ("cuda:1 (test)", 1, 4242, 77, 5000)
    assert r.grid_thw == (1, 4, 4)
    with pytest.raises(ValueError, match="CUDA IPC"):
        r.main_array()
    with r:
        pass  # the context manager releases
    [rel] = stub.releases
    assert [(l.offset, l.generation, l.kind) for l in rel.leases] == [(0, 77, encoder_pb2.LEASE_KIND_CUDA_IPC)]
    c.release([r])  # released already: nothing sent
    assert len(stub.releases) == 1
    c.close()


def test_without_shm_the_request_asks_for_no_shared_memory_fallback():
    stub = RecordingStub([ipc_item()])
    c = client_with(stub)
    c.encode([b"x"], cuda_ipc=True)
    assert stub.encodes[0].delivery == encoder_pb2.DELIVERY_CUDA_IPC
    assert stub.encodes[0].ipc_fallback_shm is False
    c.close()


@pytest.mark.parametrize("kw, words", [
    (dict(memory=b"\x11" * 10), "10-byte memory handle"),
    (dict(event=b""), "0-byte event handle"),
    (dict(length=100), "100 bytes"),
    (dict(offset=0), "deepstack at byte 0"),
])
def test_a_malformed_reference_fails_the_item_and_hands_the_lease_back(kw, words):
    stub = RecordingStub([ipc_item(**kw)])
    c = client_with(stub, cuda_ipc=True)
    [r] = c.encode([b"x"], check=False)
    assert not r.ok
    assert r.code == grpc.StatusCode.INTERNAL
    assert words in r.message
    [rel] = stub.releases
    assert [(l.generation, l.kind) for l in rel.leases] == [(77, encoder_pb2.LEASE_KIND_CUDA_IPC)]
    c.close()


def test_shared_memory_leases_still_release_as_kind_shm():
    stub = RecordingStub()
    c = client_with(stub)
    lease = ec.ShmLease(c, 128, 5, 1000)
    r = ec.ItemResult(index=0, ok=True, lease=lease)
    c.release([r])
    [rel] = stub.releases
    assert [(l.offset, l.generation, l.kind) for l in rel.leases] == [(128, 5, encoder_pb2.LEASE_KIND_SHM)]
    c.close()


def test_cuda_ipc_calls_name_the_clients_lease_session():
    # Without shm=True too: the server ties CUDA IPC leases to the session.
    stub = SessionStub([ipc_item()])
    c = client_with(stub, cuda_ipc=True)
    [r] = c.encode([b"x"])
    assert r.cuda_ipc is not None
    assert (ec.SESSION_HEADER, SessionStub.SESSION_ID) in stub.metadata[0]
    c.close()

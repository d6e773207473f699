"""Encode's retry policy in the Python client (proto/epd/v1/encoder_service_config.json).

A real server refuses a call that way only in a race: gRPC cancels a call
that reaches a server after its shutdown began, before any code of ours sees
it (CANCELLED), and the server answers UNAVAILABLE in the moment between
leaving service and that shutdown. No test can hit those moments on purpose
(tests/deploy/test_cluster_restart.py meets them end to end, by chance), so
the server here is a gRPC servicer of the test's own that answers each
attempt as the test scripts it: the client, its channel and gRPC's retry code
are the real ones. Each attempt after the first carries gRPC's
grpc-previous-rpc-attempts header, which the servicer records.

Independent values: the retryable codes, the attempt limit (4) and what the
servicer sends are written out here, not read from the client."""

import concurrent.futures
import struct

import pytest

try:
    import grpc
    from epd import client as ec
    from epd.v1 import encoder_pb2, encoder_pb2_grpc
except ImportError as e:  # stubs not generated: EPD_WITH_PYTHON/EPD_WITH_GRPC off
    pytest.skip(f"epd.client is not importable ({e}); build target epd_python_stubs", allow_module_level=True)

MAX_ATTEMPTS = 4  # encoder_service_config.json: maxAttempts


def _item(index):
    """One valid item: 1 token (grid 1x2x2, merged 2x2), hidden 2, float32."""
    return encoder_pb2.EncodedItem(index=index, key=bytes([index]) * 32, tokens=1, hidden=2,
                                   dtype=encoder_pb2.DTYPE_FLOAT32, main=struct.pack("<2f", index, 0.5),
                                   grid_thw=[1, 2, 2], server_id="scripted")


class Scripted(encoder_pb2_grpc.EncoderServicer):
    """Answers attempt n as script[n] says: None = every item and OK;
    (code, after) = fail with `code` after sending `after` items."""

    def __init__(self, script):
        self.script = script
        self.previous_attempts = []  # the grpc-previous-rpc-attempts header of each attempt ("" = none)

    def Encode(self, request, context):
        md = dict(context.invocation_metadata())
        n = len(self.previous_attempts)
        self.previous_attempts.append(md.get("grpc-previous-rpc-attempts", ""))
        step = self.script[n] if n < len(self.script) else None
        for i in range(len(request.items)):
            if step is not None and i == step[1]:
                context.abort(step[0], f"scripted {step[0].name} on attempt {n + 1}")
            yield _item(i)
        if step is not None:
            context.abort(step[0], f"scripted {step[0].name} on attempt {n + 1}")


@pytest.fixture
def scripted():
    """Starts a servicer on a free loopback port; yields a function that sets
    its script and returns (servicer, target)."""
    server = grpc.server(concurrent.futures.ThreadPoolExecutor(max_workers=4),
                         options=[("grpc.max_receive_message_length", -1)])
    port = server.add_insecure_port("127.0.0.1:0")
    holder = {}

    class Forward(encoder_pb2_grpc.EncoderServicer):
        def Encode(self, request, context):
            yield from holder["s"].Encode(request, context)

    encoder_pb2_grpc.add_EncoderServicer_to_server(Forward(), server)
    server.start()

    def make(script):
        holder["s"] = Scripted(script)
        return holder["s"], f"127.0.0.1:{port}"

    yield make
    server.stop(0)


def _encode(target, n_items=1):
    with ec.EncodeClient(target, timeout=10, route_by_key=False) as c:
        return c.encode([b"image-%d" % i for i in range(n_items)], check=False)


@pytest.mark.parametrize("code", [grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE])
def test_a_call_refused_before_any_item_is_sent_again(scripted, code):
    s, target = scripted([(code, 0)])
    results = _encode(target, n_items=2)
    assert [r.ok for r in results] == [True, True]
    assert [struct.unpack("<2f", r.main)[0] for r in results] == [0.0, 1.0]
    assert s.previous_attempts == ["", "1"]


def test_it_gives_up_after_four_attempts_with_the_last_status(scripted):
    s, target = scripted([(grpc.StatusCode.CANCELLED, 0)] * 10)
    results = _encode(target)
    assert not results[0].ok
    assert results[0].code == grpc.StatusCode.CANCELLED
    assert f"attempt {MAX_ATTEMPTS}" in results[0].message
    assert s.previous_attempts == ["", "1", "2", "3"]


@pytest.mark.parametrize("code", [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
                                  grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL])
def test_other_codes_are_not_retried(scripted, code):
    s, target = scripted([(code, 0)])
    results = _encode(target)
    assert results[0].code == code
    assert s.previous_attempts == [""]


def test_a_call_that_has_sent_an_item_is_not_sent_again(scripted):
    # gRPC commits a call at its first response message: a retry would send
    # the items already delivered twice.
    s, target = scripted([(grpc.StatusCode.CANCELLED, 1)])
    results = _encode(target, n_items=2)
    assert results[0].ok and struct.unpack("<2f", results[0].main)[0] == 0.0
    assert not results[1].ok and results[1].code == grpc.StatusCode.CANCELLED
    assert s.previous_attempts == [""]


def test_a_request_over_the_retry_buffer_is_not_retried(scripted):
    s, target = scripted([(grpc.StatusCode.UNAVAILABLE, 0)])
    with ec.EncodeClient(target, timeout=10, route_by_key=False) as c:
        big = bytes(ec.RETRY_BUFFER_BYTES + 1)
        results = c.encode([big], check=False)
    assert results[0].code == grpc.StatusCode.UNAVAILABLE
    assert s.previous_attempts == [""]

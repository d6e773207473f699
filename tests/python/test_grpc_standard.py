"""gRPC's standard health checking and reflection services on a real
`epd-encode serve` process, spoken with raw method calls (grpc_wire.py), as a
Kubernetes probe or grpcurl would. Also: the process exits within its grace
period after SIGTERM even while a client holds a stream open.

Expected values come from the protocols' definitions (health.proto,
reflection.proto) and from proto/epd/v1/encoder.proto, read here with
protobuf's own descriptor classes."""

import threading
import time

import pytest

import server_harness as h

reason = h.missing_reason()
if reason:
    pytest.skip(reason, allow_module_level=True)
grpc = pytest.importorskip("grpc")
from google.protobuf import descriptor_pb2  # noqa: E402

import grpc_wire as w  # noqa: E402


def _raw(channel, method, kind="unary_unary"):
    # No serializers: requests and responses are bytes.
    return getattr(channel, kind)(method)


@pytest.fixture(scope="module")
def server():
    proc, port, _ = h.start_server(h.tiny_serve_args())
    yield f"127.0.0.1:{port}"
    assert h.stop_server(proc) == 0


def test_health_check_reports_serving_for_the_server_and_the_encoder(server):
    with grpc.insecure_channel(server) as ch:
        check = _raw(ch, w.HEALTH_CHECK)
        assert w.health_status(check(w.health_request(""), timeout=10)) == w.SERVING
        assert w.health_status(check(w.health_request("epd.v1.Encoder"), timeout=10)) == w.SERVING
        with pytest.raises(grpc.RpcError) as e:
            check(w.health_request("no.such.Service"), timeout=10)
        assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_the_services_and_serves_the_encoder_descriptor(server):
    with grpc.insecure_channel(server) as ch:
        info = _raw(ch, w.REFLECTION, "stream_stream")
        [listing] = list(info(iter([w.list_services_request()]), timeout=10))
        services = w.listed_services(listing)
        assert "epd.v1.Encoder" in services
        assert "grpc.health.v1.Health" in services
        [found] = list(info(iter([w.file_containing_symbol_request("epd.v1.Encoder")]), timeout=10))
        files = [descriptor_pb2.FileDescriptorProto.FromString(b) for b in w.file_descriptors(found)]
        encoder = [f for f in files if f.package == "epd.v1"]
        assert encoder, [f.name for f in files]
        [svc] = [s for s in encoder[0].service if s.name == "Encoder"]
        methods = {m.name: m for m in svc.method}
        assert set(methods) == {"Encode", "Health", "Stats", "Release", "Session", "Probe"}
        assert methods["Release"].input_type == ".epd.v1.ReleaseRequest"
        assert methods["Session"].client_streaming and methods["Session"].server_streaming
        assert methods["Encode"].server_streaming and not methods["Encode"].client_streaming
        assert methods["Encode"].input_type == ".epd.v1.EncodeRequest"


def test_sigterm_exits_within_the_grace_while_a_client_holds_a_stream_and_watch_sees_not_serving():
    grace = 1.0
    proc, port, _ = h.start_server(h.tiny_serve_args() + ["--grace-s", str(grace)])
    statuses = []
    first = threading.Event()
    ch = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        watch = _raw(ch, w.HEALTH_WATCH, "unary_stream")(w.health_request(""))

        def read():
            try:
                for msg in watch:
                    statuses.append(w.health_status(msg))
                    first.set()
            except grpc.RpcError:
                pass
            first.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert first.wait(30), "no first Watch message"
        assert statuses[0] == w.SERVING
        start = time.monotonic()
        proc.terminate()
        # The open stream and channel must not hold the process: a bound of
        # grace + 5 s (issue 15 reported exits ~13 s after SIGTERM); a
        # correctness bound, not a speed measurement.
        proc.wait(timeout=60)
        elapsed = time.monotonic() - start
        assert proc.returncode == 0
        assert elapsed < grace + 5, f"exited {elapsed:.1f} s after SIGTERM with --grace-s {grace}"
        reader.join(10)
        assert w.NOT_SERVING in statuses, statuses
    finally:
        ch.close()
        h.stop_server(proc)

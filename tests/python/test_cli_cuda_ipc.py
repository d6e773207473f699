"""`epd-encode client --cuda-ipc` where it cannot work: a build without CUDA
(the CPU build CI runs) has no device to import the server's GPU memory into,
so the flag must fail with a clear error that names why, before any call
reaches the server. The "server" here is a bare listening socket: any gRPC
call would leave a connection in its accept queue, so an empty queue after
the command exits shows that no call was made. (The flag's good path needs a
CUDA GPU on both ends: docs/SHM.md, "CUDA IPC".)"""

import os
import socket
import subprocess
import tempfile

import pytest

import server_harness as h

if h.encode_binary() is None:
    pytest.skip("epd-encode is not built (needs EPD_WITH_GRPC and EPD_WITH_TORCH)", allow_module_level=True)


def cuda_build():
    """True/False from the build's CMakeCache.txt (EPD_WITH_CUDA), None when there is none to read."""
    cache = os.path.join(h.build_dir(), "CMakeCache.txt")
    if not os.path.exists(cache):
        return None
    with open(cache) as f:
        for line in f:
            if line.startswith("EPD_WITH_CUDA:"):
                return line.strip().split("=", 1)[1].upper() in ("ON", "TRUE", "1", "YES")
    return False


@pytest.fixture
def listener():
    """A TCP socket that listens but never answers, and the image the CLI is given."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "img.png")
        with open(path, "wb") as f:
            f.write(h.png(56, 56, 7))
        yield s, f"127.0.0.1:{s.getsockname()[1]}", path
    s.close()


def nothing_connected(s):
    s.setblocking(False)
    try:
        conn, _ = s.accept()
    except BlockingIOError:
        return True
    conn.close()
    return False


def run_client(*args):
    return subprocess.run([h.encode_binary(), "client", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("extra", [[], ["--shm"]], ids=["cuda_ipc", "cuda_ipc_with_shm_fallback"])
def test_cuda_ipc_without_a_cuda_device_fails_before_any_call(listener, extra):
    s, target, image = listener
    r = run_client("--server", target, "--cuda-ipc", *extra, image)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert r.stdout == "", r.stdout  # no item line: nothing came back
    assert "--cuda-ipc" in r.stderr, r.stderr
    if cuda_build() is False:
        # The reason, and what to do instead.
        assert "FAILED_PRECONDITION" in r.stderr, r.stderr
        assert "built without CUDA" in r.stderr and "EPD_WITH_CUDA" in r.stderr, r.stderr
        assert "--shm" in r.stderr, r.stderr
    else:
        # A CUDA build on a machine without a usable device names the CUDA error.
        assert "cannot open CUDA device 0" in r.stderr, r.stderr
    # A call would have connected, and none may: the error comes first.
    assert "UNAVAILABLE" not in r.stderr and "DEADLINE_EXCEEDED" not in r.stderr, r.stderr
    assert nothing_connected(s)


def test_cuda_device_without_cuda_ipc_is_a_usage_error(listener):
    s, target, image = listener
    r = run_client("--server", target, "--cuda-device", "1", image)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert "--cuda-device" in r.stderr and "--cuda-ipc" in r.stderr, r.stderr
    assert nothing_connected(s)

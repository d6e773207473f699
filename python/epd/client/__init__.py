"""A Python client of the epd-encode gRPC server (proto/epd/v1/encoder.proto).

It mirrors the C++ EncodeClient (include/epd/client/client.h): it derives each
image's content key exactly as the server does, groups the images of a request
by key, sends one call per distinct key with the key's hex in the
``x-epd-route`` metadata header (so a hash-affinity proxy such as
deploy/nginx sends each key to the same server), runs the calls concurrently
and reassembles the results by index.

Keys (docs/KEYS_AND_PREPROCESSING.md, version 2) are derived here exactly as
the server derives them, with hashlib, so the client needs only
python3-grpcio and python3-protobuf; the byte layout is in
``epd.client._keys``. The model id and preprocessing come from the server's
Health answer.

Example::

    from epd.client import EncodeClient
    with EncodeClient("127.0.0.1:50051") as c:
        [r] = c.encode([open("cat.jpg", "rb").read()])
        print(r.key.hex(), r.tokens, r.grid_thw, r.source, r.main_array().shape)
        mm = r.to_vllm()  # {"image_embeds": ..., "image_grid_thw": ...} for vLLM

Prefill: each result carries its image's patch grid ``grid_thw`` = (t, h, w)
(EncodedItem.grid_thw), which Qwen-VL prefill needs for its M-RoPE positions.
``EncodeResult.to_vllm()`` and ``to_vllm_batch(results)`` turn results into
the dict vLLM takes as precomputed image embeddings (docs/PREFILL.md).

Input: each image is bytes-like (bytes, bytearray, memoryview) or an Item;
anything else (an int, a str, a PIL image) is a TypeError naming its index,
never converted. A request longer than the server's item limit
(``max_items_per_call``, 256 by default, the server's
``--max-items-per-request`` default) is split into several calls
transparently: results keep the request's order and indices, and identical
images are still encoded once (the server joins them across calls). Set
``max_items_per_call`` to the server's limit when it differs.

Shared memory (docs/SHM.md): with ``EncodeClient(..., shm=True)`` (or
``encode(..., shm=True)``) a server on the same host, run by the same user
with ``--shm-arena-mb``, places each item's rows in its memfd arena instead of
the reply. ``main`` and ``deepstack`` are then read-only memoryviews on this
process's mapping of that arena and ``main_array()`` (float32) is a numpy view
on them, with no copy. The rows are leased: call ``r.release()`` (or
``client.release(results)``, or use the result as a context manager) when done
with them; an unreleased lease expires after the server's ``--shm-lease-ms``,
and after that the span may be overwritten. ``r.lease`` is None for items
that came inline (no arena, the arena full, or not asked for)::

    with EncodeClient("unix:/run/epd.sock", shm=True) as c:
        [r] = c.encode([jpeg])
        with r:
            x = r.main_array()   # np.ndarray view on the shared rows
            prefill(x)           # use before release (or copy)

CUDA IPC (docs/SHM.md, "CUDA IPC"): with ``EncodeClient(..., cuda_ipc=True)``
(or ``encode(..., cuda_ipc=True)``) a server on the same GPU node with a GPU
tier and ``--ipc-export-mb`` answers items whose rows are in its GPU memory
with a CUDA IPC reference instead of bytes: ``r.cuda_ipc`` (a CudaIpcRef)
carries the 64-byte ``cudaIpcMemHandle_t`` and ``cudaIpcEventHandle_t``, the
length, the deepstack offset, the server's device, a generation and the lease
time, and ``main``/``deepstack`` are empty. This package does not import the
memory: Debian's python3-torch is built without CUDA, and mapping a handle
takes the CUDA runtime (``cudaIpcOpenMemHandle``, e.g. through cupy's
``cupy.cuda.runtime.ipcOpenMemHandle``) in the consuming process. The lease
works as for shared memory: ``r.release()``, ``client.release(results)`` or
the result as a context manager end it; otherwise it expires after the
server's lease time, and the server frees the rows. Items that cannot come by
CUDA IPC come by shared memory when ``shm=True`` as well, else inline::

    with EncodeClient("unix:/run/epd.sock", cuda_ipc=True, shm=True) as c:
        [r] = c.encode([jpeg])
        with r:
            if r.cuda_ipc is not None:
                rows = open_with_cuda(r.cuda_ipc.memory_handle, r.cuda_ipc.length)

Lease session (docs/SHM.md, "Crashed clients"): before its first
shared-memory or CUDA IPC call the client opens a Session stream and names it on every
such call (the ``x-epd-session`` header), so if this process dies the server
releases its leases at once instead of at their expiry. ``close()`` (or
leaving the ``with`` block) ends the session, and the server then releases
every lease the client still holds: views from it must not be used after
``close()``. When the server refuses a session (no arena, its
``--shm-max-sessions`` cap, an older server), calls still work, their leases
ending by release or expiry only, and the client tries again a second later.

Targets: ``host:port`` or ``unix:/path`` (a Unix domain socket).

Thread safety: an EncodeClient may be shared by threads (grpc channels are).

The package's modules, one job each (import the names from ``epd.client``
itself; the module names are private): ``_keys`` the content-key format,
``_lease_types`` the lease records an item carries, ``_results`` result
types with their numpy and vLLM adaptors, ``_leases`` shared-memory and CUDA
IPC delivery (arena mappings, the lease session, attaching a reference),
``_proto`` proto conversion, ``_routing`` routing and fan-out, ``_client``
EncodeClient, which composes them. Each imports only modules listed before
it.
"""

# Also module attributes, as before the split: grpc, the service config and
# the generated stubs (tests build raw requests with epd.client.encoder_pb2).
import grpc  # noqa: F401

from epd._service_config import ENCODER_SERVICE_CONFIG, RETRY_BUFFER_BYTES  # noqa: F401
from epd.client._client import EncodeClient
from epd.client._keys import KEY_VERSION, PreprocessConfig, VideoSampling, caller_content_key, content_key, video_key
from epd.client._lease_types import CudaIpcLease, CudaIpcRef, ShmLease
from epd.client._leases import SESSION_HEADER, SESSION_RETRY_S
from epd.client._proto import Item
from epd.client._results import EncodeError, EncodeResult, ItemResult, ProbeResult, ServerInfo, to_vllm_batch
from epd.client._routing import ROUTE_HEADER
from epd.v1 import encoder_pb2, encoder_pb2_grpc  # noqa: F401

__all__ = [
    "ROUTE_HEADER",
    "SESSION_HEADER",
    "SESSION_RETRY_S",
    "KEY_VERSION",
    "PreprocessConfig",
    "VideoSampling",
    "content_key",
    "caller_content_key",
    "video_key",
    "ServerInfo",
    "Item",
    "ItemResult",
    "EncodeResult",
    "ProbeResult",
    "to_vllm_batch",
    "ShmLease",
    "CudaIpcRef",
    "CudaIpcLease",
    "EncodeError",
    "EncodeClient",
]

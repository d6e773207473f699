"""The lease records a delivered item carries (the lowest module of
epd.client's delivery half: it imports nothing of the package).

- ShmLease / CudaIpcLease: the client's hold on one span of a server's
  memfd arena or one CUDA IPC export, ended by a Release call (``release()``)
  or by the server at its lease time.
- CudaIpcRef: the handle fields of an item sent by CUDA IPC.
- Releaser: what a lease needs of the client that received it, one
  ``_release`` call (EncodeClient provides it).

_results annotates ItemResult with these; _leases (the arena mappings, the
session, attaching a reference to a result) builds them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Protocol, Tuple

from epd.v1 import encoder_pb2


class Releaser(Protocol):
    """Sends one Release call for (offset, generation, kind) spans; raises
    EncodeError when the server refuses it."""

    def _release(self, spans: List[Tuple[int, int, int]]) -> None: ...


class _Lease:
    """What both lease kinds share: ``release()`` sends one Release call
    through the client that received the item (its ``_release``)."""

    def __init__(self, client: Releaser, generation: int, lease_ms: int):
        self._client = client
        self.generation = generation
        self.lease_ms = lease_ms
        self.released = False

    def _release_tuple(self) -> Tuple[int, int, int]:
        raise NotImplementedError

    def release(self) -> None:
        self.released = True
        self._client._release([self._release_tuple()])


class ShmLease(_Lease):
    """A lease on one span of a server's shared-memory arena."""

    def __init__(self, client: Releaser, offset: int, generation: int, lease_ms: int):
        super().__init__(client, generation, lease_ms)
        self.offset = offset

    def _release_tuple(self) -> Tuple[int, int, int]:
        return (self.offset, self.generation, encoder_pb2.LEASE_KIND_SHM)


class CudaIpcLease(_Lease):
    """A lease on one CUDA IPC export of a server (release kind CUDA IPC)."""

    def _release_tuple(self) -> Tuple[int, int, int]:
        return (0, self.generation, encoder_pb2.LEASE_KIND_CUDA_IPC)


@dataclass(frozen=True)
class CudaIpcRef:
    """A CUDA IPC reference to an item's rows (EncodedItem.cuda_ipc):
    ``length`` bytes, main at byte 0 and deepstack at ``deepstack_offset``,
    in the item's dtype, in a copy the server made in its GPU memory."""

    memory_handle: bytes   # 64 bytes, cudaIpcMemHandle_t
    event_handle: bytes    # 64 bytes, cudaIpcEventHandle_t; all zero = nothing to wait on
    length: int
    deepstack_offset: int
    device: str            # the server's device, e.g. "cuda:0 (NVIDIA H200, ...)"
    device_index: int      # its CUDA ordinal; -1 for a non-CUDA stand-in
    pid: int               # the server's process id
    generation: int
    lease_ms: int

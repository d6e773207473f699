"""Shared-memory and CUDA IPC delivery: leases, arena mappings, the session.

- ShmLease / CudaIpcLease / CudaIpcRef (from _lease_types, named here too):
  the records a delivered item carries.
- ArenaMappings: segment -> read-only mmap of a same-host server's arena
  (mapped through /proc/<pid>/fd/<fd>, docs/SHM.md), shared by the threads of
  one client.
- LeaseSession: the client's lease session (a Session stream, named on each
  shared-memory or CUDA IPC call by SESSION_HEADER), opened on demand and
  retried SESSION_RETRY_S after a refusal.
- attach_shm / attach_cuda_ipc: turn an inline-shaped ItemResult into one
  whose rows are arena views or a CUDA IPC reference, after checking the
  reference against the item's shape.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from typing import Optional

import grpc

from epd.client._lease_types import CudaIpcLease, CudaIpcRef, Releaser, ShmLease, _Lease
from epd.client._results import _DTYPE_SIZES, EncodeError, ItemResult

SESSION_HEADER = "x-epd-session"
# After the server refuses a lease session (no arena, its cap, an older
# server), shared-memory calls go without one; the next try waits this long.
SESSION_RETRY_S = 1.0


def _release_quietly(lease: _Lease) -> None:
    """Hands a lease back now rather than at expiry, when the item it came
    with cannot be used; a refusal changes nothing for the caller."""
    try:
        lease.release()
    except EncodeError:
        pass


def _map_arena(ref) -> mmap.mmap:
    """The server's arena ``ref`` points into, mapped read-only. Raises
    EncodeError: PERMISSION_DENIED for another user's server,
    FAILED_PRECONDITION when /proc/<pid>/fd/<fd> is not that arena."""
    path = f"/proc/{ref.pid}/fd/{ref.fd}"
    name = f"epd-shm-{ref.segment:016x}"
    try:
        link = os.readlink(path)
        if name not in link:
            raise FileNotFoundError(path)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except PermissionError as e:
        raise EncodeError(grpc.StatusCode.PERMISSION_DENIED,
                          f"cannot open {path}: {e.strerror}; the shared-memory arena opens only for the "
                          "server's own user") from None
    except OSError:
        raise EncodeError(grpc.StatusCode.FAILED_PRECONDITION,
                          f"{path} is not the server's shared-memory arena {name} (a server on another host or "
                          "in another PID namespace?)") from None
    try:
        return mmap.mmap(fd, ref.segment_bytes, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    finally:
        os.close(fd)


class ArenaMappings(dict):
    """segment id -> the read-only mapping of that server arena. Thread-safe:
    ``mapping(ref)`` maps a segment once (again when it has grown) under a
    lock. Mappings live as long as the client (views on them stay valid)."""

    def __init__(self):
        super().__init__()
        self._lock = threading.Lock()

    def mapping(self, ref) -> mmap.mmap:
        """The mapping ``ref`` (an ShmRef) points into; raises EncodeError as
        _map_arena does."""
        with self._lock:
            m = self.get(ref.segment)
            if m is None or len(m) < ref.segment_bytes:
                m = self[ref.segment] = _map_arena(ref)
            return m


class _Session:
    """The client's end of a lease session: a Session stream kept open until
    close(). A daemon thread reads it to its end, so ``live`` turns False as
    soon as the server ends it (e.g. shuts down)."""

    def __init__(self, stub, metadata, timeout: float):
        self._stop = threading.Event()
        self._named = threading.Event()
        self._ended = threading.Event()
        self.id = ""
        self._error: Optional[grpc.RpcError] = None
        self._timeout = timeout

        def requests():
            # Nothing to send; returning half-closes the stream, which ends
            # the session on the server.
            self._stop.wait()
            return
            yield  # pragma: no cover (makes this a generator)

        self._responses = stub.Session(requests(), metadata=metadata)
        self._reader = threading.Thread(target=self._read, name="epd-session", daemon=True)
        self._reader.start()
        if not self._named.wait(timeout) and not self._ended.is_set():
            self._responses.cancel()
            self._stop.set()
            raise EncodeError(grpc.StatusCode.DEADLINE_EXCEEDED,
                              f"the server did not name a lease session within {timeout} s")
        if not self.id:
            self._stop.set()
            e = self._error
            if e is not None:
                raise EncodeError(e.code(), e.details())
            raise EncodeError(grpc.StatusCode.INTERNAL, "the server ended the lease session without naming it")

    def _read(self) -> None:
        try:
            for event in self._responses:
                if not self.id:
                    self.id = event.session_id
                    self._named.set()
        except grpc.RpcError as e:
            self._error = e
        finally:
            self._ended.set()
            self._named.set()

    @property
    def live(self) -> bool:
        return bool(self.id) and not self._ended.is_set()

    def close(self) -> None:
        """Half-closes the stream and waits (at most the client's timeout)
        for the server to finish it, having released the session's leases;
        then cancels, which ends the session all the same."""
        self._stop.set()
        if not self._ended.wait(self._timeout):
            self._responses.cancel()
        self._reader.join(self._timeout)


class LeaseSession:
    """The one lease session of a client, opened on first use and reopened
    after the server ended it. Thread-safe (one lock; opening waits at most
    the client's timeout for the server to name the session)."""

    def __init__(self):
        self._session: Optional[_Session] = None
        self._retry_at = 0.0
        self._lock = threading.Lock()

    def id(self, stub, metadata, timeout: float) -> str:
        """The session's id for SESSION_HEADER, opening (or reopening) the
        session first; "" when the server refused one (tried again
        SESSION_RETRY_S later)."""
        with self._lock:
            if self._session is not None and self._session.live:
                return self._session.id
            if self._session is not None:  # ended, e.g. the server restarted
                self._session.close()
                self._session = None
            now = time.monotonic()
            if now < self._retry_at:
                return ""
            try:
                self._session = _Session(stub, metadata, timeout)
            except EncodeError:
                self._retry_at = now + SESSION_RETRY_S
                return ""
            return self._session.id

    def close(self) -> None:
        """Ends the session, if any: the server releases its leases."""
        with self._lock:
            if self._session is not None:
                self._session.close()
                self._session = None


def _failed(index: int, code: grpc.StatusCode, message: str) -> ItemResult:
    return ItemResult(index=index, ok=False, code=code, message=message)


def attach_cuda_ipc(client: Releaser, r: ItemResult, ref) -> ItemResult:
    """``r`` (a successful item) with the CUDA IPC reference ``ref``
    (EncodedItem.cuda_ipc) and its lease. A reference whose handles are not
    64 bytes or whose length and deepstack offset do not fit r's shape makes
    an INTERNAL failure, and its lease is handed back."""
    lease = CudaIpcLease(client, ref.generation, ref.lease_ms)
    main_bytes = r.tokens * r.hidden * _DTYPE_SIZES.get(r.dtype, 0)
    problem = ""
    if len(ref.memory_handle) != 64 or len(ref.event_handle) != 64:
        problem = (f"a {len(ref.memory_handle)}-byte memory handle and a {len(ref.event_handle)}-byte event "
                   "handle; both must be 64 bytes")
    elif ref.length == 0 or ref.length != main_bytes * (1 + r.deepstack_layers) \
            or ref.deepstack_offset != main_bytes:
        problem = (f"{ref.length} bytes, deepstack at byte {ref.deepstack_offset}, for shape "
                   f"[{r.tokens}, {r.hidden}] x {1 + r.deepstack_layers}")
    if problem:
        _release_quietly(lease)  # the server holds the export until then
        return _failed(r.index, grpc.StatusCode.INTERNAL,
                       f"server sent item {r.index} by CUDA IPC with {problem}")
    r.cuda_ipc = CudaIpcRef(memory_handle=bytes(ref.memory_handle), event_handle=bytes(ref.event_handle),
                            length=ref.length, deepstack_offset=ref.deepstack_offset, device=ref.device,
                            device_index=ref.device_index, pid=ref.pid, generation=ref.generation,
                            lease_ms=ref.lease_ms)
    r.lease = lease
    return r


def attach_shm(client: Releaser, arenas: ArenaMappings, r: ItemResult, ref) -> ItemResult:
    """``r`` (a successful item) with main/deepstack as read-only views on
    the arena span ``ref`` (EncodedItem.shm) and its lease. A span that does
    not fit r's shape or the arena makes an INTERNAL failure; an arena that
    cannot be mapped fails the item with _map_arena's code, and its lease is
    handed back."""
    main_bytes = r.tokens * r.hidden * _DTYPE_SIZES.get(r.dtype, 0)
    if (ref.length != main_bytes * (1 + r.deepstack_layers) or ref.offset > ref.segment_bytes
            or ref.length > ref.segment_bytes - ref.offset):
        return _failed(r.index, grpc.StatusCode.INTERNAL,
                       f"server sent item {r.index} by reference with {ref.length} bytes at offset "
                       f"{ref.offset} of a {ref.segment_bytes}-byte arena, for shape "
                       f"[{r.tokens}, {r.hidden}] x {1 + r.deepstack_layers}")
    lease = ShmLease(client, ref.offset, ref.generation, ref.lease_ms)
    try:
        rows = memoryview(arenas.mapping(ref))[ref.offset:ref.offset + ref.length]
    except EncodeError as e:
        _release_quietly(lease)  # hand the span back now rather than at expiry
        return _failed(r.index, e.code, f"item {r.index}: {e.message}")
    r.main = rows[:main_bytes]
    r.deepstack = rows[main_bytes:]
    r.lease = lease
    return r

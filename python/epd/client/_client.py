"""EncodeClient: the channel, its calls, and the encode() path that composes
the key format (_keys), routing and fan-out (_routing), proto conversion
(_proto) and shared-memory / CUDA IPC delivery (_leases)."""

from __future__ import annotations

import concurrent.futures
import itertools
import uuid
from typing import Dict, List, Optional, Sequence, Tuple, Union

import grpc

from epd._service_config import ENCODER_SERVICE_CONFIG, RETRY_BUFFER_BYTES
from epd.client import _proto, _routing
from epd.client._leases import SESSION_HEADER, ArenaMappings, LeaseSession, attach_cuda_ipc, attach_shm
from epd.client._proto import Item, _as_item, _from_proto
from epd.client._results import EncodeError, ItemResult, ProbeResult, ServerInfo
from epd.v1 import encoder_pb2, encoder_pb2_grpc


class EncodeClient:
    """See the epd.client docstring. ``timeout`` is each call's deadline, seconds.

    Security (docs/SERVER.md, "Production setup"), all off by default:

    - ``tls=True``, or any of ``root_certificates`` / ``certificate_chain``:
      a TLS channel. ``root_certificates`` (PEM bytes) is the CA the server's
      certificate must chain to (None = the system trust store);
      ``certificate_chain`` and ``private_key`` (PEM bytes, both or neither)
      are this client's certificate for a server that requires mutual TLS.
      ``server_name`` checks the server's certificate against that name
      instead of the target's host (a certificate reached by IP).
    - ``auth_token``: sent on every call as ``authorization: Bearer <token>``.
      With a tokens file on the server the token names this client's tenant.
    - ``tenant``: sent on every call under ``tenant_header`` (default
      ``x-epd-tenant``); it names the tenant only on a server started with
      ``--trust-tenant-header`` and without a credential naming one
      (docs/SECURITY.md), and the fair order's share otherwise.

    Raises ValueError for an empty target or half a client certificate.
    """

    def __init__(self, target: str, timeout: float = 30.0, route_by_key: bool = True,
                 max_response_bytes: int = 256 << 20, max_items_per_call: int = 256, *, tls: bool = False,
                 root_certificates: Optional[bytes] = None, certificate_chain: Optional[bytes] = None,
                 private_key: Optional[bytes] = None, server_name: Optional[str] = None,
                 auth_token: Optional[str] = None, shm: bool = False, cuda_ipc: bool = False,
                 tenant: Optional[str] = None, tenant_header: str = "x-epd-tenant"):
        if not target:
            raise ValueError("target is empty; pass host:port or unix:/path")
        self.shm = shm
        self.cuda_ipc = cuda_ipc
        self._arenas = ArenaMappings()  # segment -> mapping
        if isinstance(max_items_per_call, bool) or not isinstance(max_items_per_call, int) or max_items_per_call < 1:
            raise ValueError(f"max_items_per_call must be an int >= 1, got {max_items_per_call!r}")
        if (certificate_chain is None) != (private_key is None):
            raise ValueError("mutual TLS needs both certificate_chain and private_key; one is missing")
        self.target = target
        self.max_items_per_call = max_items_per_call
        self.timeout = timeout
        self.route_by_key = route_by_key
        options = [
            ("grpc.max_receive_message_length", max_response_bytes),
            ("grpc.max_send_message_length", -1),
            # Encode's retry policy (proto/epd/v1/encoder_service_config.json):
            # a call refused before any item came back (UNAVAILABLE, or
            # CANCELLED by a server whose shutdown began as it arrived) is
            # sent again. Requests up to RETRY_BUFFER_BYTES stay retryable
            # (both from cmake/epd_service_config.cmake).
            ("grpc.enable_retries", 1),
            ("grpc.service_config", ENCODER_SERVICE_CONFIG),
            ("grpc.per_rpc_retry_buffer_size", RETRY_BUFFER_BYTES),
        ]
        if tls or root_certificates is not None or certificate_chain is not None or server_name:
            if server_name:
                options.append(("grpc.ssl_target_name_override", server_name))
            creds = grpc.ssl_channel_credentials(root_certificates=root_certificates, private_key=private_key,
                                                 certificate_chain=certificate_chain)
            self._channel = grpc.secure_channel(target, creds, options=options)
        else:
            self._channel = grpc.insecure_channel(target, options=options)
        self._auth = [("authorization", f"Bearer {auth_token}")] if auth_token else []
        if tenant:
            self._auth.append((tenant_header, tenant))
        self._stub = encoder_pb2_grpc.EncoderStub(self._channel)
        self._info: Optional[ServerInfo] = None
        self._prefix = "py-" + uuid.uuid4().hex[:12] + "-"
        self._ids = itertools.count(1)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=8)
        self._session = LeaseSession()

    def close(self) -> None:
        """Ends the lease session, if any (the server releases every lease
        this client still holds: its shared-memory views must not be used
        afterwards), and the channel."""
        self._pool.shutdown(wait=True)
        self._session.close()
        self._channel.close()

    def _session_id(self) -> str:
        """The lease session's id for ``x-epd-session``, opening (or
        reopening) the session first; "" when the server refused one."""
        return self._session.id(self._stub, self._auth, self.timeout)

    def __enter__(self) -> "EncodeClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- Health / Stats ---------------------------------------------------
    def health(self) -> ServerInfo:
        r = _proto.unary(self._stub.Health, encoder_pb2.HealthRequest(), self.timeout, self._auth)
        return _proto.server_info(r)

    def stats(self) -> Dict[str, object]:
        """The Stats RPC as a dict (field names as in StatsResponse)."""
        return _proto.stats_dict(_proto.unary(self._stub.Stats, encoder_pb2.StatsRequest(), self.timeout,
                                              self._auth))

    def key_for(self, item: Union[bytes, Item]) -> bytes:
        """The key the server will use for ``item`` (from Health's inputs)."""
        return _routing.route_key(self._server_info(), item if isinstance(item, Item) else Item(image=item))

    def _server_info(self) -> ServerInfo:
        if self._info is None:
            self._info = self.health()
        return self._info

    def probe(self, items: Sequence[Union[bytes, Item]], check: bool = True) -> List[ProbeResult]:
        """The Probe RPC: each item's content key, route key, grid and
        tokens, read by the server from the headers without decoding or
        encoding (docs/SERVER.md, "Probe"). One unrouted call under this
        client's credentials. With ``check`` (default) raises EncodeError
        carrying the lowest-index failed item (and every result); a failed
        call raises EncodeError with its status. TypeError as encode()."""
        items = [_as_item(i, n) for n, i in enumerate(items)]
        if not items:
            raise EncodeError(grpc.StatusCode.INVALID_ARGUMENT, "the request has no items; send at least one image")
        reply = _proto.unary(self._stub.Probe, _proto.encode_request("", items, False, False), self.timeout,
                             self._auth)
        out: List[ProbeResult] = [ProbeResult(index=i, ok=False, code=grpc.StatusCode.INTERNAL,
                                              message=f"the server's probe reply has no item {i}")
                                  for i in range(len(items))]
        for m in reply.items:
            if 0 <= m.index < len(items):
                out[m.index] = _proto.probe_from_proto(m, m.index)
        if check:
            for r in out:
                if not r.ok:
                    raise EncodeError(r.code, r.message, out)
        return out

    # --- Encode -------------------------------------------------------------
    def release(self, results: Sequence[ItemResult]) -> None:
        """Ends the shared-memory leases of ``results`` in one Release call
        (items that came inline, or are released already, are skipped).
        Raises EncodeError with FAILED_PRECONDITION when the server refused
        any (expired meanwhile); the others are released all the same."""
        leases = [r.lease for r in results if r.lease is not None and not r.lease.released]
        for lease in leases:
            lease.released = True
        if leases:
            self._release([lease._release_tuple() for lease in leases])

    def _release(self, spans: List[Tuple[int, ...]]) -> None:
        """(offset, generation) or (offset, generation, kind) per lease."""
        _proto.unary(self._stub.Release, _proto.release_request(spans), self.timeout, self._auth)

    def encode(self, items: Sequence[Union[bytes, Item]], request_id: Optional[str] = None,
               check: bool = True, shm: Optional[bool] = None,
               cuda_ipc: Optional[bool] = None) -> List[ItemResult]:
        """Encodes ``items`` (bytes-like or Item). Returns results by index.
        With ``check`` (default), raises EncodeError carrying the lowest-index
        failure (and every result) when any item failed. Raises TypeError for
        an item of another type. More than ``max_items_per_call`` items (of
        one key, or of the request when not routing by key) go in several
        calls; see the epd.client docstring. ``shm`` overrides the client's
        ``shm`` for this request (shared-memory delivery, see above), and
        ``cuda_ipc`` the client's ``cuda_ipc`` (CUDA IPC delivery)."""
        use_shm = self.shm if shm is None else shm
        use_ipc = self.cuda_ipc if cuda_ipc is None else cuda_ipc
        items = [_as_item(i, n) for n, i in enumerate(items)]
        if not items:
            raise EncodeError(grpc.StatusCode.INVALID_ARGUMENT, "the request has no items; send at least one image")
        if request_id is None:
            request_id = f"{self._prefix}{next(self._ids)}"
        calls = _routing.plan_calls(items, self.key_for if self.route_by_key else None, self.max_items_per_call)
        results: List[Optional[ItemResult]] = [None] * len(items)

        def call(n: int) -> None:
            route, indices = calls[n]
            rid = request_id if len(calls) == 1 else f"{request_id}/{n}"
            self._call(rid, route, [items[i] for i in indices], indices, results, use_shm, use_ipc)

        _routing.fan_out(self._pool, len(calls), call)
        out = [r for r in results]  # every slot is filled by _call
        if check:
            for r in out:
                if not r.ok:
                    raise EncodeError(r.code, r.message, out)
        return out

    def _call(self, rid: str, route: str, items: List[Item], indices: List[int],
              results: List[Optional[ItemResult]], use_shm: bool = False, use_ipc: bool = False) -> None:
        req = _proto.encode_request(rid, items, use_shm, use_ipc)
        session_id = self._session_id() if use_shm or use_ipc else ""
        metadata = _routing.call_metadata(route, self._auth, (SESSION_HEADER, session_id) if session_id else None)
        _routing.collect(lambda: self._stub.Encode(req, timeout=self.timeout, metadata=metadata), indices,
                         results, self._item_result)

    def _item_result(self, m, index: int) -> ItemResult:
        """EncodedItem ``m`` as request item ``index``'s result: inline, or
        with its shared-memory or CUDA IPC rows and lease."""
        r = _from_proto(m, index)
        if not r.ok:
            return r
        if m.HasField("cuda_ipc"):
            return attach_cuda_ipc(self, r, m.cuda_ipc)
        if m.HasField("shm"):
            return attach_shm(self, self._arenas, r, m.shm)
        return r

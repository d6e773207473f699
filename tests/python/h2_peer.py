"""A raw HTTP/2 client for gRPC calls that a well-behaved client would never
make: one that advertises a stream window of 0 (SETTINGS_INITIAL_WINDOW_SIZE
= 0), so the server may send headers and trailers but no DATA until the
client grants window, and that can open far more streams than it reads.

Written from the framing rules of RFC 9113 (HTTP/2) and RFC 7541 (HPACK) and
gRPC's own wire rules (PROTOCOL-HTTP2.md: the 5-byte message prefix,
`content-type: application/grpc`, `te: trailers`, status in trailers), with
the standard library only. It speaks just what these tests need:

- frames: SETTINGS (acked both ways), PING (answered, so keepalive never
  ends the connection), HEADERS + CONTINUATION, DATA (counted, and its
  connection window given back so one stream's grant never starves the rest),
  WINDOW_UPDATE (sent by `grant`), RST_STREAM and GOAWAY (recorded);
- HPACK: requests are sent as literals without indexing and without Huffman
  coding; responses are decoded with the static and dynamic tables. A
  Huffman-coded string is kept undecoded (as bytes starting with b"huffman:"):
  gRPC's own status headers are not Huffman coded, and nothing here reads
  another header's value.

Not a test module. Thread safety: one reader thread updates the streams'
state under a lock; the public methods may be called from any thread.
"""

import socket
import struct
import threading
import time
from typing import Dict, List, Optional, Tuple

import grpc_wire as w

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
# Frame types (RFC 9113 section 6) and flags.
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
# SETTINGS parameters (section 6.5.2).
SETTINGS_ENABLE_PUSH, SETTINGS_MAX_CONCURRENT_STREAMS, SETTINGS_INITIAL_WINDOW_SIZE = 0x2, 0x3, 0x4
# Error codes (section 7).
NO_ERROR, CANCEL, REFUSED_STREAM, ENHANCE_YOUR_CALM = 0x0, 0x8, 0x7, 0xB

# RFC 7541 Appendix A.
STATIC_TABLE: List[Tuple[str, str]] = [
    (":authority", ""), (":method", "GET"), (":method", "POST"), (":path", "/"), (":path", "/index.html"),
    (":scheme", "http"), (":scheme", "https"), (":status", "200"), (":status", "204"), (":status", "206"),
    (":status", "304"), (":status", "400"), (":status", "404"), (":status", "500"), ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"), ("accept-language", ""), ("accept-ranges", ""), ("accept", ""),
    ("access-control-allow-origin", ""), ("age", ""), ("allow", ""), ("authorization", ""),
    ("cache-control", ""), ("content-disposition", ""), ("content-encoding", ""), ("content-language", ""),
    ("content-length", ""), ("content-location", ""), ("content-range", ""), ("content-type", ""),
    ("cookie", ""), ("date", ""), ("etag", ""), ("expect", ""), ("expires", ""), ("from", ""), ("host", ""),
    ("if-match", ""), ("if-modified-since", ""), ("if-none-match", ""), ("if-range", ""),
    ("if-unmodified-since", ""), ("last-modified", ""), ("link", ""), ("location", ""), ("max-forwards", ""),
    ("proxy-authenticate", ""), ("proxy-authorization", ""), ("range", ""), ("referer", ""), ("refresh", ""),
    ("retry-after", ""), ("server", ""), ("set-cookie", ""), ("strict-transport-security", ""),
    ("transfer-encoding", ""), ("user-agent", ""), ("vary", ""), ("via", ""), ("www-authenticate", ""),
]
ENCODE = "/epd.v1.Encoder/Encode"


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    """One frame: 24-bit length, type, flags, 31-bit stream id (section 4.1)."""
    return struct.pack(">I", len(payload))[1:] + bytes((kind, flags)) + struct.pack(">I", stream) + payload


def hpack_int(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An integer with an N-bit prefix (RFC 7541 section 5.1); `first` holds the
    bits above the prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def hpack_literal(name: str, value: str) -> bytes:
    """A literal header field without indexing, new name, no Huffman (6.2.2)."""
    n, v = name.encode(), value.encode()
    return b"\x00" + hpack_int(len(n), 7) + n + hpack_int(len(v), 7) + v


class HpackDecoder:
    """RFC 7541 decoding with a dynamic table (Huffman strings kept raw)."""

    def __init__(self) -> None:
        self.dynamic: List[Tuple[str, str]] = []
        self.max_size = 4096

    def _int(self, data: bytes, i: int, prefix_bits: int) -> Tuple[int, int]:
        limit = (1 << prefix_bits) - 1
        value = data[i] & limit
        i += 1
        if value < limit:
            return value, i
        shift = 0
        while True:
            b = data[i]
            i += 1
            value += (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return value, i

    def _string(self, data: bytes, i: int) -> Tuple[str, int]:
        huffman = bool(data[i] & 0x80)
        n, i = self._int(data, i, 7)
        raw = data[i:i + n]
        return ("huffman:" + raw.hex()) if huffman else raw.decode("latin-1"), i + n

    def _entry(self, index: int) -> Tuple[str, str]:
        if index <= len(STATIC_TABLE):
            return STATIC_TABLE[index - 1]
        return self.dynamic[index - len(STATIC_TABLE) - 1]

    def _add(self, name: str, value: str) -> None:
        self.dynamic.insert(0, (name, value))
        while sum(len(n) + len(v) + 32 for n, v in self.dynamic) > self.max_size:
            self.dynamic.pop()

    def decode(self, block: bytes) -> List[Tuple[str, str]]:
        out: List[Tuple[str, str]] = []
        i = 0
        while i < len(block):
            b = block[i]
            if b & 0x80:  # indexed (6.1)
                index, i = self._int(block, i, 7)
                out.append(self._entry(index))
                continue
            if b & 0xE0 == 0x20:  # dynamic table size update (6.3)
                self.max_size, i = self._int(block, i, 5)
                continue
            incremental = b & 0xC0 == 0x40
            index, i = self._int(block, i, 6 if incremental else 4)
            if index:
                name = self._entry(index)[0]
            else:
                name, i = self._string(block, i)
            value, i = self._string(block, i)
            if incremental:
                self._add(name, value)
            out.append((name, value))
        return out


class Stream:
    """What the peer has seen of one stream."""

    def __init__(self, stream_id: int) -> None:
        self.id = stream_id
        self.headers: List[List[Tuple[str, str]]] = []  # each header block (response headers, trailers)
        self.data_bytes = 0                              # DATA payload received
        self.rst: Optional[int] = None                   # RST_STREAM error code, if any
        self.ended = False                               # END_STREAM seen, or reset

    def grpc_status(self) -> Optional[int]:
        """grpc-status from the last header block (trailers), None if not yet."""
        for block in reversed(self.headers):
            for name, value in block:
                if name == "grpc-status":
                    return int(value)
        return None

    def grpc_message(self) -> str:
        for block in reversed(self.headers):
            for name, value in block:
                if name == "grpc-message":
                    return value
        return ""


class H2Peer:
    """One HTTP/2 connection to 127.0.0.1:port with SETTINGS_INITIAL_WINDOW_SIZE
    = `initial_window` (0: the server can send no DATA until `grant`)."""

    def __init__(self, port: int, initial_window: int = 0, host: str = "127.0.0.1", timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.settimeout(None)
        self.authority = f"{host}:{port}"
        self.lock = threading.Condition()
        self.streams: Dict[int, Stream] = {}
        self.server_settings: Dict[int, int] = {}
        self.server_settings_seen = False
        self.goaway: Optional[Tuple[int, int]] = None  # (last stream id, error code)
        self.closed = False
        self.next_id = 1
        self._decoder = HpackDecoder()
        self._send_lock = threading.Lock()
        settings = struct.pack(">HI", SETTINGS_ENABLE_PUSH, 0) + struct.pack(">HI", SETTINGS_INITIAL_WINDOW_SIZE,
                                                                             initial_window)
        self._send(PREFACE + frame(SETTINGS, 0, 0, settings))
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._reader.start()

    # --- sending -------------------------------------------------------------
    def _send(self, data: bytes) -> None:
        with self._send_lock:
            self.sock.sendall(data)

    def open_call(self, path: str, message: bytes, metadata: Tuple[Tuple[str, str], ...] = ()) -> int:
        """Starts a unary-request gRPC call (HEADERS, then one DATA frame with
        the length-prefixed message and END_STREAM); returns its stream id."""
        with self.lock:
            sid = self.next_id
            self.next_id += 2
            self.streams[sid] = Stream(sid)
        block = b"".join(hpack_literal(n, v) for n, v in (
            (":method", "POST"), (":scheme", "http"), (":path", path), (":authority", self.authority),
            ("content-type", "application/grpc"), ("te", "trailers")) + tuple(metadata))
        body = b"\x00" + struct.pack(">I", len(message)) + message
        self._send(frame(HEADERS, END_HEADERS, sid, block) + frame(DATA, END_STREAM, sid, body))
        return sid

    def open_encode(self, request: bytes, tenant: Optional[str] = None) -> int:
        return self.open_call(ENCODE, request, (("x-epd-tenant", tenant),) if tenant else ())

    def grant(self, stream_id: int, n: int) -> None:
        """Lets the server send `n` more DATA bytes on `stream_id` (WINDOW_UPDATE)."""
        self._send(frame(WINDOW_UPDATE, 0, stream_id, struct.pack(">I", n)))

    def close(self) -> None:
        """Closes the TCP connection at once (no GOAWAY: a client that vanished)."""
        with self.lock:
            self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    # --- reading -------------------------------------------------------------
    def _recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("the server closed the connection")
            buf += chunk
        return bytes(buf)

    def _read_loop(self) -> None:
        pending: Dict[int, Tuple[bytearray, bool]] = {}  # header blocks awaiting CONTINUATION, END_STREAM
        try:
            while True:
                head = self._recv_exact(9)
                length = int.from_bytes(head[0:3], "big")
                kind, flags = head[3], head[4]
                sid = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
                payload = self._recv_exact(length) if length else b""
                self._on_frame(kind, flags, sid, payload, pending)
        except (OSError, ConnectionError, ValueError):
            pass
        with self.lock:
            self.closed = True
            self.lock.notify_all()

    def _on_frame(self, kind: int, flags: int, sid: int, payload: bytes,
                  pending: Dict[int, Tuple[bytearray, bool]]) -> None:
        if kind == SETTINGS:
            if not flags & ACK:
                with self.lock:
                    for i in range(0, len(payload), 6):
                        key, value = struct.unpack(">HI", payload[i:i + 6])
                        self.server_settings[key] = value
                    self.server_settings_seen = True
                    self.lock.notify_all()
                self._send(frame(SETTINGS, ACK, 0))
        elif kind == PING:
            if not flags & ACK:
                self._send(frame(PING, ACK, 0, payload))
        elif kind in (HEADERS, CONTINUATION):
            if kind == HEADERS:
                if flags & PADDED:
                    pad = payload[0]
                    payload = payload[1:len(payload) - pad]
                if flags & PRIORITY:
                    payload = payload[5:]
                pending[sid] = (bytearray(payload), bool(flags & END_STREAM))
            else:
                pending[sid][0].extend(payload)
            if flags & END_HEADERS:
                block, end = pending.pop(sid)
                fields = self._decoder.decode(block)
                with self.lock:
                    s = self.streams.get(sid)
                    if s is not None:
                        s.headers.append(fields)
                        s.ended = s.ended or end
                    self.lock.notify_all()
        elif kind == DATA:
            if flags & PADDED:
                pad = payload[0]
                payload = payload[1:len(payload) - pad]
            if payload:
                # Give the connection window back; the stream's stays as set.
                self._send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", len(payload))))
            with self.lock:
                s = self.streams.get(sid)
                if s is not None:
                    s.data_bytes += len(payload)
                    s.ended = s.ended or bool(flags & END_STREAM)
                self.lock.notify_all()
        elif kind == RST_STREAM:
            with self.lock:
                s = self.streams.get(sid)
                if s is not None:
                    s.rst = struct.unpack(">I", payload[:4])[0]
                    s.ended = True
                self.lock.notify_all()
        elif kind == GOAWAY:
            with self.lock:
                self.goaway = struct.unpack(">II", payload[:8])
                self.lock.notify_all()

    # --- waiting -------------------------------------------------------------
    def wait(self, predicate, timeout: float) -> bool:
        """Waits until predicate(self) holds (checked under the lock); False
        after `timeout` s."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while not predicate(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.lock.wait(min(left, 0.1))
            return True

    def stream(self, sid: int) -> Stream:
        with self.lock:
            return self.streams[sid]

    def ended(self, sids) -> List[int]:
        with self.lock:
            return [sid for sid in sids if self.streams[sid].ended]


def encode_request(request_id: str, caller_keys: List[bytes]) -> bytes:
    """An epd.v1.EncodeRequest (id = 1, items = 2) of caller-key-only items
    (EncodeItem.caller_key = 2): a hit when the server has the keys cached."""
    items = b"".join(w.string_field(2, w.string_field(2, k)) for k in caller_keys)
    return w.string_field(1, request_id) + items

"""Routing and fan-out: which call each item goes in, and running the calls.

An encode() request is planned as calls: items grouped by their route (the
hex of the key the server will use, sent in the ROUTE_HEADER metadata so a
hash-affinity proxy such as deploy/nginx sends each key to the same server),
in order of first appearance, each group cut into calls of at most the
server's item limit. The calls run concurrently (all but the first on the
client's thread pool, the first on the caller's thread) and each fills its
items' slots of one result list, by request index, so the order across calls
does not matter.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import grpc

from epd.client._keys import VideoSampling, caller_content_key, content_key, video_key
from epd.client._proto import Item
from epd.client._results import ItemResult, ServerInfo

ROUTE_HEADER = "x-epd-route"

# (route, request indices): one Encode call; route "" = no route header.
Call = Tuple[str, List[int]]


def route_key(info: ServerInfo, item: Item) -> bytes:
    """The key the server will use for ``item``, from Health's model id and
    preprocessing. Raises ValueError for an empty caller key."""
    if item.is_video:
        # The route key; the server's content key when its default
        # sampling is VideoSampling() (see epd/client/client.h).
        return video_key(info.model_id, info.preprocess, item.sampling or VideoSampling(), item.video,
                         item.video_frames)
    if item.caller_key is not None:
        return caller_content_key(info.model_id, info.preprocess, item.caller_key)
    return content_key(info.model_id, info.preprocess, item.image)


def plan_calls(items: Sequence[Item], route_of: Optional[Callable[[Item], bytes]],
               max_items_per_call: int) -> List[Call]:
    """The calls for ``items``: grouped by ``route_of(item).hex()`` in order
    of first appearance (one unrouted group when ``route_of`` is None; an
    item whose key raises ValueError goes unrouted, and the server names the
    problem), each group split into calls of at most ``max_items_per_call``
    keeping its order. ``route_of`` may raise EncodeError (Health failed)."""
    groups: List[Call] = []
    if route_of is not None:
        by_route: Dict[str, int] = {}
        for i, item in enumerate(items):
            try:
                route = route_of(item).hex()
            except ValueError:
                route = ""
            if route not in by_route:
                by_route[route] = len(groups)
                groups.append((route, []))
            groups[by_route[route]][1].append(i)
    else:
        groups.append(("", list(range(len(items)))))
    return [(route, indices[i:i + max_items_per_call])
            for route, indices in groups for i in range(0, len(indices), max_items_per_call)]


def fan_out(pool, count: int, call: Callable[[int], None]) -> None:
    """Runs ``call(0)`` .. ``call(count - 1)``: call 0 on this thread, the
    others on ``pool`` meanwhile; returns when all have ended. An exception
    from call 0 propagates at once; one from a pooled call when it is
    waited for, in call order."""
    futures = [pool.submit(call, n) for n in range(1, count)]
    call(0)
    for f in futures:
        f.result()


def call_metadata(route: str, auth: List[Tuple[str, str]], session_header: Optional[Tuple[str, str]]):
    """One call's metadata: the route header (when routed), the credentials,
    and the lease session's header (when there is one)."""
    metadata = ([(ROUTE_HEADER, route)] if route else []) + auth
    if session_header is not None:
        metadata.append(session_header)
    return metadata


def collect(replies: Callable[[], Iterable], indices: List[int], results: List[Optional[ItemResult]],
            convert: Callable[[object, int], ItemResult]) -> None:
    """Reads one Encode call's reply stream (``replies()``) into ``results``:
    EncodedItem m goes to slot indices[m.index] as ``convert(m, request
    index)``; an out-of-range or repeated m.index is ignored. Every item the
    stream did not deliver fails with the call's status, or INTERNAL when
    the call ended OK without it."""
    got = set()
    code, message = grpc.StatusCode.OK, ""
    try:
        for m in replies():
            if m.index < 0 or m.index >= len(indices) or m.index in got:
                continue
            got.add(m.index)
            results[indices[m.index]] = convert(m, indices[m.index])
    except grpc.RpcError as e:
        code, message = e.code(), e.details()
    for local, index in enumerate(indices):
        if local not in got:
            if code == grpc.StatusCode.OK:
                code, message = grpc.StatusCode.INTERNAL, f"the server ended the call without item {index}"
            results[index] = ItemResult(index=index, ok=False, code=code, message=message)

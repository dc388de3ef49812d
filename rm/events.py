"""Upcalls to subscribers, and background jobs kept referenced: the two small services every part shares.

`Events.emit` sends a notification to every subscription of the
:class:`~cod.rm.registry.Registry` that matches it; nothing here decides what
happened, only who hears of it.  `Jobs` runs coroutines in the background on
the event loop and keeps them referenced until they end.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Coroutine, Iterable

from cod.protocol import jsonrpc as rpc
from cod.protocol.framing import HEADER, MAX_FRAME_BYTES, FrameError, FrameTooLarge, encode
from cod.protocol.prolog_text import predicate_name

from .registry import Connection, Registry, Subscription

log = logging.getLogger("cod.rm.events")
MAX_ID_DIGITS = 20  # a subscription id is a counter: far fewer digits


def notification_frames(event: str, payload: dict[str, Any]) -> Callable[[int], bytes]:
    """The frame of ``event``'s upcall for each subscription id, encoded once: byte for byte what
    ``encode(notification(event, {"subscription": sid, "event": event, **payload}))`` gives, the
    id's digits set into the one encoding.  Raises FrameError for a payload too large to send."""
    body = encode(rpc.notification(event, {"subscription": 0, "event": event, **payload}))[HEADER.size:]
    # Params' first key; inside a JSON string a quote is escaped, so the text cannot occur before it.
    marker = b'"subscription":0'
    at = body.index(marker) + len(marker) - 1
    head, tail = body[:at], body[at + 1:]
    if len(head) + MAX_ID_DIGITS + len(tail) > MAX_FRAME_BYTES:
        raise FrameTooLarge(len(head) + MAX_ID_DIGITS + len(tail), MAX_FRAME_BYTES)

    def frame(sid: int) -> bytes:
        digits = str(sid).encode()
        return HEADER.pack(len(head) + len(digits) + len(tail)) + head + digits + tail

    return frame


class Events:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def emit(self, event: str, payload: dict[str, Any], *, app_scope: str | None = None) -> None:
        """Send ``event`` to every matching subscription (for app-scoped events: same app only).

        The upcall is encoded once, and a connection's upcalls of one event go in one write: a
        peer with a thousand matching subscriptions costs a thousand copies, not a thousand
        encodings and system calls."""
        ids: dict[int, list[int]] = {}
        for sub in self.registry.subscribers(event, payload):
            conn = self.registry.connections.get(sub.conn_id)
            if conn is None or conn.write is None:
                continue
            if app_scope is not None and conn.app != app_scope:
                continue
            ids.setdefault(conn.id, []).append(sub.id)
        if not ids:
            return
        try:
            frame_of = notification_frames(event, payload)
        except FrameError as err:
            log.warning("upcall %s not sent: %s", event, err)
            return
        for conn_id, sub_ids in ids.items():
            write = self.registry.connections[conn_id].write
            assert write is not None
            write(b"".join(frame_of(sid) for sid in sub_ids))

    def send(self, conn_id: int, method: str, params: dict[str, Any]) -> None:
        """One notification to one connection (if it is still there)."""
        conn = self.registry.connections.get(conn_id)
        if conn is not None and conn.send is not None:
            conn.send(rpc.notification(method, params))

    def subscribe(self, conn: Connection, event: str, filt: dict[str, Any]) -> Subscription:
        return self.registry.subscribe(conn, event, filt)

    def unsubscribe(self, conn: Connection, sub_id: int) -> bool:
        return self.registry.unsubscribe(conn, sub_id)

    def facts_changed(self, app: str | None, op: str, facts: Iterable[str]) -> None:
        names = sorted({n for n in (predicate_name(f) for f in facts) if n})
        scope = "system" if app is None else "app"
        self.emit("facts_changed", {"scope": scope, "app": app, "op": op, "predicates": names}, app_scope=app)


class Jobs:
    """Coroutines run in the background, kept referenced until done."""

    def __init__(self) -> None:
        self._jobs: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        job = asyncio.get_running_loop().create_task(coro)
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)

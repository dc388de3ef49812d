"""Upcalls to subscribers, and background jobs kept referenced: the two small services every part shares.

`Events.emit` sends a notification to every subscription of the
:class:`~cod.rm.registry.Registry` that matches it; nothing here decides what
happened, only who hears of it.  `Jobs` runs coroutines in the background on
the event loop and keeps them referenced until they end.
"""

from __future__ import annotations

import asyncio
from typing import Any, Coroutine, Iterable

from cod.protocol import jsonrpc as rpc
from cod.protocol.prolog_text import predicate_name

from .registry import Connection, Registry, Subscription


class Events:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def emit(self, event: str, payload: dict[str, Any], *, app_scope: str | None = None) -> None:
        """Send ``event`` to every matching subscription (for app-scoped events: same app only)."""
        for sub in self.registry.subscribers(event, payload):
            conn = self.registry.connections.get(sub.conn_id)
            if conn is None or conn.send is None:
                continue
            if app_scope is not None and conn.app != app_scope:
                continue
            conn.send(rpc.notification(event, {"subscription": sub.id, "event": event, **payload}))

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

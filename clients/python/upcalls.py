"""Upcalls: subscriptions, and the handlers that run when their events arrive.

Handlers run on a handler thread (`handlers="thread"`, started with the first handler) or in the
caller's own loop (`handlers="manual"`: watch `fileno()`, call `dispatch()`).
"""

from __future__ import annotations

import _thread
import os
import queue
import time
from typing import Any

from .errors import CodError
from .parts import ClientParts, Handler, _Subscription, log


class Upcalls(ClientParts):
    """The upcall part of `Client`: subscriptions, routing upcalls to handlers, running them."""

    def subscribe(self, event: str, filter: dict[str, Any] | None, handler: Handler) -> int:
        """Call `handler(event_dict)` for each `event` matching `filter`; returns the subscription id."""
        self._ensure_handler_thread()
        res = self.call("subscribe", {"event": event, "filter": filter or {}})
        with self._state_lock:
            local_id = next(self._local_sub_ids)
            self._subs[local_id] = _Subscription(event, filter, handler, res["subscription"])
        return local_id

    def unsubscribe(self, subscription: int) -> None:
        with self._state_lock:
            sub = self._subs.pop(subscription, None)
        if sub is None:
            raise CodError(f"no subscription {subscription}")
        if sub.server_id is not None:
            self.call("unsubscribe", {"subscription": sub.server_id})

    def fileno(self) -> int:
        """A descriptor that becomes readable when upcalls wait for `dispatch()` (handlers="manual")."""
        if not self._manual:
            raise CodError("fileno() is for handlers='manual'; this client runs handlers on its own thread")
        return self._wake_r

    def dispatch(self, timeout: float | None = 0.0) -> int:
        """Run the handlers of waiting upcalls in this thread; returns how many ran."""
        if not self._manual:
            raise CodError("dispatch() is for handlers='manual'")
        ran = 0
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                item = self._events.get(block=ran == 0 and timeout != 0.0,
                                        timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            try:
                os.read(self._wake_r, 1)
            except BlockingIOError:
                pass
            if item is None:
                break
            self._run_handler(*item)
            ran += 1
        return ran

    def _ensure_handler_thread(self) -> None:
        """Handlers run on their own thread, started when the first handler is registered."""
        if self._manual or self._handler_ident is not None:
            return
        with self._state_lock:
            if self._handler_ident is None:
                self._handler_ident = _thread.start_new_thread(self._handler_loop, ())

    def _on_upcall(self, event: str, params: dict[str, Any]) -> None:
        sid = params.get("subscription")
        with self._state_lock:
            handler: Handler | None = None
            payload = dict(params)
            for local_id, sub in self._subs.items():
                if sub.server_id == sid:
                    handler = sub.handler
                    payload["subscription"] = local_id
                    break
            else:
                # A task's own allocation upcalls (the subscription register_task made); they may
                # arrive before register_task's reply, so they are routed by task name.
                task = params.get("task")
                if event == "allocation_changed" and isinstance(task, str):
                    handler = self._task_handlers.get(task)
        if event == "allocation_changed" and isinstance(params.get("task"), str):
            self._remember_allocation(params)
        if handler is not None:
            self._events.put((handler, payload))
            if self._manual:
                os.write(self._wake_w, b"x")

    def _handler_loop(self) -> None:
        try:
            while True:
                item = self._events.get()
                if item is None:
                    return
                self._run_handler(*item)
        finally:
            self._handlers_done.set()

    @staticmethod
    def _run_handler(handler: Handler, payload: dict[str, Any]) -> None:
        try:
            handler(payload)
        except Exception:
            log.exception("upcall handler %r failed", handler)

"""What the parts of `Client` share: its state, and the methods one part calls in another.

`Client` (:mod:`.client`) is composed of mixins, one job each: the connection (:mod:`.transport`),
reconnection (:mod:`.reconnect`), the direct query channel (:mod:`.direct`), knowledge (facts,
procedures, queries: :mod:`.knowledge`), tasks and allocations (:mod:`.tasks`), and upcalls
(subscriptions and their handlers: :mod:`.upcalls`).  Each derives from `ClientParts`, which comes
last in Client's method order, so its stubs only name what another part provides.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from cod.protocol.framing import FrameDecoder

from .state import HeldState

log = logging.getLogger("cod.client")

Handler = Callable[[dict[str, Any]], Any]


@dataclass
class _Subscription:
    event: str
    filter: dict[str, Any] | None
    handler: Handler
    server_id: int | None = None



class _Waiter:
    """One call's rendezvous: woken once, by its reply or by being handed the read turn (:mod:`.turns`).

    A bare lock is cheaper than an Event.  `promote` is called under the client's pending lock while
    the waiter is pending; `set` after it was taken out of pending, by whoever took it out: so each
    is called at most once, and the lock is released once.
    """

    __slots__ = ("_lock", "reply", "promoted")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self.reply: dict[str, Any] | None = None
        self.promoted = False  # this call holds the read turn: it must read, then pass it on

    def set(self, reply: dict[str, Any]) -> None:
        if self.reply is None:
            self.reply = reply
            if not self.promoted:
                self._lock.release()

    def promote(self) -> None:
        self.promoted = True
        if self.reply is None:
            self._lock.release()

    def wait(self, timeout: float | None) -> bool:
        return self._lock.acquire(timeout=-1 if timeout is None else timeout)



class ClientParts:
    """The state of a `Client` (set in Client.__init__) and the methods its parts call across."""

    path: str
    app: str | None
    reconnect: bool
    reconnect_timeout_s: float
    call_timeout_s: float | None
    server_info: dict[str, Any]
    direct_queries: bool
    _ids: Iterator[int]
    _send_lock: threading.Lock
    _pending: dict[int, _Waiter]
    _pending_lock: threading.Lock
    _connected: threading.Event
    _closed: bool
    _sock: socket.socket | None
    _new_sock: socket.socket | None
    _decoder: FrameDecoder
    _turns: Any  # turns.ReadTurns
    _broken: bool
    _state_lock: threading.RLock
    _held: HeldState
    _direct: Any  # direct._DirectChannel | None
    _direct_retry_at: float
    _task_handlers: dict[str, Handler | None]
    _subs: dict[int, _Subscription]
    _local_sub_ids: Iterator[int]
    _allocations: dict[str, dict[str, Any]]
    _allocation_changed: threading.Condition
    _events: queue.SimpleQueue[tuple[Handler, dict[str, Any]] | None]
    _manual: bool
    _wake_r: int
    _wake_w: int
    _handler_ident: int | None
    _handlers_done: threading.Event

    def call(self, method: str, params: dict[str, Any] | None = None, *, timeout_s: float | None = None) -> Any:
        raise NotImplementedError  # transport.Transport

    def _open_direct(self, offer: dict[str, Any] | None) -> None:
        raise NotImplementedError  # direct.DirectQueries

    def _on_upcall(self, event: str, params: dict[str, Any]) -> None:
        raise NotImplementedError  # upcalls.Upcalls

    def _ensure_handler_thread(self) -> None:
        raise NotImplementedError  # upcalls.Upcalls

    def _remember_allocation(self, alloc: dict[str, Any]) -> None:
        raise NotImplementedError  # tasks.Tasks

    def _reconnect(self) -> bool:
        raise NotImplementedError  # reconnect.Reconnection

    def _await_reply(self, rid: int, waiter: _Waiter, deadline: float | None) -> dict[str, Any] | None:
        raise NotImplementedError  # reading.Reading

    def _on_message(self, msg: dict[str, Any]) -> None:
        raise NotImplementedError  # transport.Transport

    def _fail_pending(self, err: Exception) -> None:
        raise NotImplementedError  # transport.Transport

    def _closed_by_server(self) -> None:
        raise NotImplementedError  # transport.Transport

    def _raw_call(self, sock: socket.socket, decoder: FrameDecoder, method: str, params: dict[str, Any]) -> Any:
        raise NotImplementedError  # transport.Transport

    def _dial(self) -> socket.socket:
        raise NotImplementedError  # transport.Transport

    def _open(self, sock: socket.socket, *, ready: bool = True) -> None:
        raise NotImplementedError  # transport.Transport

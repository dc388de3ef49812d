"""The Python client of the COD Resource Manager.

One socket per `Client` to the daemon.  A call reads its own reply when no
other thread reads the socket; else it is handed its reply (or the turn to
read).  A background reader thread reads while no call does, so upcalls
arrive whether or not the application calls (:mod:`.reading`).  Replies are
matched to calls by id; upcall handlers run either on a handler thread
(`handlers="thread"`, the default) or in the caller's own loop
(`handlers="manual"`: watch `fileno()`, call `dispatch()`).

Queries take a shorter road when the daemon offers it: a second socket
straight to the SKB server (the direct channel, docs/protocol.md), on which
the calling thread sends the query and reads its answer itself.  Everything
else goes through the daemon, which owns recomputation and upcalls.  When
the direct channel fails, the query goes through the daemon instead.

The client remembers what it holds on the daemon (facts, procedures, tasks,
subscriptions; compacted, see :mod:`.state`) and, when the daemon restarts,
reconnects and puts it back, so an application survives an RM restart without
code of its own.
"""

from __future__ import annotations

import _thread
import itertools
import os
import queue
import socket
import threading
from typing import Any

from cod.protocol.paths import default_socket_path

from .direct import _DirectChannel
from .errors import ConnectionLost, error_from_reply
from .knowledge import Knowledge
from .parts import Handler, _Subscription, _Waiter
from .reading import Reading
from .reconnect import Reconnection
from .state import HeldState
from .tasks import Tasks
from .transport import CLIENT_NAME, Transport
from .turns import ReadTurns
from .upcalls import Upcalls

__all__ = ["CLIENT_NAME", "Client", "Handler"]


class Client(Transport, Reading, Reconnection, Knowledge, Tasks, Upcalls):
    """A connection to the RM.  Thread-safe: calls may come from any thread.

    Composed of its parts (:mod:`.parts`): the connection, reconnection, knowledge (facts,
    procedures, queries, the direct channel), tasks and allocations, upcalls (subscriptions).
    """

    def __init__(
        self,
        path: str | None = None,
        *,
        app: str | None = None,
        handlers: str = "thread",
        reconnect: bool = True,
        reconnect_timeout_s: float = 30.0,
        call_timeout_s: float | None = 60.0,
    ) -> None:
        if handlers not in ("thread", "manual"):
            raise ValueError("handlers must be 'thread' or 'manual'")
        self.path = path or default_socket_path()
        self.app = app
        self.reconnect = reconnect
        self.reconnect_timeout_s = reconnect_timeout_s
        self.call_timeout_s = call_timeout_s
        self.server_info: dict[str, Any] = {}
        self._ids = itertools.count(1)
        self._send_lock = threading.Lock()
        self._pending: dict[int, _Waiter] = {}
        self._pending_lock = threading.Lock()
        self._connected = threading.Event()
        self._closed = False
        self._sock: socket.socket | None = None
        self._new_sock: socket.socket | None = None  # during a reconnection, until the replay is done
        self._turns = ReadTurns(self._pending, self._pending_lock)  # who reads the socket (turns.py)
        self._broken = False  # a caller met a bad frame: the reader thread reconnects
        # What to replay after a reconnection.
        self._state_lock = threading.RLock()
        self._held = HeldState()
        self._direct: _DirectChannel | None = None
        self._direct_retry_at = 0.0
        self.direct_queries = True  # use the direct channel when the daemon offers one
        self._task_handlers: dict[str, Handler | None] = {}
        self._subs: dict[int, _Subscription] = {}  # local id -> subscription
        self._local_sub_ids = itertools.count(1)
        self._allocations: dict[str, dict[str, Any]] = {}
        self._allocation_changed = threading.Condition()
        # Upcalls waiting for a handler.
        self._events: queue.SimpleQueue[tuple[Handler, dict[str, Any]] | None] = queue.SimpleQueue()
        self._manual = handlers == "manual"
        self._wake_r, self._wake_w = os.pipe() if self._manual else (-1, -1)
        if self._manual:
            os.set_blocking(self._wake_r, False)
        try:
            self._open(self._dial())
        except BaseException:
            self._turns.close()
            raise
        # Threads are started with _thread, which does not wait for the new thread to be
        # scheduled (threading.Thread.start does: ~1 ms of a connect on a busy machine).
        self._reader_done = threading.Event()
        self._reader_ident = _thread.start_new_thread(self._read_loop_main, ())
        self._handlers_done = threading.Event()
        self._handler_ident: int | None = None  # started with the first handler (see _ensure_handler_thread)

    @classmethod
    def connect(cls, path: str | None = None, **kwargs: Any) -> "Client":
        return cls(path, **kwargs)

    def close(self) -> None:
        """Hang up: the daemon drops this client's tasks and non-persistent facts."""
        if self._closed:
            return
        self._closed = True
        if self._direct is not None:
            self._direct.close()
            self._direct = None
        for sock in (self._sock, self._new_sock):
            if sock is None:
                continue
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        self._fail_pending(ConnectionLost("client closed"))
        self._connected.set()  # wake callers waiting for a reconnection
        self._events.put(None)
        self._turns.wake()  # the reader thread, and a caller reading, leave their wait
        me = threading.get_ident()
        if self._reader_ident != me:
            self._reader_done.wait(2.0)
        if self._reader_done.is_set():
            self._turns.close()
        if self._handler_ident is not None and self._handler_ident != me:
            self._handlers_done.wait(2.0)
        if self._manual:
            os.close(self._wake_r)
            os.close(self._wake_w)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def batch(self, calls: list[tuple[str, dict[str, Any]]], *, stop_on_error: bool = True) -> list[Any]:
        """Several calls in one round trip; returns each result, raising the first error."""
        res = self.call("batch", {"calls": [{"method": m, "params": p} for m, p in calls],
                                  "stop_on_error": stop_on_error})["results"]
        out = []
        for item in res:
            if "error" in item:
                raise error_from_reply(item["error"])
            out.append(item["result"])
        return out

    # The paper's names (Table 2, Listing 1) as methods too.
    skb_add_fact = Knowledge.add_fact
    skb_add_fn = Knowledge.add_procedure
    skb_execute_query = Knowledge.execute_query
    rsmgr_register_fn = Upcalls.subscribe

"""The Python client of the COD Resource Manager.

One socket per `Client` to the daemon.  A background reader thread matches
replies to calls by id and queues upcalls; upcall handlers run either on a
handler thread (`handlers="thread"`, the default) or in the caller's own loop
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
import logging
import os
import queue
import socket
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from cod.protocol.framing import MAX_FRAME_BYTES, FrameDecoder, FrameError, encode
from cod.protocol.jsonrpc import PROTOCOL_VERSION, SHUTDOWN_EVENT, loads
from cod.protocol.paths import default_socket_path

from .errors import (
    CodError,
    ConnectionLost,
    NotConnected,
    ProtocolMismatch,
    RMError,
    error_from_reply,
)
from .state import HeldState

log = logging.getLogger("cod.client")

CLIENT_NAME = "cod.client/0.2"
Handler = Callable[[dict[str, Any]], Any]


@dataclass
class _Subscription:
    event: str
    filter: dict[str, Any] | None
    handler: Handler
    server_id: int | None = None


class _Waiter:
    """One call's rendezvous with the reader thread: a bare lock is cheaper than an Event."""

    __slots__ = ("_lock", "reply")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()
        self.reply: dict[str, Any] | None = None

    def set(self, reply: dict[str, Any]) -> None:
        if self.reply is None:
            self.reply = reply
            self._lock.release()

    def wait(self, timeout: float | None) -> bool:
        return self._lock.acquire(timeout=-1 if timeout is None else timeout)


class Client:
    """A connection to the RM.  Thread-safe: calls may come from any thread."""

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
        self._open(self._dial())
        # Threads are started with _thread, which does not wait for the new thread to be
        # scheduled (threading.Thread.start does: ~1 ms of a connect on a busy machine).
        self._reader_done = threading.Event()
        self._reader_ident = _thread.start_new_thread(self._read_loop_main, ())
        self._handlers_done = threading.Event()
        self._handler_ident: int | None = None  # started with the first handler (see _ensure_handler_thread)

    @classmethod
    def connect(cls, path: str | None = None, **kwargs: Any) -> "Client":
        return cls(path, **kwargs)

    # ---- connection ----------------------------------------------------------------------
    def _dial(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
        except OSError as err:
            sock.close()
            raise NotConnected(f"no COD RM answers on {self.path}: {err.strerror or err}") from None
        return sock

    def _open(self, sock: socket.socket, *, ready: bool = True) -> None:
        """Say hello on a fresh socket (synchronously, before the reader thread reads it)."""
        decoder = FrameDecoder(MAX_FRAME_BYTES)
        params: dict[str, Any] = {"version": PROTOCOL_VERSION, "client": CLIENT_NAME}
        if self.app is not None:
            params["app"] = self.app
        try:
            info = self._raw_call(sock, decoder, "hello", params)
        except RMError as err:
            sock.close()
            if err.code == -32001:
                raise ProtocolMismatch(err.message) from None
            raise
        self.app = info["app"]
        self.server_info = info
        self._decoder = decoder
        self._open_direct(info.get("skb"))
        if ready:
            self._sock = sock
            self._connected.set()
        else:
            self._new_sock = sock  # published by _replay once the state is back

    def _raw_call(self, sock: socket.socket, decoder: FrameDecoder, method: str, params: dict[str, Any]) -> Any:
        """A call made while no reader thread owns `sock` (hello and replay); queues upcalls it meets."""
        rid = next(self._ids)
        sock.sendall(encode({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}))
        while True:
            data = sock.recv(1 << 16)
            if not data:
                raise ConnectionLost(f"the RM closed the connection during {method}")
            for body in decoder.feed(data):
                msg = _loads(body)
                if msg.get("id") == rid and ("result" in msg or "error" in msg):
                    if "error" in msg:
                        raise error_from_reply(msg["error"])
                    return msg["result"]
                self._on_message(msg)

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
        me = threading.get_ident()
        if self._reader_ident != me:
            self._reader_done.wait(2.0)
        if self._handler_ident is not None and self._handler_ident != me:
            self._handlers_done.wait(2.0)
        if self._manual:
            os.close(self._wake_r)
            os.close(self._wake_w)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- calls ---------------------------------------------------------------------------
    def call(self, method: str, params: dict[str, Any] | None = None, *, timeout_s: float | None = None) -> Any:
        """Send one request and wait for its result; an error reply raises the matching RMError."""
        if self._closed:
            raise CodError("client is closed")
        timeout = self.call_timeout_s if timeout_s is None else timeout_s
        if not self._connected.is_set() and not self._connected.wait(self.reconnect_timeout_s):
            raise NotConnected(f"the RM on {self.path} did not come back")
        if self._closed:
            raise CodError("client is closed")
        rid = next(self._ids)
        waiter = _Waiter()
        frame = encode({"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}})
        with self._pending_lock:
            self._pending[rid] = waiter
        try:
            with self._send_lock:
                sock = self._sock if self._connected.is_set() else None
                if sock is None:
                    raise ConnectionLost("the connection to the RM was lost; reconnecting")
                sock.sendall(frame)
        except OSError as err:
            with self._pending_lock:
                self._pending.pop(rid, None)
            raise ConnectionLost(f"sending {method}: {err}") from None
        if not waiter.wait(timeout):
            with self._pending_lock:
                self._pending.pop(rid, None)
            raise CodError(f"{method}: no reply within {timeout} s")
        reply = waiter.reply
        assert reply is not None
        if "lost" in reply:
            raise ConnectionLost(f"{method}: {reply['lost']}")
        if "error" in reply:
            raise error_from_reply(reply["error"])
        return reply.get("result")

    def _read_loop_main(self) -> None:
        try:
            self._read_loop()
        finally:
            self._reader_done.set()

    def _ensure_handler_thread(self) -> None:
        """Handlers run on their own thread, started when the first handler is registered."""
        if self._manual or self._handler_ident is not None:
            return
        with self._state_lock:
            if self._handler_ident is None:
                self._handler_ident = _thread.start_new_thread(self._handler_loop, ())

    def _read_loop(self) -> None:
        while not self._closed:
            sock = self._sock
            try:
                data = sock.recv(1 << 18) if sock is not None else b""
            except OSError:
                data = b""
            if data:
                try:
                    bodies = self._decoder.feed(data)
                except FrameError as err:
                    log.error("bad frame from the RM: %s", err)
                    bodies = []
                    data = b""
                for body in bodies:
                    try:
                        self._on_message(_loads(body))
                    except ProtocolMismatch as err:
                        log.error("%s", err)
                if data:
                    continue
            if self._closed:
                return
            self._connected.clear()
            self._fail_pending(ConnectionLost("the RM closed the connection"))
            if not self.reconnect or not self._reconnect():
                self._closed_by_server()
                return

    def _closed_by_server(self) -> None:
        self._connected.set()
        self._closed = True
        self._events.put(None)

    def _on_message(self, msg: dict[str, Any]) -> None:
        if "id" in msg and ("result" in msg or "error" in msg):
            rid = msg["id"]
            with self._pending_lock:
                waiter = self._pending.pop(rid, None) if isinstance(rid, int) else None
            if waiter is not None:
                waiter.set(msg)
            elif rid is None and "error" in msg:
                log.warning("the RM reported: %s", msg["error"].get("message"))
            return
        method = msg.get("method")
        params = msg.get("params") or {}
        if method == SHUTDOWN_EVENT:
            log.info("the RM is shutting down: %s", params.get("reason"))
            return
        self._on_upcall(str(method), params)

    def _fail_pending(self, err: Exception) -> None:
        with self._pending_lock:
            waiters = list(self._pending.values())
            self._pending.clear()
        for waiter in waiters:
            waiter.set({"lost": str(err)})

    # ---- upcalls -------------------------------------------------------------------------
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

    def _remember_allocation(self, alloc: dict[str, Any]) -> None:
        with self._allocation_changed:
            old = self._allocations.get(alloc["task"])
            if old is None or alloc.get("epoch", 0) >= old.get("epoch", 0):
                self._allocations[alloc["task"]] = dict(alloc)
            self._allocation_changed.notify_all()

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

    # ---- reconnection --------------------------------------------------------------------
    def _reconnect(self) -> bool:
        deadline = time.monotonic() + self.reconnect_timeout_s
        delay = 0.02
        old = self._sock
        self._sock = None
        if old is not None:
            old.close()
        while not self._closed and time.monotonic() < deadline:
            try:
                sock = self._dial()
                self._open(sock, ready=False)
                self._replay()
                log.info("reconnected to the RM on %s and replayed this client's state", self.path)
                return True
            except (NotConnected, ConnectionLost, OSError):
                self._connected.clear()
                stale = getattr(self, "_new_sock", None)
                if stale is not None:
                    stale.close()
                    self._new_sock = None
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
        return False

    def _replay(self) -> None:
        sock, decoder = self._new_sock, self._decoder
        with self._state_lock:
            procedures = list(self._held.procedures.values())
            fact_ops = list(self._held.fact_ops)
            tasks = {k: dict(v) for k, v in self._held.tasks.items()}
            subs = list(self._subs.items())
        for text, persistent in procedures:
            self._replay_call(sock, decoder, "add_procedure", {"text": text, "persistent": persistent})
        for op in fact_ops:
            if op.kind == "add":
                self._replay_call(sock, decoder, "add_facts",
                                  {"facts": op.texts, "scope": op.scope, "persistent": op.persistent})
            else:
                self._replay_call(sock, decoder, "remove_facts", {"patterns": op.texts, "scope": op.scope})
        for local_id, sub in subs:
            res = self._replay_call(sock, decoder, "subscribe", {"event": sub.event, "filter": sub.filter or {}})
            if res is not None:
                sub.server_id = res["subscription"]
        for name, params in tasks.items():
            res = self._replay_call(sock, decoder, "register_task", params)
            with self._state_lock:
                if res is None:
                    self._held.tasks.pop(name, None)
                else:
                    self._remember_allocation(res["allocation"])
        self._sock = sock
        self._connected.set()

    def _replay_call(self, sock: socket.socket, decoder: FrameDecoder, method: str, params: dict[str, Any]) -> Any:
        try:
            return self._raw_call(sock, decoder, method, params)
        except RMError as err:
            log.warning("replaying %s after reconnection failed: %s", method, err)
            return None

    # ---- the API -------------------------------------------------------------------------
    def add_fact(self, fact: str, *, persistent: bool = False) -> int:
        return self.add_facts([fact], persistent=persistent)

    def add_facts(self, facts: list[str], *, scope: str = "app", persistent: bool = False) -> int:
        """Add facts (all or none) to this application's namespace, or with scope="system" (root only)."""
        facts = list(facts)
        n = self.call("add_facts", {"facts": facts, "scope": scope, "persistent": persistent})["added"]
        with self._state_lock:
            self._held.added(facts, scope, persistent)
        return n

    def remove_facts(self, patterns: str | list[str], *, scope: str = "app") -> int:
        """Retract every fact matching the pattern(s), e.g. "db_rtime(_)"; returns how many went."""
        pats = [patterns] if isinstance(patterns, str) else list(patterns)
        n = self.call("remove_facts", {"patterns": pats, "scope": scope})["removed"]
        with self._state_lock:
            self._held.removed(pats, scope)
        return n

    def add_procedure(self, text: str, *, persistent: bool = False) -> list[str]:
        """Add clauses (a stored procedure) to this application; returns ["name/arity", ...]."""
        preds = self.call("add_procedure", {"text": text, "persistent": persistent})["predicates"]
        with self._state_lock:
            self._held.procedure(text, persistent, preds)
        return preds

    def execute_query(self, goal: str, *, all_solutions: bool = True, timeout_s: float | None = None,
                      max_solutions: int | None = None) -> list[dict[str, Any]]:
        """Run a goal; one dict per solution, variable name to value."""
        params: dict[str, Any] = {"goal": goal}
        if not all_solutions:
            params["all_solutions"] = False
        if timeout_s is not None:
            params["timeout_s"] = timeout_s
        if max_solutions is not None:
            params["max_solutions"] = max_solutions
        direct = self._direct or self._reopen_direct()
        if direct is not None and direct.lock.acquire(blocking=False):
            # The calling thread talks to the SKB itself: one hop, no thread hand-off.
            # (A second concurrent caller takes the daemon's road instead of waiting.)
            try:
                return direct.call("execute_query", params, self.call_timeout_s)["solutions"]
            except (OSError, ConnectionLost, ProtocolMismatch) as err:
                log.info("direct query channel lost (%s); querying through the RM", err)
                self._drop_direct(direct)
            except RMError as err:
                if err.code != -32010:
                    raise
                log.info("the direct query channel's capability was refused; querying through the RM")
                self._drop_direct(direct)
            finally:
                direct.lock.release()
        return self.call("execute_query", params)["solutions"]

    @property
    def direct(self) -> bool:
        """Whether queries currently take the direct channel to the SKB."""
        return self._direct is not None

    def _open_direct(self, offer: dict[str, Any] | None) -> None:
        old, self._direct = self._direct, None
        if old is not None:
            old.close()
        if not offer or not self.direct_queries:
            return
        try:
            self._direct = _DirectChannel(str(offer["socket"]), str(offer["token"]), self.call_timeout_s)
        except (OSError, CodError, KeyError) as err:
            log.info("no direct query channel (%s); queries go through the RM", err)

    def _drop_direct(self, direct: "_DirectChannel") -> None:
        if self._direct is direct:
            self._direct = None
            self._direct_retry_at = time.monotonic() + 0.5
        direct.close()

    def _reopen_direct(self) -> "_DirectChannel | None":
        """After the direct channel was lost (the SKB restarted), try it again now and then."""
        offer = self.server_info.get("skb")
        if not offer or not self.direct_queries or time.monotonic() < self._direct_retry_at:
            return None
        with self._state_lock:
            if self._direct is None:
                self._direct_retry_at = time.monotonic() + 0.5
                self._open_direct(offer)
        return self._direct

    def register_task(self, name: str, *, pid: int | None = None, min_cores: int = 1,
                      max_cores: int | None = None, facts: list[str] | None = None,
                      procedures: list[str] | None = None, on_allocation: Handler | None = None,
                      **properties: Any) -> dict[str, Any]:
        """Register a task (this process unless `pid`); `facts` and `procedures` go in the same call.

        Returns the daemon's reply, whose "allocation" is the task's first allocation.
        `on_allocation(event)` is called for each allocation_changed upcall of the task.
        """
        props = {"min_cores": min_cores, **properties}
        if max_cores is not None:
            props["max_cores"] = max_cores
        params: dict[str, Any] = {"name": name, "properties": props}
        if pid is not None:
            params["pid"] = pid
        if facts:
            params["facts"] = list(facts)
        if procedures:
            params["procedures"] = list(procedures)
        with self._state_lock:
            self._task_handlers[name] = on_allocation
        if on_allocation is not None:
            self._ensure_handler_thread()
        result = self.call("register_task", params)
        with self._state_lock:
            replay = {"name": name, "properties": props}
            if pid is not None:
                replay["pid"] = pid
            self._held.tasks[name] = replay
            if facts:
                self._held.added(list(facts), "app", False)
            for text in procedures or ():
                # Each text's predicates are not echoed by register_task: key it by its own text.
                self._held.procedure(text, False, [f"text:{text}"])
        self._remember_allocation(result["allocation"])
        return result

    def update_task(self, name: str | None = None, **properties: Any) -> dict[str, Any]:
        params: dict[str, Any] = {"properties": properties}
        if name is not None:
            params["task"] = name
        result = self.call("update_task", params)
        with self._state_lock:
            task = self._held.tasks.get(result["task"])
            if task is not None:
                task["properties"].update(properties)
        return result

    def deregister_task(self, name: str | None = None) -> None:
        result = self.call("deregister_task", {} if name is None else {"task": name})
        with self._state_lock:
            self._held.tasks.pop(result["task"], None)
            self._task_handlers.pop(result["task"], None)
            self._allocations.pop(result["task"], None)

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

    def request_allocation(self, task: str | None = None) -> dict[str, Any]:
        """Recompute the global allocation now; returns this task's: epoch, cores, numa_nodes, memory_nodes."""
        result = self.call("request_allocation", {} if task is None else {"task": task})
        self._remember_allocation(result)
        return result

    def ack_allocation(self, *args: Any, task: str | None = None, epoch: int | None = None) -> list[int]:
        """Tell the RM `task` (None: this connection's only task) has moved off the cores taken from
        it up to `epoch`; returns the CPUs released.  The order is C's, ``cod_ack_allocation(c, task,
        epoch)``: ``ack_allocation("scan", 7)``, ``ack_allocation(epoch=7)``.  The old order, epoch
        first (``ack_allocation(7)``, ``ack_allocation(7, task="scan")``), still works, with a
        DeprecationWarning: an int first is an epoch, since a task name is a string."""
        task, epoch = _ack_arguments(args, task, epoch)
        params: dict[str, Any] = {"epoch": epoch}
        if task is not None:
            params["task"] = task
        return self.call("ack_allocation", params)["released"]

    def allocation(self, task: str | None = None) -> dict[str, Any] | None:
        """The latest allocation this client heard of for `task` (its only task by default)."""
        with self._allocation_changed:
            if task is None:
                if len(self._allocations) != 1:
                    return None if not self._allocations else self._allocations[sorted(self._allocations)[0]]
                return next(iter(self._allocations.values()))
            return self._allocations.get(task)

    def wait_allocation(self, task: str, min_epoch: int, timeout_s: float = 5.0) -> dict[str, Any]:
        """Block until an allocation of `task` with epoch >= `min_epoch` has arrived."""
        with self._allocation_changed:
            ok = self._allocation_changed.wait_for(
                lambda: self._allocations.get(task, {}).get("epoch", -1) >= min_epoch, timeout_s)
            if not ok:
                raise CodError(f"no allocation of {task} with epoch >= {min_epoch} within {timeout_s} s")
            return dict(self._allocations[task])

    def get_allocation(self, task: str | None = None) -> dict[str, Any]:
        return self.call("get_allocation", {} if task is None else {"task": task})

    def list_tasks(self) -> list[dict[str, Any]]:
        return self.call("list_tasks")["tasks"]

    # ---- elastic groups: processes that do not speak COD (docs/elastic.md) ----------------
    def register_unmanaged(self, *, pid: int | list[int] | None = None, cgroup: str | None = None,
                           name: str | None = None, mode: str | None = None, min_cores: int | None = None,
                           max_cores: int | None = None, **settings: Any) -> dict[str, Any]:
        """Let the daemon give a process group (pids and their children, or a cgroup) cores as its
        load asks (the elastic Petri net).  The group outlives this connection: it stays until its
        processes are gone or `deregister_unmanaged` removes it.  Returns the group's description."""
        params: dict[str, Any] = {k: v for k, v in (("name", name), ("cgroup", cgroup), ("mode", mode),
                                                     ("min_cores", min_cores), ("max_cores", max_cores)) if v is not None}
        if isinstance(pid, list):
            params["pids"] = pid
        elif pid is not None:
            params["pid"] = pid
        params.update(settings)
        return self.call("register_unmanaged", params)

    def deregister_unmanaged(self, *, name: str | None = None, pid: int | None = None,
                             cgroup: str | None = None) -> dict[str, Any]:
        """Stop managing a group (by name, by one of its pids, or by its cgroup); its processes get
        their CPU affinity back.  Returns its last description and the periods the daemon kept."""
        params = {k: v for k, v in (("name", name), ("pid", pid), ("cgroup", cgroup)) if v is not None}
        return self.call("deregister_unmanaged", params)

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
    skb_add_fact = add_fact
    skb_add_fn = add_procedure
    skb_execute_query = execute_query
    rsmgr_register_fn = subscribe


class _DirectChannel:
    """The direct query socket to the SKB server: one request at a time, read by its caller."""

    def __init__(self, path: str, token: str, timeout: float | None) -> None:
        self.lock = threading.Lock()
        self._ids = itertools.count(1)
        self._decoder = FrameDecoder(MAX_FRAME_BYTES)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(path)
            info = self.call("hello", {"version": PROTOCOL_VERSION, "token": token}, timeout)
        except BaseException:
            self._sock.close()
            raise
        self.app = info.get("app")

    def call(self, method: str, params: dict[str, Any], timeout: float | None) -> Any:
        rid = next(self._ids)
        self._sock.settimeout(timeout)
        try:
            self._sock.sendall(encode({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}))
            while True:
                data = self._sock.recv(1 << 18)
                if not data:
                    raise ConnectionLost("the SKB closed the direct channel")
                for body in self._decoder.feed(data):
                    msg = _loads(body)
                    if msg.get("id") == rid:
                        if "error" in msg:
                            raise error_from_reply(msg["error"])
                        return msg.get("result")
        except socket.timeout:
            raise ConnectionLost(f"{method}: no answer on the direct channel within {timeout} s") from None
        except FrameError as err:
            raise ProtocolMismatch(f"bad frame on the direct channel: {err}") from None

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass


def _ack_arguments(args: tuple[Any, ...], task: Any, epoch: Any) -> tuple[str | None, int]:
    """(task, epoch) of ack_allocation(*args, task=, epoch=): (task, epoch) positionally as C's, or the
    deprecated order, epoch first (an int first: a task name is a string)."""
    if len(args) > 2:
        raise TypeError(f"ack_allocation() takes a task and an epoch, {len(args)} arguments given")
    named = {"task": task, "epoch": epoch}
    if args and isinstance(args[0], int) and not isinstance(args[0], bool):
        warnings.warn("ack_allocation(epoch, task): the order is now (task, epoch), as C's cod_ack_allocation; "
                      "write ack_allocation(task, epoch) or ack_allocation(epoch=N)", DeprecationWarning, stacklevel=3)
        args = (args[1], args[0]) if len(args) == 2 else (None, args[0])
        names = ("task", "epoch")
    else:
        names = ("task", "epoch")[:len(args)]
    for name, value in zip(names, args):
        if named[name] is not None and value is not None:
            raise TypeError(f"ack_allocation() got two values for {name}")
        named[name] = value if value is not None else named[name]
    task, epoch = named["task"], named["epoch"]
    if epoch is None:
        raise TypeError("ack_allocation() needs the epoch: ack_allocation(task, epoch) or ack_allocation(epoch=N)")
    if task is not None and not isinstance(task, str):
        raise TypeError(f"ack_allocation(): task must be a task name (str) or None, not {type(task).__name__}")
    if not isinstance(epoch, int) or isinstance(epoch, bool):
        raise TypeError(f"ack_allocation(): epoch must be an int, not {type(epoch).__name__}")
    return task, epoch


def _loads(body: bytes) -> dict[str, Any]:
    try:
        msg = loads(body)
    except ValueError as err:
        raise ProtocolMismatch(f"the RM sent a frame that is not JSON: {err}") from None
    if not isinstance(msg, dict):
        raise ProtocolMismatch("the RM sent a frame that is not a JSON object")
    return msg

"""The client's connection to the daemon: the socket, hello, calls matched to replies by id.

A call sends one request and waits for the reply with its id: it reads the socket itself while no
other thread does, else it waits to be handed its reply or the turn to read (:mod:`.reading`).
Upcalls met on the way go to :mod:`.upcalls`.  When the daemon hangs up, pending calls fail with
ConnectionLost and :mod:`.reconnect` dials again.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from cod.protocol.framing import MAX_FRAME_BYTES, FrameDecoder, encode
from cod.protocol.jsonrpc import PROTOCOL_VERSION, SHUTDOWN_EVENT, loads
from cod.protocol.paths import no_daemon

from .errors import (CallTimeout, CodError, ConnectionLost, NotConnected, ProtocolMismatch, ReplyLost, RMError,
                     error_from_reply)
from .parts import ClientParts, _Waiter, log

CLIENT_NAME = "cod.client/0.2"


class Transport(ClientParts):
    """The connection part of `Client`: dialling, hello, calls, handing on what arrives."""

    def _dial(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
        except OSError as err:
            sock.close()
            raise NotConnected(no_daemon(self.path, err.strerror or str(err))) from None
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
        self._broken = False
        # The direct channel of an earlier connection goes; the new one opens at its first use
        # (DirectQueries.direct, execute_query): a client that only registers tasks never pays
        # for its connection and hello (docs/design-rm.md, "Where the microseconds go").
        self._open_direct(None)
        self._direct_retry_at = 0.0
        if ready:
            self._turns.attach(sock)
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
        leading = self._turns.take(rid, waiter)  # the read turn before the reply can come, when nobody reads
        try:
            with self._send_lock:
                sock = self._sock if self._connected.is_set() else None
                if sock is None:
                    raise ConnectionLost("the connection to the RM was lost; reconnecting")
                sock.sendall(frame)
        except (OSError, ConnectionLost) as err:
            self._turns.abandon(rid, waiter)
            if isinstance(err, ConnectionLost):
                raise
            raise ConnectionLost(f"sending {method}: {err}") from None
        reply = self._await_reply(rid, waiter, None if timeout is None else time.monotonic() + timeout, leading)
        if reply is None:
            raise CallTimeout(f"{method}: no reply within {timeout} s")
        if "lost" in reply:
            raise ReplyLost(f"{method}: {reply['lost']}")
        if "error" in reply:
            raise error_from_reply(reply["error"])
        return reply.get("result")

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


def _loads(body: bytes) -> dict[str, Any]:
    try:
        msg = loads(body)
    except ValueError as err:
        raise ProtocolMismatch(f"the RM sent a frame that is not JSON: {err}") from None
    if not isinstance(msg, dict):
        raise ProtocolMismatch("the RM sent a frame that is not a JSON object")
    return msg

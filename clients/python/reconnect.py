"""Reconnection: when the daemon restarts, dial again and put back what this client held.

What is held (facts, procedures, tasks, subscriptions) is compacted in :mod:`.state`; the replay
runs on the new socket before it is published, so no call meets a daemon without this client's state.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from cod.protocol.framing import FrameDecoder
from cod.protocol.jsonrpc import OUTCOME_UNKNOWN, REQUEST_KEY, WRITE_METHODS

from .errors import ConnectionLost, NotConnected, RMError
from .knowledge import new_request_key
from .parts import ClientParts, log


class Reconnection(ClientParts):
    """The reconnection part of `Client`."""

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
        self._turns.attach(sock)
        self._sock = sock
        self._connected.set()

    def _replay_call(self, sock: socket.socket, decoder: FrameDecoder, method: str, params: dict[str, Any]) -> Any:
        """One call of the replay.  A write goes with a request key, and one whose outcome is not
        known (the SKB was slow to answer) is asked again with that key until it is, within the
        reconnection's time: never dropped as failed when it may have taken effect, never applied twice."""
        keyed = {**params, REQUEST_KEY: new_request_key()} if method in WRITE_METHODS else params
        deadline = time.monotonic() + self.reconnect_timeout_s
        pause = 0.05
        while True:
            try:
                return self._raw_call(sock, decoder, method, keyed)
            except RMError as err:
                if err.code == OUTCOME_UNKNOWN and method in WRITE_METHODS and time.monotonic() + pause < deadline:
                    log.info("replaying %s: its outcome is not known yet; asking again with its key", method)
                    time.sleep(pause)  # a back-off: the daemon itself waits for the outcome before answering
                    pause = min(pause * 2, 1.0)
                    continue
                log.warning("replaying %s after reconnection failed: %s", method, err)
                return None

"""Reconnection: when the daemon restarts, dial again and put back what this client held.

What is held (facts, procedures, tasks, subscriptions) is compacted in :mod:`.state`; the replay
runs on the new socket before it is published, so no call meets a daemon without this client's state.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from cod.protocol.framing import FrameDecoder

from .errors import ConnectionLost, NotConnected, RMError
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
        try:
            return self._raw_call(sock, decoder, method, params)
        except RMError as err:
            log.warning("replaying %s after reconnection failed: %s", method, err)
            return None

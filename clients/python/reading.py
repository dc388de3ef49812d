"""Reading the daemon's socket: by the calling thread while it waits for its reply, else by the reader thread.

A call through the daemon sends its request, then takes the read turn if nobody reads
(:mod:`.turns`) and reads frames itself until its reply comes.  Every other frame it meets is handed
on as the reader thread would hand it: replies to the waiters of other calls, upcalls to the
handler queue.  So a single caller pays no thread hand-off, and upcalls still arrive while it
waits.  Callers that find the turn taken wait to be woken by their reply or handed the turn.
The reader thread reads while no caller does (an application that does not call still gets its
upcalls), and it alone mends a lost connection (:mod:`.reconnect`).
"""

from __future__ import annotations

import socket
import time
from typing import Any

from cod.protocol.framing import FrameError

from .errors import ConnectionLost, ProtocolMismatch
from .parts import ClientParts, _Waiter, log
from .transport import _loads


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


class Reading(ClientParts):
    """The read side of `Client`: waiting for a reply, reading as the caller, the reader thread."""

    def _await_reply(self, rid: int, waiter: _Waiter, deadline: float | None,
                     leading: bool = False) -> dict[str, Any] | None:
        """The reply to call `rid` (sent already), or None when `deadline` passed first.  `leading`:
        the caller's bid before it sent won the read turn (else it bids again: the reader may be done)."""
        if not (leading or self._turns.take(rid, waiter)):
            if not waiter.wait(_left(deadline)):
                self._turns.abandon(rid, waiter)
                return None
            if not waiter.promoted:
                return waiter.reply
        return self._read_as_caller(rid, waiter, deadline)

    def _read_as_caller(self, rid: int, waiter: _Waiter, deadline: float | None) -> dict[str, Any] | None:
        """Holding the read turn: read frames until this call's reply comes, then pass the turn on."""
        try:
            while waiter.reply is None:
                left = _left(deadline)
                if left == 0.0 or not self._turns.wait_readable(left):
                    with self._pending_lock:
                        self._pending.pop(rid, None)
                    return waiter.reply  # None, unless the client closed meanwhile
                if not self._read_chunk():
                    self._lost(ConnectionLost("the RM closed the connection"))
                    if not self._closed:
                        self._turns.wake()  # the reader thread reconnects (or closes the client)
            return waiter.reply
        finally:
            self._turns.pass_on()

    def _read_chunk(self) -> bool:
        """As the holder of the read turn: read what the socket holds, hand each frame on.

        False when the connection is gone (end of stream, an error, a bad frame, the client closed)."""
        sock = self._sock
        if self._broken or self._closed or sock is None:
            return False
        try:
            data: bytes | None = sock.recv(1 << 18, socket.MSG_DONTWAIT)
        except BlockingIOError:
            data = None  # another thread's wake-up, or the data went to an earlier holder
        except OSError:
            data = b""
        finally:
            self._turns.rearm()
        if data is None:
            return True
        if not data:
            return False
        try:
            bodies = self._decoder.feed(data)
        except FrameError as err:
            log.error("bad frame from the RM: %s", err)
            self._broken = True
            return False
        for body in bodies:
            try:
                self._on_message(_loads(body))
            except ProtocolMismatch as err:
                log.error("%s", err)
        return True

    def _lost(self, err: Exception) -> None:
        """The connection is gone: new calls wait for a reconnection, pending ones fail."""
        if not self._closed:
            self._connected.clear()
        self._fail_pending(err)

    def _read_loop_main(self) -> None:
        try:
            self._read_loop()
        finally:
            self._reader_done.set()

    def _read_loop(self) -> None:
        """The reader thread: read whenever the socket is readable and no caller reads it."""
        turns = self._turns
        while not self._closed:
            if not turns.reader_queue_if_busy():
                turns.wait_readable(None)
                if self._closed:
                    return
                if not turns.reader_take():
                    turns.rearm()  # the event is the reading caller's
                    turns.reader_wait()
            try:
                turns.drain_wake()
                if self._read_chunk() or self._closed:
                    continue
                self._lost(ConnectionLost("the RM closed the connection"))
                self._broken = False
                if not self.reconnect or not self._reconnect():
                    self._closed_by_server()
                    return
            finally:
                turns.pass_on()

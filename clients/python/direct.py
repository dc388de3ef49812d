"""The direct query channel: a second socket straight to the SKB server (docs/protocol.md).

The daemon offers it in its hello reply; the client opens it at its first query (or when asked
whether it has one), and the calling thread sends a query and reads its answer itself.  When it fails, queries go through the daemon, and the channel is tried again now and then.
"""

from __future__ import annotations

import itertools
import socket
import struct
import threading
import time
from typing import Any

from cod.protocol.framing import MAX_FRAME_BYTES, FrameDecoder, FrameError, encode
from cod.protocol.jsonrpc import PROTOCOL_VERSION

from .errors import CodError, ConnectionLost, ProtocolMismatch, error_from_reply
from .parts import ClientParts, log
from .transport import _loads


class DirectQueries(ClientParts):
    """The direct channel part of `Client`: opening, dropping and reopening it."""

    @property
    def direct(self) -> bool:
        """Whether queries currently take the direct channel to the SKB (opened at its first use)."""
        return (self._direct or self._reopen_direct()) is not None

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

    def _drop_direct(self, direct: "_DirectChannel | None") -> None:
        if self._direct is direct:
            self._direct = None
            self._direct_retry_at = time.monotonic() + 0.5
        if direct is not None:  # None: not opened yet
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


class _DirectChannel:
    """The direct query socket to the SKB server: one request at a time, read by its caller.

    The socket blocks, under the kernel's own timeouts (SO_RCVTIMEO, SO_SNDTIMEO): a Python
    socket with a timeout polls before every send and receive and sets its mode at every
    `settimeout`, five system calls a query where a blocking socket makes two, as the floor's
    echo does (bench/echo_floor.py)."""

    def __init__(self, path: str, token: str, timeout: float | None) -> None:
        self.lock = threading.Lock()
        self._ids = itertools.count(1)
        self._decoder = FrameDecoder(MAX_FRAME_BYTES)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        try:
            self._sock.connect(path)
            self._sock.settimeout(None)
            self._timeout: float | None = -1.0  # none set yet
            info = self.call("hello", {"version": PROTOCOL_VERSION, "token": token}, timeout)
        except BaseException:
            self._sock.close()
            raise
        self.app = info.get("app")

    def _bound_waits(self, timeout: float | None) -> None:
        """Each send and receive waits at most timeout seconds (None: without bound)."""
        if timeout == self._timeout:
            return
        usec = 0 if timeout is None else max(1, round(timeout * 1e6))  # 0 is 'no bound' to the kernel
        packed = struct.pack("@ll", usec // 1_000_000, usec % 1_000_000)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, packed)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, packed)
        self._timeout = timeout

    def call(self, method: str, params: dict[str, Any], timeout: float | None) -> Any:
        rid = next(self._ids)
        self._bound_waits(timeout)
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
        except BlockingIOError:  # a kernel timeout: EAGAIN from a blocking socket
            raise ConnectionLost(f"{method}: no answer on the direct channel within {timeout} s") from None
        except FrameError as err:
            raise ProtocolMismatch(f"bad frame on the direct channel: {err}") from None

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass

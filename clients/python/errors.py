"""Exceptions of the COD client: one class per kind of failure, each carrying the server's code and message."""

from __future__ import annotations

from typing import Any

from cod.protocol.errors import CodError


class ConnectionLost(CodError):
    """The daemon went away while a call was in flight (the client reconnects by itself if allowed)."""


class ReplyLost(ConnectionLost):
    """The connection was lost after the request was sent: the daemon may have run it."""


class CallTimeout(CodError):
    """No reply came within the call's timeout (`call_timeout_s`): the daemon may still run the request."""


class NotConnected(CodError):
    """No daemon answers on the socket (or it did not come back within the reconnect timeout)."""


class ProtocolMismatch(CodError):
    """The daemon speaks another protocol version or sent something that is not a frame."""


class RMError(CodError):
    """An error reply from the daemon: `code`, `message` and `data` exactly as sent."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{message} (code {code})")
        self.code = code
        self.message = message
        self.data = data


class InvalidRequest(RMError):
    """The daemon could not read the request (-32700, -32600, -32601, -32602)."""


class PermissionDenied(RMError):
    """-32010: the peer may not do this (another user's process, system facts without root)."""


class NotFound(RMError):
    """-32020: no such task, process or subscription."""


class AlreadyExists(RMError):
    """-32021: a task of that name is registered already."""


class AdmissionRefused(RMError):
    """-32030: not enough cores for min_cores; `data` has `requested` and `free`."""

    @property
    def requested(self) -> int | None:
        return (self.data or {}).get("requested")

    @property
    def free(self) -> int | None:
        return (self.data or {}).get("free")


class KnowledgeBaseError(RMError):
    """-32040..-32053: the knowledge base refused or failed the request; `skb_code` names the kind."""

    @property
    def skb_code(self) -> str | None:
        return (self.data or {}).get("skb_code")


class QueryTimeout(KnowledgeBaseError):
    """-32042: the query ran past its time limit."""


class QueryCancelled(KnowledgeBaseError):
    """-32053: the query was stopped by a ``cancel`` call of its own client."""


class UnsafeGoal(KnowledgeBaseError):
    """-32041: the goal calls something the sandbox does not allow."""


class QuotaExceeded(RMError):
    """-32031: the application or its uid would hold more than its quota (facts, procedures, subscriptions)."""


class OutcomeUnknown(RMError):
    """-32080, or a write whose reply did not come (a call timeout, a connection lost after sending):
    the write may or may not take effect.  It was sent with `request_key`; `Client.retry(err)` sends
    it again with that key, and gets its first outcome instead of writing twice while the daemon
    remembers the key (docs/protocol.md, "Write outcomes")."""

    method: str | None = None
    params: dict[str, Any] | None = None  # as sent, request_key included

    @property
    def request_key(self) -> str | None:
        key = (self.params or {}).get("request_key") or (self.data or {}).get("request_key")
        return key if isinstance(key, str) else None


class ShuttingDown(RMError):
    """-32060: the daemon is stopping."""


class TooBusy(RMError):
    """-32070: the daemon refuses the connection (too many connections, or none left for this uid)."""


class TimedOut(RMError):
    """-32071: the peer was too slow (no hello in time, a frame not completed in time)."""


_BY_CODE: dict[int, type[RMError]] = {
    -32700: InvalidRequest, -32600: InvalidRequest, -32601: InvalidRequest, -32602: InvalidRequest,
    -32010: PermissionDenied, -32020: NotFound, -32021: AlreadyExists, -32030: AdmissionRefused,
    -32031: QuotaExceeded, -32042: QueryTimeout, -32041: UnsafeGoal, -32052: QuotaExceeded,
    -32053: QueryCancelled,
    -32060: ShuttingDown, -32070: TooBusy, -32071: TimedOut, -32080: OutcomeUnknown,
}


def error_from_reply(error: Any) -> RMError:
    """The exception for a JSON-RPC error object."""
    if not isinstance(error, dict):
        return RMError(-32603, f"malformed error reply: {error!r}")
    code = error.get("code")
    message = str(error.get("message", ""))
    data = error.get("data")
    if not isinstance(code, int):
        return RMError(-32603, f"malformed error reply: {error!r}", data)
    cls = _BY_CODE.get(code)
    if cls is None:
        cls = KnowledgeBaseError if -32059 <= code <= -32040 else RMError
    return cls(code, message, data)

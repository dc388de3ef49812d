"""Exceptions of the COD client: one class per kind of failure, each carrying the server's code and message."""

from __future__ import annotations

from typing import Any


class CODError(Exception):
    """Base class of every error the client raises."""


class ConnectionLost(CODError):
    """The daemon went away while a call was in flight (the client reconnects by itself if allowed)."""


class NotConnected(CODError):
    """No daemon answers on the socket (or it did not come back within the reconnect timeout)."""


class ProtocolMismatch(CODError):
    """The daemon speaks another protocol version or sent something that is not a frame."""


class RMError(CODError):
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


class SKBError(RMError):
    """-32040..-32051: the knowledge base refused or failed the request; `skb_code` names the kind."""

    @property
    def skb_code(self) -> str | None:
        return (self.data or {}).get("skb_code")


class QueryTimeout(SKBError):
    """-32042: the query ran past its time limit."""


class UnsafeGoal(SKBError):
    """-32041: the goal calls something the sandbox does not allow."""


class ShuttingDown(RMError):
    """-32060: the daemon is stopping."""


def error_from_reply(error: Any) -> RMError:
    """The exception for a JSON-RPC error object."""
    if not isinstance(error, dict):
        return RMError(-32603, f"malformed error reply: {error!r}")
    code = error.get("code")
    message = str(error.get("message", ""))
    data = error.get("data")
    if not isinstance(code, int):
        return RMError(-32603, f"malformed error reply: {error!r}", data)
    if code in (-32700, -32600, -32601, -32602):
        cls: type[RMError] = InvalidRequest
    elif code == -32010:
        cls = PermissionDenied
    elif code == -32020:
        cls = NotFound
    elif code == -32021:
        cls = AlreadyExists
    elif code == -32030:
        cls = AdmissionRefused
    elif code == -32042:
        cls = QueryTimeout
    elif code == -32041:
        cls = UnsafeGoal
    elif -32051 <= code <= -32040:
        cls = SKBError
    elif code == -32060:
        cls = ShuttingDown
    else:
        cls = RMError
    return cls(code, message, data)

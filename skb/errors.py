"""Errors raised by the SKB, one type with a stable code (see docs/skb-schema.md)."""

from __future__ import annotations

import asyncio
from typing import Any

from cod.protocol.errors import CodError
from cod.protocol.jsonrpc import SKB_CODES

# Codes the engine reports; clients switch on these, not on messages.  The
# order of SKB_CODES gives each its number on the wire (cod.protocol.jsonrpc).
CODES = frozenset(SKB_CODES) | {"failed"}


class SKBError(CodError):
    """An SKB operation failed.  ``code`` is one of :data:`CODES`."""

    def __init__(self, code: str, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.data = data or {}

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "data": self.data}


class OutcomeUnknown(SKBError):
    """A write the engine did not answer in time: it may still be applied.

    Its code stays ``timeout`` for callers that treat it as any time-out; ``outcome`` is the
    request's own future, which settles when the truth is known: the write's result when the
    engine answers after all, or an SKBError when it will never be applied (the engine was
    restarted without it: a write is journalled only once the engine answered it)."""

    def __init__(self, message: str, outcome: "asyncio.Future[Any]") -> None:
        super().__init__("timeout", message)
        self.outcome = outcome

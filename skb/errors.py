"""Errors raised by the SKB, one type with a stable code (see docs/skb-schema.md)."""

from __future__ import annotations

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

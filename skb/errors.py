"""Errors raised by the SKB, one type with a stable code (see docs/skb-schema.md)."""

from __future__ import annotations

from typing import Any

# Codes the engine reports; clients switch on these, not on messages.
CODES = frozenset(
    {
        "syntax_error",  # a fact, clause or goal does not parse (data: line, column)
        "unsafe",  # rejected by the sandbox (data: predicate)
        "timeout",  # the query ran past its time limit
        "resource",  # inference or memory limit reached
        "existence",  # unknown procedure
        "permission",  # redefining a system/library predicate, writing another namespace
        "type",
        "domain",
        "instantiation",
        "evaluation",
        "failed",
        "invalid",  # bad arguments caught on the Python side
        "engine",  # the engine itself failed (and was restarted)
    }
)


class SKBError(Exception):
    """An SKB operation failed.  ``code`` is one of :data:`CODES`."""

    def __init__(self, code: str, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.data = data or {}

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "data": self.data}

"""Errors shared by the `cod` subcommands."""

from __future__ import annotations

from cod.protocol.errors import CodError


class UserError(CodError):
    """An error caused by the user's input; printed as one line, no traceback."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status

"""Errors shared by the `cod` subcommands."""


class UserError(Exception):
    """An error caused by the user's input; printed as one line, no traceback."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status

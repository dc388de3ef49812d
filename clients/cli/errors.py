"""Errors shared by the `cod` subcommands, and the exit statuses every subcommand uses."""

from __future__ import annotations

from enum import IntEnum

from cod.protocol.errors import CodError


class ExitStatus(IntEnum):
    """The exit statuses of every `cod` subcommand (the README's table is checked against these).

    A script of `cod shell` exits with the worst (highest) status of its statements."""

    OK = 0
    NOT_FOUND = 1  # it ran and found nothing: a query without a solution, no such task or group
    BAD_INPUT = 2  # the command line, a file, a machine name or a goal is wrong (argparse's usage errors too)
    UNREACHABLE = 3  # no COD daemon answers on the socket
    DOES_NOT_FIT = 4  # the plan does not fit the machine (it is still printed)
    FAILED = 5  # anything else at run time: the SKB engine stopped, the kernel or the daemon refused


# What each status means, in the README's words (tests/clients/cli/test_cli_exit_codes.py compares the two).
MEANING = {
    ExitStatus.OK: "done",
    ExitStatus.NOT_FOUND: "nothing found: a query without a solution, no such task or group",
    ExitStatus.BAD_INPUT: "bad input: the command line, a file, a machine name or a goal",
    ExitStatus.UNREACHABLE: "no COD daemon answers on the socket",
    ExitStatus.DOES_NOT_FIT: "the plan does not fit the machine (it is still printed)",
    ExitStatus.FAILED: "anything else failed at run time (the SKB engine, the kernel, the daemon refused)",
}


class UserError(CodError):
    """An error caused by the user's input; printed as one line, no traceback."""

    def __init__(self, message: str, status: ExitStatus = ExitStatus.BAD_INPUT) -> None:
        super().__init__(message)
        self.status = status


def daemon_error_status(err: CodError) -> ExitStatus:
    """The exit status for what the daemon (or the way to it) answered: not found, bad input,
    unreachable, or a failure."""
    from cod.client import errors as client_errors  # not at start: `cod facts` needs no client

    if isinstance(err, client_errors.NotConnected):
        return ExitStatus.UNREACHABLE
    if isinstance(err, client_errors.NotFound):
        return ExitStatus.NOT_FOUND
    if isinstance(err, (client_errors.InvalidRequest, client_errors.KnowledgeBaseError)):
        return ExitStatus.BAD_INPUT
    return ExitStatus.FAILED

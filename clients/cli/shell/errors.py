"""Every failure the shell can meet, told as a sentence a person can act on.

Errors come from three places: the embedded SKB (:class:`cod.skb.SKBError`),
the daemon (:class:`cod.client.RMError` and its kinds, whose SKB errors carry
``data.skb_code``), and the connection itself (:class:`cod.client.CodError`).
:func:`describe` turns any of them into a :class:`Problem`: a kind, one
sentence, and extra lines such as the caret under a syntax error's column.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cod.client import errors as client_errors
from cod.protocol.errors import CodError
from cod.skb import SKBError as EngineError

from ..errors import ExitStatus

# Exit statuses of `cod shell` in scripts: those of every subcommand (cod.cli.errors.ExitStatus).
STATUS_OK = ExitStatus.OK
STATUS_FALSE = ExitStatus.NOT_FOUND  # a query had no answer (the top level's `false.`)
STATUS_ERROR = ExitStatus.BAD_INPUT  # a statement was refused (syntax, sandbox, a bad command or argument)
# The problems that are not the statement's fault, by kind.
STATUS_OF_KIND = {"unreachable": ExitStatus.UNREACHABLE, "lost": ExitStatus.UNREACHABLE,
                  "internal": ExitStatus.FAILED, "os": ExitStatus.FAILED, "daemon": ExitStatus.FAILED}


class ShellError(CodError):
    """A failure found by the shell itself (bad command, bad argument, missing task...)."""

    def __init__(self, message: str, *, kind: str = "usage", detail: list[str] | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.detail = detail or []


class ConnectionProblem(CodError):
    """The daemon went away (or never answered); the shell dials it again at the next command."""

    def __init__(self, message: str, *, lost: bool) -> None:
        super().__init__(message)
        self.lost = lost


def status_of(problem: "Problem") -> ExitStatus:
    """The exit status a script gets for a statement that met ``problem``."""
    return STATUS_OF_KIND.get(problem.kind, STATUS_ERROR)


@dataclass
class Problem:
    kind: str  # "syntax_error", "unsafe", "timeout", "refused", "lost", "usage", ...
    message: str  # one or more sentences
    detail: list[str] = field(default_factory=list)  # extra lines, e.g. the source with a caret
    data: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, **({"data": self.data} if self.data else {})}


def sentence(text: str) -> str:
    text = text.strip()
    if not text:
        return text
    first = text.split(None, 1)[0]
    if not any(ch in first for ch in "/_('\"0123456789"):  # never capitalise a name (foo/1, db_rtime)
        text = text[0].upper() + text[1:]
    return text if text[-1] in ".!?" else text + "."


def caret_lines(source: str, line: int, column: int) -> list[str]:
    """The offending line of ``source`` and a caret under ``column`` (both 1-based)."""
    lines = source.splitlines() or [""]
    line = min(max(line, 1), len(lines))
    text = lines[line - 1].expandtabs(1)
    prefix = "    " if len(lines) == 1 else f"{line:>3}:"
    col = max(column, 1)
    return [f"{prefix}{text}", " " * (len(prefix) + col - 1) + "^"]


def _skb_problem(code: str, message: str, data: dict[str, Any], source: str | None,
                 timeout_s: float | None, commands: frozenset[str]) -> Problem:
    data = {k: v for k, v in data.items() if k != "skb_code"}
    if code == "syntax_error":
        what = message.split(": ", 1)[1] if ": " in message else message
        where = ""
        detail: list[str] = []
        if isinstance(data.get("line"), int) and isinstance(data.get("column"), int):
            where = f" at line {data['line']}, column {data['column']}"
            if source is not None:
                detail = caret_lines(source, data["line"], data["column"])
        return Problem("syntax_error", sentence(f"syntax error{where}: {what.replace('_', ' ')}"), detail, data)
    if code == "unsafe":
        return Problem("unsafe", sentence(message), [], data)
    if code == "timeout":
        limit = f" of {timeout_s:g} s" if timeout_s else ""
        return Problem("timeout", sentence(f"the query ran past its time limit{limit} and was stopped"), [], data)
    if code == "existence":
        pred = str(data.get("predicate") or "")
        text = f"unknown procedure {pred}" if pred else message
        name = pred.partition("/")[0]
        if name in commands:
            text += f" (shell commands start with ':', as in :{name})"
        return Problem("existence", sentence(text), [], data)
    if code == "resource":
        return Problem("resource", sentence(message), [], data)
    if code == "permission":
        return Problem("permission", sentence(message), [], data)
    return Problem(code, sentence(message), [], data)


def _from_the_connection(err: CodError) -> bool:
    """An error of the client or of the wire (the connection is in doubt), not one of this shell's own
    parts, which derive from CodError too."""
    return type(err).__module__.startswith(("cod.client.", "cod.protocol."))


def describe(err: BaseException, *, source: str | None = None, timeout_s: float | None = None,
             commands: frozenset[str] = frozenset()) -> Problem:
    """The Problem for any exception the shell may meet while running a statement."""
    if isinstance(err, ShellError):
        return Problem(err.kind, sentence(str(err)), err.detail)
    if isinstance(err, ConnectionProblem):
        return Problem("lost" if err.lost else "unreachable", sentence(str(err)))
    if isinstance(err, EngineError):
        return _skb_problem(err.code, err.message, dict(err.data), source, timeout_s, commands)
    if isinstance(err, client_errors.RMError):
        data = err.data if isinstance(err.data, dict) else {}
        if -32051 <= err.code <= -32040:
            return _skb_problem(str(data.get("skb_code", "engine")), err.message, data, source, timeout_s, commands)
        if isinstance(err, client_errors.PermissionDenied):
            return Problem("permission", sentence(f"the daemon refused: {err.message}"), [], data)
        if isinstance(err, client_errors.AdmissionRefused):
            return Problem("refused", sentence(f"the daemon refused: {err.message}"), [], data)
        if isinstance(err, client_errors.NotFound):
            return Problem("not_found", sentence(err.message), [], data)
        if isinstance(err, client_errors.ShuttingDown):
            return Problem("lost", sentence("the daemon is shutting down"), [], data)
        if isinstance(err, client_errors.InvalidRequest):
            return Problem("invalid", sentence(err.message), [], data)
        return Problem("daemon", sentence(f"the daemon reported an error: {err.message} (code {err.code})"), [], data)
    if isinstance(err, CodError) and _from_the_connection(err):
        return Problem("lost", sentence(str(err)))
    if isinstance(err, OSError):
        return Problem("os", sentence(f"{err.filename + ': ' if err.filename else ''}{err.strerror or err}"))
    return Problem("internal", sentence(f"internal error: {type(err).__name__}: {err}"))

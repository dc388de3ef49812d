"""What the user typed, cut into statements: shell commands and Prolog queries.

A line whose first non-blank character is ``:`` (but not ``:-``) is a shell
command and ends at the end of the line.  So is a line that starts like a psql
command, ``\\`` then a letter or ``?`` (``\\tasks``, ``\\q``): no Prolog goal
starts so (``\\+`` does not), and the shell says to use ``:`` rather than wait
for a full stop (:func:`psql_hint`).  Anything else is Prolog and ends at
its *full stop*: a ``.`` followed by white space, ``%`` or the end of the
text, that is not part of a symbol atom (``=..``), a number (``1.5``), a
quoted atom or string, or a comment.  This is how SWI-Prolog's top level
decides that a query is complete.  No I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from cod.protocol.errors import CodError

COMMAND_PREFIX = ":"
PSQL_PREFIX = "\\"
# psql's commands a newcomer types, and the shell's command that does that job.
PSQL_EQUIVALENT = {"q": "quit", "?": "help", "h": "help", "d": "facts", "dt": "facts", "df": "procedures"}
SYMBOL_CHARS = frozenset("#$&*+-./:<=>?@^~\\")


@dataclass(frozen=True)
class Command:
    name: str
    args: list[str]
    text: str  # the whole line, as typed
    line: int = 1  # where it starts in a script (1-based)


@dataclass(frozen=True)
class Query:
    text: str  # as typed, full stop included, so error columns match what the user sees
    line: int = 1

    @property
    def goal(self) -> str:
        return self.text


Statement = Command | Query


class Unterminated(CodError, ValueError):
    """A script ends inside a quoted item or a block comment."""


def is_command(text: str) -> bool:
    stripped = text.lstrip()
    return stripped.startswith(COMMAND_PREFIX) and not stripped.startswith(":-")


def is_psql_command(text: str) -> bool:
    """``\\tasks``, ``\\q``, ``\\?``: a psql habit, never a Prolog goal (``\\+ G`` is one)."""
    stripped = text.lstrip()
    return stripped.startswith(PSQL_PREFIX) and len(stripped) > 1 and (stripped[1].isalpha() or stripped[1] == "?")


def psql_hint(cmd: Command, commands: Iterable[str]) -> str:
    """What to type instead of a psql-style ``\\name``: ``:name`` when the shell has it."""
    known = sorted(set(commands))
    name = PSQL_EQUIVALENT.get(cmd.name) or next((n for n in known if n == cmd.name), None)
    if name is None:
        starts = [n for n in known if n.startswith(cmd.name)]
        name = starts[0] if len(starts) == 1 else None
    head = f"shell commands start with ':', not '{PSQL_PREFIX}' as in psql"
    if name is None:
        return f"{head} (try :help)"
    args = " ".join(cmd.args)
    return f"{head}: use :{name}{' ' + args if args else ''}"


def parse_command(text: str, line: int = 1) -> Command:
    """``:explain scan`` -> Command("explain", ["scan"]).  Arguments split like a shell's words.
    A psql-style ``\\tasks`` parses the same (its ``text`` keeps the backslash)."""
    import shlex

    body = text.strip()[1:]
    try:
        words = shlex.split(body, posix=True)
    except ValueError:  # an unbalanced quote: keep the raw words
        words = body.split()
    name = words[0].lower() if words else ""
    return Command(name, words[1:], text.strip(), line)


def full_stops(text: str) -> list[int]:
    """Indexes of the end-of-clause full stops in ``text`` (quotes and comments skipped).

    Raises :class:`Unterminated` if the text ends inside a quoted item or a
    block comment (then no full stop after it counts)."""
    stops: list[int] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "%":
            nl = text.find("\n", i)
            i = n if nl < 0 else nl + 1
            continue
        if ch == "/" and text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end < 0:
                raise Unterminated("a /* comment is not closed")
            i = end + 2
            continue
        if ch == "'" and i > 0 and text[i - 1] == "0" and (i < 2 or not _alnum(text[i - 2])):
            i = _skip_char_literal(text, i + 1)  # 0'c, 0''', 0'\n
            continue
        if ch in "'\"`":
            i = _skip_quoted(text, i)
            continue
        if ch == ".":
            prev = text[i - 1] if i > 0 else " "
            nxt = text[i + 1] if i + 1 < n else " "
            if (nxt.isspace() or nxt == "%") and prev not in SYMBOL_CHARS:
                stops.append(i)
                i += 1
                continue
            if prev in SYMBOL_CHARS or nxt in SYMBOL_CHARS:  # part of a symbol atom: skip it whole
                while i < n and text[i] in SYMBOL_CHARS:
                    i += 1
                continue
        i += 1
    return stops


def _alnum(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


def _skip_char_literal(text: str, i: int) -> int:
    if i >= len(text):
        return i
    if text[i] == "\\":
        return min(len(text), i + 2)
    if text.startswith("''", i):
        return i + 2
    return i + 1


def _skip_quoted(text: str, start: int) -> int:
    quote = text[start]
    i, n = start + 1, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch == quote:
            if i + 1 < n and text[i + 1] == quote:  # a doubled quote stands for itself
                i += 2
                continue
            return i + 1
        i += 1
    raise Unterminated(f"a {quote}quoted{quote} item is not closed")


def is_complete(text: str) -> bool:
    """Whether interactive input is a whole statement (Enter then runs it)."""
    if not text.strip() or is_command(text) or is_psql_command(text):
        return True
    try:
        stops = full_stops(text)
    except Unterminated:
        return False
    return bool(stops) and _only_comments(text[stops[-1] + 1:])


def _only_comments(text: str) -> bool:
    """True when ``text`` holds nothing but blanks and line comments."""
    return all(not ln.strip() or ln.strip().startswith("%") for ln in text.splitlines())


def split(text: str, *, require_stop: bool = False) -> list[Statement]:
    """Cut a script (``-c`` text or standard input) into statements.

    A last Prolog statement without a full stop is accepted (``cod shell -c
    'get_nr_cores(N)'``) unless ``require_stop``; then it raises ValueError."""
    out: list[Statement] = []
    buf, buf_line = "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if not buf:
            if _only_comments(line):
                continue
            if is_command(line) or is_psql_command(line):
                out.append(parse_command(line, number))
                continue
            buf, buf_line = line, number
        else:
            buf += "\n" + line
        while buf:
            try:
                stops = full_stops(buf)
            except Unterminated:
                break
            if not stops:
                break
            piece = buf[: stops[0] + 1]
            lead = piece[: len(piece) - len(piece.lstrip())]
            out.append(Query(piece.strip(), buf_line + lead.count("\n")))
            buf_line += piece.count("\n")
            buf = buf[stops[0] + 1:]
            if _only_comments(buf):
                buf = ""
    if buf.strip():
        lead = buf[: len(buf) - len(buf.lstrip())]
        if require_stop:
            raise ValueError(f"line {buf_line + lead.count(chr(10))}: the query does not end with a full stop")
        out.append(Query(buf.strip() + ".", buf_line + lead.count("\n")))
    return out

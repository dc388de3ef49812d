"""The one writer of Prolog text: atoms, strings and terms built from Python values.

Whatever a user gives (an application name, a goal, a fact) travels to the
SKB inside a quoted atom or a double-quoted string written here, so it can
never be read as anything but that one atom or string.  ISO escapes are
used for the quote characters, the backslash and control characters.
"""

from __future__ import annotations

import re
from typing import Any

from .errors import CodError

_PLAIN_ATOM = re.compile(r"[a-z][a-zA-Z0-9_]*\Z")
_PLAIN_TEXT = re.compile(r"[^\\\"'\x00-\x1f\x7f]*\Z")
_HEAD = re.compile(r"\s*([a-z][a-zA-Z0-9_]*)\s*(\(|\.|:-|$)")
_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


class PrologTextError(CodError, ValueError):
    """A value cannot be written as Prolog text (wrong type, unpaired surrogate)."""


def _quoted(text: str, quote: str) -> str:
    if not isinstance(text, str):
        raise PrologTextError(f"expected a string, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise PrologTextError("text holds an unpaired surrogate, which is not text") from None
    if _PLAIN_TEXT.match(text):
        return quote + text + quote
    out = [quote]
    for ch in text:
        esc = _ESCAPES.get(ch)
        if esc is not None:
            out.append(esc)
        elif ch == quote:
            out.append("\\" + quote)
        elif ch < " " or ch == "\x7f":
            out.append(f"\\x{ord(ch):x}\\")
        else:
            out.append(ch)
    out.append(quote)
    return "".join(out)


def atom(text: str) -> str:
    """``text`` as a Prolog atom: bare when it is a plain lower-case word, else quoted."""
    if isinstance(text, str) and _PLAIN_ATOM.match(text):
        return text
    return _quoted(text, "'")


def string(text: str) -> str:
    """``text`` as a double-quoted Prolog string literal."""
    return _quoted(text, '"')


def string_list(texts: Any) -> str:
    return "[" + ",".join(string(t) for t in texts) + "]"


def term(value: Any) -> str:
    """A JSON-like value as a Prolog term: ints and floats as numbers, strings as atoms, lists as lists."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise PrologTextError(f"cannot write {value!r} as a Prolog number")
        return repr(value)
    if isinstance(value, str):
        return atom(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value) if isinstance(value, (set, frozenset)) else value
        return "[" + ", ".join(term(v) for v in items) + "]"
    raise PrologTextError(f"cannot write {type(value).__name__} as a Prolog term")


def predicate_name(fact: str) -> str | None:
    """The functor of a fact or clause head, e.g. "db_ntuple" for "db_ntuple(3750000)"."""
    m = _HEAD.match(fact)
    return m.group(1) if m else None

"""Writing RM-owned values as Prolog terms, and reading predicate names out of fact text."""

from __future__ import annotations

import re
from typing import Any

_PLAIN_ATOM = re.compile(r"[a-z][a-zA-Z0-9_]*\Z")
_HEAD = re.compile(r"\s*([a-z][a-zA-Z0-9_]*)\s*(\(|\.|:-|$)")


def atom(text: str) -> str:
    if _PLAIN_ATOM.match(text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def term(value: Any) -> str:
    """A JSON-like value as a Prolog term: ints and floats as numbers, strings as atoms, lists as lists."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return atom(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value) if isinstance(value, (set, frozenset)) else value
        return "[" + ", ".join(term(v) for v in items) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as a Prolog term")


def predicate_name(fact: str) -> str | None:
    """The functor of a fact or clause head, e.g. "db_ntuple" for "db_ntuple(3750000)"."""
    m = _HEAD.match(fact)
    return m.group(1) if m else None

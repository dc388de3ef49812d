"""Just enough Prolog term reading to tell which facts a pattern removes, without the SKB.

A client that replays its state after a daemon restart keeps the facts it
holds *now*, not its history: ``remove_facts("db_rtime(_)")`` must drop the
``db_rtime(3000)`` it added before.  That needs unification of a pattern
with a fact.  This module reads the common forms (atoms, quoted atoms,
numbers, strings, variables, compound terms, lists) and unifies them; for
text it cannot read (operators, say) it answers None, and the caller keeps
the removal in its history instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_TOKEN = re.compile(r"""
    \s*(?:
      (?P<float>-?\d+\.\d+(?:[eE][+-]?\d+)?)
    | (?P<int>-?\d+)
    | (?P<var>[A-Z_][A-Za-z0-9_]*)
    | (?P<atom>[a-z][A-Za-z0-9_]*)
    | '(?P<qatom>(?:[^'\\]|\\.|'')*)'
    | "(?P<str>(?:[^"\\]|\\.|"")*)"
    | (?P<punct>[(),\[\]|])
    )""", re.VERBOSE)


@dataclass(frozen=True)
class Var:
    name: str


@dataclass(frozen=True)
class Struct:
    name: str
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Str:
    text: str


class _Unreadable(Exception):
    pass


def read(text: str) -> Any | None:
    """The term ``text`` holds (a trailing full stop allowed), or None when it is beyond this reader."""
    s = text.strip()
    if s.endswith("."):
        s = s[:-1]
    try:
        tokens = _tokens(s)
        term, pos = _term(tokens, 0)
        if pos != len(tokens):
            return None
        return term
    except _Unreadable:
        return None


def _tokens(s: str) -> list[tuple[str, Any]]:
    out, pos = [], 0
    while pos < len(s.rstrip()):
        m = _TOKEN.match(s, pos)
        if not m or m.end() == pos:
            raise _Unreadable
        kind = m.lastgroup
        value = m.group(kind)
        if kind == "float":
            out.append(("num", float(value)))
        elif kind == "int":
            out.append(("num", int(value)))
        elif kind in ("qatom", "str"):
            q = "'" if kind == "qatom" else '"'
            value = value.replace(q + q, q)
            if "\\" in value:
                value = _unescape(value)
            out.append(("atom" if kind == "qatom" else "str", value))
        else:
            out.append((kind, value))
        pos = m.end()
    return out


def _unescape(value: str) -> str:
    simple = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "'": "'", '"': '"', "`": "`"}
    out, i = [], 0
    while i < len(value):
        ch = value[i]
        if ch == "\\" and i + 1 < len(value):
            nxt = value[i + 1]
            if nxt in simple:
                out.append(simple[nxt])
                i += 2
                continue
            raise _Unreadable
        out.append(ch)
        i += 1
    return "".join(out)


def _term(tokens: list[tuple[str, Any]], pos: int) -> tuple[Any, int]:
    if pos >= len(tokens):
        raise _Unreadable
    kind, value = tokens[pos]
    if kind == "num":
        return value, pos + 1
    if kind == "var":
        return Var(value), pos + 1
    if kind == "str":
        return Str(value), pos + 1
    if kind in ("atom",):
        if pos + 1 < len(tokens) and tokens[pos + 1] == ("punct", "("):
            args, pos = _args(tokens, pos + 2, ")")
            return Struct(value, tuple(args)), pos
        return Struct(value, ()), pos + 1
    if (kind, value) == ("punct", "["):
        if pos + 1 < len(tokens) and tokens[pos + 1] == ("punct", "]"):
            return Struct("[]", ()), pos + 2
        items: list[Any] = []
        pos += 1
        while True:
            item, pos = _term(tokens, pos)
            items.append(item)
            if pos < len(tokens) and tokens[pos] == ("punct", ","):
                pos += 1
                continue
            break
        tail: Any = Struct("[]", ())
        if pos < len(tokens) and tokens[pos] == ("punct", "|"):
            tail, pos = _term(tokens, pos + 1)
        if pos >= len(tokens) or tokens[pos] != ("punct", "]"):
            raise _Unreadable
        for item in reversed(items):
            tail = Struct(".", (item, tail))
        return tail, pos + 1
    raise _Unreadable


def _args(tokens: list[tuple[str, Any]], pos: int, close: str) -> tuple[list[Any], int]:
    args = []
    while True:
        arg, pos = _term(tokens, pos)
        args.append(arg)
        if pos < len(tokens) and tokens[pos] == ("punct", ","):
            pos += 1
            continue
        if pos < len(tokens) and tokens[pos] == ("punct", close):
            return args, pos + 1
        raise _Unreadable


def unifiable(a: Any, b: Any) -> bool:
    """Do two terms unify (each variable name standing for one variable of its own term)?"""
    return _unify(_rename(a, "a"), _rename(b, "b"), {})


def _rename(t: Any, side: str) -> Any:
    if isinstance(t, Var):
        return t if t.name == "_" else Var(f"{side}:{t.name}")
    if isinstance(t, Struct):
        return Struct(t.name, tuple(_rename(x, side) for x in t.args))
    return t


def _walk(t: Any, env: dict[str, Any]) -> Any:
    while isinstance(t, Var) and t.name in env:
        t = env[t.name]
    return t


def _unify(a: Any, b: Any, env: dict[str, Any]) -> bool:
    a, b = _walk(a, env), _walk(b, env)
    if isinstance(a, Var):
        if a.name != "_":
            env[a.name] = b
        return True
    if isinstance(b, Var):
        if b.name != "_":
            env[b.name] = a
        return True
    if isinstance(a, Struct) and isinstance(b, Struct):
        return (a.name == b.name and len(a.args) == len(b.args)
                and all(_unify(x, y, env) for x, y in zip(a.args, b.args)))
    if isinstance(a, bool) or isinstance(b, bool):
        return False
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return type(a) is type(b) and a == b
    return a == b

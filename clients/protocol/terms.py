"""The one reader of Prolog text: terms in canonical form (no operators) as the SKB's JSON shape.

Two users: the shell shows the clauses the SKB lists (``list_facts`` writes
them with ``~k``: ``:-(bar(A),','(foo(A),>(A,1)))``), and a client that
replays its state after a daemon restart must tell which facts a pattern
removes (``remove_facts("db_rtime(_)")`` drops the ``db_rtime(3000)`` added
before), which needs unification.

A term is read into the shape the SKB's answers have (docs/skb-schema.md):
ints and floats as numbers (``1.0Inf``, ``-1.0Inf`` and ``1.5NaN`` too),
atoms as ``str``, strings as ``{"string": text}``, proper lists as ``list``,
variables as ``{"var": name}``, other compound terms (a partial list
``[a|T]`` is ``'[|]'(a, T)``) as ``{"functor": name, "args": [...]}``.
Quoted items take every escape SWI-Prolog reads (named, ``\\xHEX\\``,
octal, a backslash-newline).  Operators other than in canonical form (``a-b``
rather than ``-(a,b)``) are beyond this reader: :func:`parse` raises
:class:`TermSyntaxError`, :func:`read` answers None.  The one writer is
:mod:`cod.protocol.prolog_text`.  No I/O here.
"""

from __future__ import annotations

import re
from typing import Any

from .errors import CodError

_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<num>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?(?:Inf|NaN)?)
  | (?P<var>[A-Z_][A-Za-z0-9_]*)
  | (?P<name>[a-z][A-Za-z0-9_]*)
  | (?P<qatom>'(?:[^'\\]|\\(?:x[0-9a-fA-F]+\\|[0-7]+\\|.)|'')*')
  | (?P<str>"(?:[^"\\]|\\(?:x[0-9a-fA-F]+\\|[0-7]+\\|.)|"")*")
  | (?P<sym>[#$&*+\-./:<=>?@^~\\]+)
  | (?P<punct>[()\[\]{},|!;])
""", re.X | re.S)
_ESCAPE = re.compile(r"\\(?:x([0-9a-fA-F]+)\\|([0-7]+)\\|(\n)|(.))|(''|\"\")", re.S)
_NAMED = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v", "e": "\x1b",
          "s": " ", "\\": "\\", "'": "'", '"': '"', "`": "`"}
_ATOMS = ("name", "qatom", "sym")
_SOLO = ("!", ";", ",", "|")


class TermSyntaxError(CodError, ValueError):
    """The text is not one term this reader reads; the message says where."""


def _unquote(token: str) -> str:
    quote, body = token[0], token[1:-1]
    if "\\" not in body and quote * 2 not in body:
        return body

    def one(m: re.Match[str]) -> str:
        hexa, octal, newline, named, doubled = m.groups()
        if doubled:
            return quote if doubled[0] == quote else doubled  # '' in 'it''s' is one quote
        if hexa or octal:
            code = int(hexa, 16) if hexa else int(octal, 8)
            if code > 0x10FFFF:
                raise TermSyntaxError(f"character code {code} out of range in {token[:40]}")
            return chr(code)
        if newline:
            return ""  # a backslash-newline continues the text
        if named in _NAMED:
            return _NAMED[named]
        raise TermSyntaxError(f"undefined escape \\{named} in {token[:40]}")

    return _ESCAPE.sub(one, body)


def _number(tok: str) -> int | float:
    if tok.endswith("Inf"):
        return float("-inf") if tok.startswith("-") else float("inf")
    if tok.endswith("NaN"):
        return float("nan")
    return float(tok) if any(ch in tok for ch in ".eE") else int(tok)


def _tokens(text: str) -> list[tuple[str, str]]:
    out, at = [], 0
    while at < len(text):
        m = _TOKEN.match(text, at)
        if m is None:
            raise TermSyntaxError(f"cannot read {text[at:at + 20]!r}")
        if m.lastgroup != "ws":
            out.append((str(m.lastgroup), m.group()))
        at = m.end()
    return out


class _Parser:
    def __init__(self, text: str) -> None:
        self.text, self.tokens, self.pos = text, _tokens(text), 0

    def peek(self) -> str:
        return self.tokens[self.pos][1] if self.pos < len(self.tokens) else ""

    def take(self, expected: str | None = None) -> tuple[str, str]:
        if self.pos >= len(self.tokens):
            raise TermSyntaxError(f"unexpected end of {self.text[:60]!r}")
        tok = self.tokens[self.pos]
        if expected is not None and tok[1] != expected:
            raise TermSyntaxError(f"expected {expected!r} at {tok[1]!r} in {self.text[:60]!r}")
        self.pos += 1
        return tok

    def items(self, close: str) -> list[Any]:
        out = [self.term()]
        while self.peek() == ",":
            self.take()
            out.append(self.term())
        if close:
            self.take(close)
        return out

    def list_(self) -> Any:
        if self.peek() == "]":
            self.take()
            return []
        items = self.items("")
        if self.peek() != "|":
            self.take("]")
            return items
        self.take()
        tail = self.term()
        self.take("]")
        for item in reversed(items):
            tail = {"functor": "[|]", "args": [item, tail]}
        return tail

    def term(self) -> Any:
        kind, tok = self.take()
        if kind == "num":
            return _number(tok)
        if kind == "var":
            return {"var": tok}
        if kind == "str":
            return {"string": _unquote(tok)}
        if tok == "[":
            return self.list_()
        if tok == "{":
            if self.peek() != "}":
                inner = self.term()
                self.take("}")
                return {"functor": "{}", "args": [inner]}
            self.take()
            kind, tok = "name", "{}"  # the atom {}, or the functor of ~k's {}(y)
        if kind in _ATOMS or tok in _SOLO:
            name = _unquote(tok) if kind == "qatom" else tok
            if self.peek() == "(":
                self.take()
                return {"functor": name, "args": self.items(")")}
            return name
        raise TermSyntaxError(f"unexpected {tok!r} in {self.text[:60]!r}")


def parse(text: str) -> Any:
    """The one term ``text`` holds, in canonical form; raises :class:`TermSyntaxError`."""
    parser = _Parser(text)
    try:
        result = parser.term()
    except RecursionError:
        raise TermSyntaxError(f"term nested too deeply: {text[:60]!r}") from None
    if parser.pos != len(parser.tokens):
        raise TermSyntaxError(f"unexpected {parser.tokens[parser.pos][1]!r} in {text[:60]!r}")
    return result


def read(text: str) -> Any | None:
    """The term ``text`` holds (a trailing full stop allowed), or None when it is beyond this reader."""
    s = text.strip()
    if s.endswith("."):
        s = s[:-1]
    try:
        return parse(s)
    except TermSyntaxError:
        return None


# ---- unification ------------------------------------------------------------------------------------
def unifiable(a: Any, b: Any) -> bool:
    """Do two terms unify (each variable name standing for one variable of its own term, ``_`` for
    a fresh one each time)?"""
    return _unify(_rename(a, "a"), _rename(b, "b"), {})


def _is_var(t: Any) -> bool:
    return isinstance(t, dict) and "var" in t


def _rename(t: Any, side: str) -> Any:
    if _is_var(t):
        return t if t["var"] == "_" else {"var": f"{side}:{t['var']}"}
    if isinstance(t, list):
        return [_rename(x, side) for x in t]
    if isinstance(t, dict) and "functor" in t:
        return {"functor": t["functor"], "args": [_rename(x, side) for x in t["args"]]}
    return t


def _walk(t: Any, env: dict[str, Any]) -> Any:
    while _is_var(t) and t["var"] in env:
        t = env[t["var"]]
    return t


def _cons(t: Any) -> Any:
    """A non-empty list as its first cell, so ``[a, b]`` unifies with ``[a|T]``."""
    return {"functor": "[|]", "args": [t[0], t[1:]]} if isinstance(t, list) and t else t


def _unify(a: Any, b: Any, env: dict[str, Any]) -> bool:
    a, b = _walk(a, env), _walk(b, env)
    for var, other in ((a, b), (b, a)):
        if _is_var(var):
            if var["var"] != "_" and other is not var:
                env[var["var"]] = other
            return True
    a, b = _cons(a), _cons(b)
    if isinstance(a, dict) and "functor" in a and isinstance(b, dict) and "functor" in b:
        return (a["functor"] == b["functor"] and len(a["args"]) == len(b["args"])
                and all(_unify(x, y, env) for x, y in zip(a["args"], b["args"])))
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and a != a:
        return b != b  # 1.5NaN = 1.5NaN, as in SWI-Prolog
    return bool(a == b)

"""The one writer of Prolog text: atoms, strings, numbers and terms, as data and for display.

Every part of COD that writes Prolog text writes it here: the machine's facts
(``cod.facts.prolog``), the facts the daemon writes (``cod.rm.system_facts``),
the SKB driver's calls (``cod.skb.codec``), elastic groups' facts and the
shell's answers.  One escaping rule serves both modes:

* inside quotes, ``\\`` and the quote are escaped with a backslash, newline,
  tab and carriage return by name, and every other character that is not
  printable (controls, U+2028, U+00AD ...) as ``\\xHEX\\``, as SWI-Prolog's
  ``writeq`` does; everything else (accented letters, CJK) is written as is;
* *data* (:func:`atom`, :func:`string`, :func:`term`, :func:`compound`): what
  a user gives (an application name, a goal, a fact) travels to the SKB inside
  a quoted atom or a double-quoted string, so it can never be read as anything
  but that one atom or string.  An atom is bare only when it is a plain
  lower-case word; a number is finite; text is valid Unicode;
* *display* (:func:`display_atom`, :func:`term_text`, :func:`solution_text`,
  :func:`fact_text`, :func:`clause_text`): answers as SWI-Prolog's top level
  writes them, from the SKB's JSON values (docs/skb-schema.md): symbol atoms
  bare (``=..``), operators infix with the standard priorities so ``a-b``
  reads back as it was, special floats as ``1.0Inf`` and ``1.5NaN``.

The one reader is :mod:`cod.protocol.terms`.  No I/O here.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any

from .errors import CodError
from .terms import TermSyntaxError, parse

_PLAIN_ATOM = re.compile(r"[a-z][a-zA-Z0-9_]*\Z")
_SYMBOL_ATOM = re.compile(r"[#$&*+\-./:<=>?@^~\\]+\Z")
_SOLO = frozenset({"[]", "!", ";", "{}", "|"})
_HEAD = re.compile(r"\s*([a-z][a-zA-Z0-9_]*)\s*(\(|\.|:-|$)")
_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
ARG_PRIORITY = 999


class PrologTextError(CodError, ValueError):
    """A value cannot be written as Prolog text (wrong type, unpaired surrogate, infinite float)."""


class Written(str):
    """Text that is Prolog already (a variable, a term built by :func:`compound`): written as it is."""


ANY = Written("_")  # the anonymous variable, for patterns: compound("allocated", ANY, ANY)


# ---- the escaping rule ------------------------------------------------------------------------------
def quoted(text: str, quote: str = "'", *, strict: bool = True) -> str:
    """``text`` between ``quote`` characters, escaped.  ``strict`` (data) refuses an unpaired
    surrogate, which is not text; display writes it as ``\\xD800\\``."""
    if not isinstance(text, str):
        raise PrologTextError(f"expected a string, got {type(text).__name__}")
    if strict:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise PrologTextError("text holds an unpaired surrogate, which is not text") from None
    if text.isprintable() and "\\" not in text and quote not in text:
        return quote + text + quote
    out = [quote]
    for ch in text:
        esc = _ESCAPES.get(ch)
        if esc is not None:
            out.append(esc)
        elif ch == quote:
            out.append("\\" + quote)
        elif not ch.isprintable():
            out.append(f"\\x{ord(ch):x}\\")
        else:
            out.append(ch)
    out.append(quote)
    return "".join(out)


# ---- data ---------------------------------------------------------------------------------------------
def atom(text: str) -> str:
    """``text`` as a Prolog atom: bare when it is a plain lower-case word, else quoted."""
    if isinstance(text, str) and len(text) <= _CACHED_ATOM_LEN:
        return _short_atom(str(text))
    if isinstance(text, str) and _PLAIN_ATOM.match(text):
        return text
    return quoted(text, "'")


_CACHED_ATOM_LEN = 64  # names, keys and short values recur (every task's facts name their keys)


@functools.lru_cache(maxsize=4096)
def _short_atom(text: str) -> str:
    return text if _PLAIN_ATOM.match(text) else quoted(text, "'")


def string(text: str) -> str:
    """``text`` as a double-quoted Prolog string literal."""
    return quoted(text, '"')


def string_list(texts: Any) -> str:
    return "[" + ",".join(string(t) for t in texts) + "]"


def number(value: int | float, *, special: bool = False) -> str:
    """An int or float as Prolog reads it back (``1.0e20``, never ``1e+20``).  Infinite and NaN
    floats have no data form (``inf`` is an atom): refused, unless ``special`` (display)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PrologTextError(f"expected a number, got {type(value).__name__}")
    if isinstance(value, int):
        return str(value)
    if math.isinf(value) or math.isnan(value):
        if not special:
            raise PrologTextError(f"cannot write {value!r} as a Prolog number")
        return "1.5NaN" if math.isnan(value) else ("1.0Inf" if value > 0 else "-1.0Inf")
    text = repr(value)
    if "e" in text:
        mantissa, exp = text.split("e")
        if "." not in mantissa:
            mantissa += ".0"
        return f"{mantissa}e{int(exp)}"
    return text


def term(value: Any, sep: str = ", ") -> str:
    """A JSON-like value as a Prolog term: numbers, strings as atoms, lists (items joined by ``sep``),
    True/False/None as the atoms ``true``/``false``/``none``; :class:`Written` text as it is."""
    kind = type(value)  # the common cases first: a plain string, an int
    if kind is str:
        return atom(value)
    if kind is int:
        return str(value)
    if isinstance(value, Written):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    if isinstance(value, (int, float)):
        return number(value)
    if isinstance(value, str):
        return atom(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value) if isinstance(value, (set, frozenset)) else value
        return "[" + sep.join(term(v, sep) for v in items) + "]"
    raise PrologTextError(f"cannot write {type(value).__name__} as a Prolog term")


def compound(name: str, *args: Any, sep: str = ", ") -> Written:
    """``name(Arg1, Arg2, ...)`` with each argument written by :func:`term` (``ANY`` for ``_``);
    the bare atom ``name`` when there are no arguments."""
    if not args:
        return Written(atom(name))
    return Written(f"{atom(name)}({sep.join(term(a, sep) for a in args)})")


def predicate_name(fact: str) -> str | None:
    """The functor of a fact or clause head, e.g. "db_ntuple" for "db_ntuple(3750000)"."""
    m = _HEAD.match(fact)
    return m.group(1) if m else None


# ---- display: as the top level writes answers -------------------------------------------------------
# (priority, type) of the standard operators (ISO and SWI-Prolog's defaults).
INFIX: dict[str, tuple[int, str]] = {
    ":-": (1200, "xfx"), "-->": (1200, "xfx"),
    ";": (1100, "xfy"), "|": (1100, "xfy"),
    "->": (1050, "xfy"), "*->": (1050, "xfy"),
    ",": (1000, "xfy"),
    **{op: (700, "xfx") for op in ("=", "\\=", "==", "\\==", "@<", "@>", "@=<", "@>=", "=..", "is",
                                    "=:=", "=\\=", "<", ">", "=<", ">=", "as", ">:<", ":<")},
    ":": (600, "xfy"),  # SWI-Prolog: op(600, xfy, :)
    **{op: (500, "yfx") for op in ("+", "-", "/\\", "\\/", "xor")},
    **{op: (400, "yfx") for op in ("*", "/", "//", "rem", "mod", "div", "<<", ">>", "divmod", "rdiv")},
    "**": (200, "xfx"), "^": (200, "xfy"),
}
PREFIX: dict[str, tuple[int, str]] = {
    ":-": (1200, "fx"), "?-": (1200, "fx"), "\\+": (900, "fy"),
    "-": (200, "fy"), "+": (200, "fy"), "\\": (200, "fy"),
}


def display_atom(name: str) -> str:
    """An atom as ``writeq`` writes it: bare when it can be (words, symbol atoms, ``[]``), else quoted."""
    if _PLAIN_ATOM.match(name) or _SYMBOL_ATOM.match(name) or name in _SOLO:
        return name
    return quoted(name, "'", strict=False)


def term_text(value: Any, max_priority: int = 1200) -> str:
    """A JSON-encoded term as Prolog text (operators infix, lists with ``[a, b]``)."""
    if value is None:
        return "_"
    if isinstance(value, dict) and "var" in value:
        return str(value["var"])
    if isinstance(value, dict) and "string" in value:
        return quoted(str(value["string"]), '"', strict=False)
    if isinstance(value, (int, float)):
        text = "true" if value is True else "false" if value is False else number(value, special=True)
        return f"({text})" if max_priority < 200 and text.startswith("-") else text
    if isinstance(value, str):
        text = display_atom(value)
        return f"({text})" if value in (",", "|") and max_priority < 1200 else text
    if isinstance(value, list):
        return "[" + ", ".join(term_text(v, ARG_PRIORITY) for v in value) + "]"
    if isinstance(value, dict) and "functor" in value:
        return _compound_text(str(value["functor"]), list(value.get("args") or []), max_priority)
    return repr(value)


def _list_text(args: list[Any]) -> str:
    """A partial list ``'[|]'(H, T)``: ``[a, b|T]``, or ``[a, b]`` when the tail is a list."""
    items, tail = [args[0]], args[1]
    while isinstance(tail, dict) and tail.get("functor") == "[|]" and len(tail.get("args", [])) == 2:
        items.append(tail["args"][0])
        tail = tail["args"][1]
    if isinstance(tail, list):
        return "[" + ", ".join(term_text(i, ARG_PRIORITY) for i in items + tail) + "]"
    head = ", ".join(term_text(i, ARG_PRIORITY) for i in items)
    return f"[{head}|{term_text(tail, ARG_PRIORITY)}]"


def _infix_text(name: str, args: list[Any], max_priority: int) -> str:
    priority, kind = INFIX[name]
    left = term_text(args[0], priority if kind == "yfx" else priority - 1)
    right = term_text(args[1], priority if kind == "xfy" else priority - 1)
    if name == ",":
        text = f"{left}, {right}"
    elif priority >= 700 or name[0].isalpha():
        text = f"{left} {name} {right}"
    else:
        sep = " " if right[:1] and right[0] in "#$&*+-./:<=>?@^~\\" else ""
        text = f"{left}{name}{sep}{right}"
    return f"({text})" if priority > max_priority else text


def _prefix_text(name: str, arg: Any, max_priority: int) -> str:
    priority, kind = PREFIX[name]
    text = term_text(arg, priority if kind == "fy" else priority - 1)
    if isinstance(arg, (int, float)) and name in ("-", "+"):
        text = f"{name}({text})"  # -(1) is not the number -1
    else:
        sep = " " if name[0].isalpha() or name == "\\+" or text[:1] in "-+(" else ""
        text = f"{name}{sep}{text}"
    return f"({text})" if priority > max_priority else text


def _compound_text(name: str, args: list[Any], max_priority: int) -> str:
    if name == "[|]" and len(args) == 2:
        return _list_text(args)
    if name == "{}" and len(args) == 1:
        return "{" + term_text(args[0], 1200) + "}"
    if len(args) == 2 and name in INFIX:
        return _infix_text(name, args, max_priority)
    if len(args) == 1 and name in PREFIX:
        return _prefix_text(name, args[0], max_priority)
    inner = ", ".join(term_text(a, ARG_PRIORITY) for a in args)
    return f"{display_atom(name)}({inner})"


def solution_text(solution: dict[str, Any]) -> str:
    """One answer as the top level shows it: ``X = 1,\\nY = f(a)``, or ``true``.

    Variables left unbound are not shown (the top level shows ``_`` only inside
    a value)."""
    parts = [f"{name} = {term_text(value, ARG_PRIORITY)}" for name, value in solution.items()
             if value is not None]
    return ",\n".join(parts) if parts else "true"


def fact_text(name: str, args: list[Any]) -> str:
    """A fact ``name(args...)`` as a clause, with its full stop."""
    if not args:
        return f"{display_atom(name)}."
    return f"{_compound_text(name, args, 1200)}."


def clause_text(canonical: str) -> str:
    """A clause from its canonical text (the SKB's list_facts), written the way people write
    clauses; unchanged (with a full stop) if the reader cannot read it."""
    try:
        clause = parse(canonical)
    except TermSyntaxError:
        return canonical if canonical.endswith(".") else canonical + "."
    if isinstance(clause, dict) and clause.get("functor") == ":-" and len(clause.get("args", [])) == 2:
        head, body = clause["args"]
        goals = []
        while isinstance(body, dict) and body.get("functor") == "," and len(body["args"]) == 2:
            goals.append(body["args"][0])
            body = body["args"][1]
        goals.append(body)
        lines = [term_text(head, 1199) + " :-"]
        lines += [f"    {term_text(g, 999)}," for g in goals[:-1]]
        lines.append(f"    {term_text(goals[-1], 999)}.")
        return "\n".join(lines)
    return term_text(clause, 1200) + "."

"""Answers as SWI-Prolog's top level writes them, from the SKB's JSON values.

The SKB sends integers and floats as numbers, atoms and strings as strings,
proper lists as arrays, other compound terms as ``{"functor", "args"}`` and
unbound variables as ``null`` (docs/skb-schema.md).  Atoms and strings cannot
be told apart, so every string is written as an atom, quoted where Prolog
needs quotes.  Operators are written infix with the standard priorities, so
``a-b`` reads back as it was.  No I/O here.
"""

from __future__ import annotations

import math
import re
from typing import Any

from cod.protocol.errors import CodError

_PLAIN_ATOM = re.compile(r"[a-z][a-zA-Z0-9_]*\Z")
_SYMBOL_ATOM = re.compile(r"[#$&*+\-./:<=>?@^~\\]+\Z")
_SOLO = frozenset({"[]", "!", ";", "{}", "|"})
ARG_PRIORITY = 999

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


def atom_text(name: str) -> str:
    """An atom as ``writeq`` would write it: bare when it can be, else in single quotes."""
    if _PLAIN_ATOM.match(name) or _SYMBOL_ATOM.match(name) or name in _SOLO:
        return name
    out = ["'"]
    for ch in name:
        if ch == "'":
            out.append("\\'")
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 32 or ord(ch) == 127:
            out.append(f"\\x{ord(ch):x}\\")
        else:
            out.append(ch)
    out.append("'")
    return "".join(out)


def number_text(value: int | float) -> str:
    if isinstance(value, bool):  # JSON true/false cannot come from the SKB, but be exact
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if math.isnan(value):
        return "nan"
    text = repr(value)
    if "e" in text:
        mantissa, exp = text.split("e")
        if "." not in mantissa:
            mantissa += ".0"
        return f"{mantissa}e{int(exp)}"
    return text


def term_text(value: Any, max_priority: int = 1200) -> str:
    """A JSON-encoded term as Prolog text (operators infix, lists with ``[a, b]``)."""
    if value is None:
        return "_"
    if isinstance(value, dict) and "var" in value:
        return str(value["var"])
    if isinstance(value, dict) and "string" in value:
        return '"' + atom_text(str(value["string"]))[1:-1].replace('"', '\\"').replace("\\'", "'") + '"' \
            if atom_text(str(value["string"])).startswith("'") else f'"{value["string"]}"'

    if isinstance(value, (int, float)):
        text = number_text(value)
        if max_priority < 200 and text.startswith("-"):
            return f"({text})"
        return text
    if isinstance(value, str):
        text = atom_text(value)
        if (value in INFIX or value in PREFIX) and max_priority < 1200:
            return f"({text})" if value in (",", "|") else text
        return text
    if isinstance(value, list):
        return "[" + ", ".join(term_text(v, ARG_PRIORITY) for v in value) + "]"
    if isinstance(value, dict) and "functor" in value:
        return _compound_text(str(value["functor"]), list(value.get("args") or []), max_priority)
    return repr(value)


def _compound_text(name: str, args: list[Any], max_priority: int) -> str:
    if name == "[|]" and len(args) == 2:  # a partial list: [a, b|T]
        items, tail = [args[0]], args[1]
        while isinstance(tail, dict) and tail.get("functor") == "[|]" and len(tail.get("args", [])) == 2:
            items.append(tail["args"][0])
            tail = tail["args"][1]
        head = ", ".join(term_text(i, ARG_PRIORITY) for i in items)
        if isinstance(tail, list):
            return "[" + ", ".join([head] + [term_text(i, ARG_PRIORITY) for i in tail] if tail else [head]) + "]"
        return f"[{head}|{term_text(tail, ARG_PRIORITY)}]"
    if name == "{}" and len(args) == 1:
        return "{" + term_text(args[0], 1200) + "}"
    if len(args) == 2 and name in INFIX:
        priority, kind = INFIX[name]
        left_max = priority if kind == "yfx" else priority - 1
        right_max = priority if kind == "xfy" else priority - 1
        left, right = term_text(args[0], left_max), term_text(args[1], right_max)
        if name == ",":
            text = f"{left}, {right}"
        elif priority >= 700 or name[0].isalpha():
            text = f"{left} {name} {right}"
        else:
            sep = " " if right[:1] in "-+" or (right[:1] and right[0] in "#$&*+-./:<=>?@^~\\") else ""
            text = f"{left}{name}{sep}{right}"
        return f"({text})" if priority > max_priority else text
    if len(args) == 1 and name in PREFIX:
        priority, kind = PREFIX[name]
        arg_max = priority if kind == "fy" else priority - 1
        arg = term_text(args[0], arg_max)
        if isinstance(args[0], (int, float)) and name in ("-", "+"):
            text = f"{name}({arg})"  # -(1) is not the number -1
        else:
            sep = " " if name[0].isalpha() or name == "\\+" or arg[:1] in "-+(" else ""
            text = f"{name}{sep}{arg}"
        return f"({text})" if priority > max_priority else text
    inner = ", ".join(term_text(a, ARG_PRIORITY) for a in args)
    return f"{atom_text(name)}({inner})"


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
        return f"{atom_text(name)}."
    return f"{_compound_text(name, args, 1200)}."


# ---- clauses in canonical form (the SKB's list_facts) -------------------------------------------
_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<num>-?\d+\.\d+(?:[eE][+-]?\d+)?|-?\d+(?:[eE][+-]?\d+)?)
  | (?P<var>[A-Z_][A-Za-z0-9_]*)
  | (?P<name>[a-z][A-Za-z0-9_]*)
  | (?P<qatom>'(?:[^'\\]|\\.|'')*')
  | (?P<str>"(?:[^"\\]|\\.|"")*")
  | (?P<sym>[#$&*+\-./:<=>?@^~\\]+)
  | (?P<punct>[()\[\]{},|!;])
""", re.X)


class CanonicalError(CodError, ValueError):
    pass


def _unquote(text: str) -> str:
    body = text[1:-1]
    out, i = [], 0
    escapes = {"n": "\n", "t": "\t", "\\": "\\", "'": "'", '"': '"', "`": "`", "a": "\a", "b": "\b",
               "f": "\f", "v": "\v", "r": "\r", "0": "\0", "e": "\x1b", "s": " "}
    while i < len(body):
        ch = body[i]
        if ch == "\\" and i + 1 < len(body):
            nxt = body[i + 1]
            if nxt == "x":
                end = body.find("\\", i + 2)
                out.append(chr(int(body[i + 2:end], 16)))
                i = end + 1
                continue
            if nxt == "\n":
                i += 2
                continue
            out.append(escapes.get(nxt, nxt))
            i += 2
            continue
        if ch == text[0] and i + 1 < len(body) and body[i + 1] == ch:
            out.append(ch)
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def parse_canonical(text: str) -> Any:
    """A term written in canonical form (``~k``: no operators) as the JSON shape, variables as {"var": N}."""
    tokens = []
    at = 0
    while at < len(text):
        m = _TOKEN.match(text, at)
        if m is None:
            raise CanonicalError(f"cannot read {text[at:at + 20]!r}")
        if m.lastgroup != "ws":
            tokens.append((m.lastgroup, m.group()))
        at = m.end()
    pos = 0

    def peek() -> tuple[str | None, str]:
        return tokens[pos] if pos < len(tokens) else (None, "")

    def take(expected: str | None = None) -> tuple[str | None, str]:
        nonlocal pos
        tok = peek()
        if expected is not None and tok[1] != expected:
            raise CanonicalError(f"expected {expected!r} at {tok[1]!r} in {text[:60]!r}")
        pos += 1
        return tok

    def term() -> Any:
        kind, tok = take()
        if kind == "num":
            return float(tok) if any(ch in tok for ch in ".eE") else int(tok)
        if kind == "var":
            return {"var": tok}
        if kind == "str":
            return {"string": _unquote(tok)}
        if tok == "[":
            items: list[Any] = []
            if peek()[1] == "]":
                take()
                return []
            items.append(term())
            while peek()[1] == ",":
                take()
                items.append(term())
            tail = None
            if peek()[1] == "|":
                take()
                tail = term()
            take("]")
            if tail is None:
                return items
            out: Any = tail
            for item in reversed(items):
                out = {"functor": "[|]", "args": [item, out]}
            return out
        if tok == "{":
            inner = term()
            take("}")
            return {"functor": "{}", "args": [inner]}
        if kind in ("name", "qatom", "sym") or tok in ("!", ";", ",", "|"):
            name = _unquote(tok) if kind == "qatom" else tok
            if peek()[1] == "(":
                take()
                args = [term()]
                while peek()[1] == ",":
                    take()
                    args.append(term())
                take(")")
                return {"functor": name, "args": args}
            return name
        raise CanonicalError(f"unexpected {tok!r} in {text[:60]!r}")

    result = term()
    if pos != len(tokens):
        raise CanonicalError(f"unexpected {tokens[pos][1]!r} in {text[:60]!r}")
    return result


def clause_text(canonical: str) -> str:
    """A clause from its canonical text, written the way people write clauses; unchanged if unreadable."""
    try:
        term = parse_canonical(canonical)
    except (CanonicalError, ValueError, IndexError):
        return canonical if canonical.endswith(".") else canonical + "."
    if isinstance(term, dict) and term.get("functor") == ":-" and len(term.get("args", [])) == 2:
        head, body = term["args"]
        goals = []
        while isinstance(body, dict) and body.get("functor") == "," and len(body["args"]) == 2:
            goals.append(body["args"][0])
            body = body["args"][1]
        goals.append(body)
        lines = [term_text(head, 1199) + " :-"]
        lines += [f"    {term_text(g, 999)}," for g in goals[:-1]]
        lines.append(f"    {term_text(goals[-1], 999)}.")
        return "\n".join(lines)
    return term_text(term, 1200) + "."

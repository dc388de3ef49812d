"""The predicate names a user of the SKB can call, for completion and for `:facts`.

Four kinds: *system* (the exports of ``cod_sys``: hardware and run-time facts
and the derived predicates of docs/skb-schema.md), *library* (the exports of
the stored-procedure modules), *app* (the user's own facts and procedures)
and *builtin* (the commonest sandbox-safe built-ins).  The sandbox does not
let a query enumerate predicates (``current_predicate/1`` is refused), so
system and library names are read from the module headers of the Prolog
files installed with this shell, which are the files the daemon loads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from cod.skb import library_dir
from cod.skb.session import PROLOG_DIR

SYSTEM_FILE = PROLOG_DIR / "cod_sys.pl"
# cod_sys exports these for the server (trusted writers); applications cannot call them usefully.
_NOT_FOR_USERS = re.compile(r"cod_sys_")

_MODULE_HEAD = re.compile(r":-\s*module\(\s*([a-z][A-Za-z0-9_]*)\s*,\s*\[(.*?)\]\s*\)\s*\.", re.S)
_PI = re.compile(r"([a-z][A-Za-z0-9_]*)\s*/\s*(\d+)")
_COMMENT = re.compile(r"%[^\n]*")

BUILTINS: tuple[tuple[str, int], ...] = (
    ("member", 2), ("memberchk", 2), ("append", 3), ("append", 2), ("length", 2), ("nth0", 3), ("nth1", 3),
    ("last", 2), ("reverse", 2), ("msort", 2), ("sort", 2), ("sort", 4), ("predsort", 3), ("list_to_set", 2),
    ("sum_list", 2), ("max_list", 2), ("min_list", 2), ("max_member", 2), ("min_member", 2), ("numlist", 3),
    ("exclude", 3), ("include", 3), ("partition", 4), ("maplist", 2), ("maplist", 3), ("maplist", 4),
    ("foldl", 4), ("findall", 3), ("findall", 4), ("bagof", 3), ("setof", 3), ("aggregate_all", 3),
    ("aggregate_all", 4), ("forall", 2), ("between", 3), ("succ", 2), ("plus", 3), ("is", 2),
    ("atom_length", 2), ("atom_concat", 3), ("atomic_list_concat", 2), ("atomic_list_concat", 3),
    ("sub_atom", 5), ("format", 2), ("format", 3), ("number_codes", 2), ("atom_number", 2),
    ("term_to_atom", 2), ("sumlist", 2), ("subtract", 3), ("intersection", 3), ("union", 3),
    ("delete", 3), ("select", 3), ("selectchk", 3), ("exclude", 3), ("pairs_keys_values", 3),
    ("once", 1), ("ignore", 1), ("true", 0), ("fail", 0), ("false", 0), ("sleep", 1),
)


@dataclass(frozen=True, order=True)
class Predicate:
    name: str
    arity: int
    kind: str  # "system" | "library" | "app" | "builtin"

    @property
    def indicator(self) -> str:
        return f"{self.name}/{self.arity}"


def module_exports(text: str) -> tuple[str, list[tuple[str, int]]]:
    """The module name and exported name/arity pairs of a Prolog module's text."""
    m = _MODULE_HEAD.search(_COMMENT.sub("", text))
    if m is None:
        raise ValueError("no ':- module(Name, [...]).' header")
    return m.group(1), [(n, int(a)) for n, a in _PI.findall(m.group(2))]


def system_predicates(path: Path = SYSTEM_FILE) -> list[Predicate]:
    try:
        _, exports = module_exports(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    return [Predicate(n, a, "system") for n, a in exports if not _NOT_FOR_USERS.match(n)]


def library_predicates(directory: Path | None = None) -> list[Predicate]:
    d = directory or library_dir()
    out: list[Predicate] = []
    for path in sorted(d.glob("*.pl")) if d.is_dir() else []:
        try:
            _, exports = module_exports(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        out.extend(Predicate(n, a, "library") for n, a in exports)
    return out


def builtin_predicates() -> list[Predicate]:
    return [Predicate(n, a, "builtin") for n, a in dict.fromkeys(BUILTINS)]


def parse_indicator(text: str) -> tuple[str, int | None]:
    """``"pu/4"`` -> ("pu", 4); ``"pu"`` -> ("pu", None)."""
    name, _, arity = text.strip().partition("/")
    if arity:
        if not arity.isdigit():
            raise ValueError(f"{text!r} is not a predicate indicator: the arity must be a number")
        return name, int(arity)
    return name, None


def clause_indicator(clause: str) -> str | None:
    """``"foo(1, 2)"`` or ``":-(bar(A), ...)"`` (list_facts's canonical text) -> "foo/2", "bar/1"."""
    text = clause.strip()
    if text.startswith(":-("):
        text = text[3:]
    m = re.match(r"([a-z][A-Za-z0-9_]*|'(?:[^'\\]|\\.|'')*')(\()?", text)
    if m is None:
        return None
    name = m.group(1)
    if not m.group(2):
        return f"{name}/0"
    depth, arity, i, quote = 1, 1, m.end(), ""
    while i < len(text) and depth:
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "'\"`":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 1:
            arity += 1
        i += 1
    return f"{name}/{arity}"

"""The shape the code keeps (docs/design.md): no class over 400 lines, no function over 80, in the
Python of rm/, skb/ and clients/, with no exception."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers.paths import REPO

ROOT = REPO
FOLDERS = ("rm", "skb", "clients")
MAX_CLASS = 400
MAX_FUNCTION = 80


def oversized(source: str, path: str) -> dict[tuple[str, str], int]:
    """Classes over MAX_CLASS and functions over MAX_FUNCTION lines in ``source``."""
    out: dict[tuple[str, str], int] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                size = child.end_lineno - child.lineno + 1  # type: ignore[operator]
                limit = MAX_CLASS if isinstance(child, ast.ClassDef) else MAX_FUNCTION
                if size > limit:
                    out[(path, name)] = size
                walk(child, f"{name}.")
            else:
                walk(child, prefix)

    walk(ast.parse(source), "")
    return out


def scan() -> dict[tuple[str, str], int]:
    found: dict[tuple[str, str], int] = {}
    for folder in FOLDERS:
        for file in sorted((ROOT / folder).rglob("*.py")):
            rel = file.relative_to(ROOT).as_posix()
            found.update(oversized(file.read_text(encoding="utf-8"), rel))
    return found


def test_no_class_or_function_over_the_limits():
    found = scan()
    assert not found, "over the limits (classes 400 lines, functions 80): " + ", ".join(
        f"{f}:{n} ({v} lines)" for (f, n), v in sorted(found.items()))


@pytest.mark.parametrize("body, limit, kind", [(MAX_FUNCTION, MAX_FUNCTION, "def"),
                                                (MAX_CLASS, MAX_CLASS, "class")])
def test_the_check_sees_one_line_over(body, limit, kind):
    header = "def f():\n" if kind == "def" else "class C:\n"
    fits = header + "    x = 1\n" * (limit - 1)
    over = fits + "    x = 1\n"
    assert oversized(fits, "t.py") == {}
    assert oversized(over, "t.py") == {("t.py", "f" if kind == "def" else "C"): limit + 1}

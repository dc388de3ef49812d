"""The shared conformance table (tests/data/conformance/cases.json): loading and matching.

The C client reads the same file (clients/c/tests/conformance.c) and matches with the same
rules, so the two clients can never drift apart.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CASES = Path(__file__).resolve().parents[1] / "data" / "conformance" / "cases.json"

KINDS = {
    "$int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "$number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "$string": lambda v: isinstance(v, str),
    "$list": lambda v: isinstance(v, list),
    "$object": lambda v: isinstance(v, dict),
}


def load_cases() -> list[dict[str, Any]]:
    return json.loads(CASES.read_text())["cases"]


def mismatch(expected: Any, got: Any, path: str = "") -> str | None:
    """Why `got` does not match `expected` (the rules in the file's $comment), or None."""
    if expected == "$any":
        return None
    if isinstance(expected, str) and expected in KINDS:
        return None if KINDS[expected](got) else f"{path or 'value'}: expected {expected}, got {got!r}"
    if isinstance(expected, str) and expected.startswith("~"):
        ok = isinstance(got, str) and expected[1:] in got
        return None if ok else f"{path or 'value'}: expected a string containing {expected[1:]!r}, got {got!r}"
    if isinstance(expected, dict):
        if not isinstance(got, dict):
            return f"{path or 'value'}: expected an object, got {got!r}"
        for key, value in expected.items():
            if key not in got:
                return f"{path}.{key}: missing"
            why = mismatch(value, got[key], f"{path}.{key}")
            if why:
                return why
        return None
    if isinstance(expected, list):
        if not isinstance(got, list) or len(got) != len(expected):
            return f"{path or 'value'}: expected a list of {len(expected)}, got {got!r}"
        for i, (e, g) in enumerate(zip(expected, got)):
            why = mismatch(e, g, f"{path}[{i}]")
            if why:
                return why
        return None
    if isinstance(expected, bool) or isinstance(got, bool) or type(expected) is not type(got):
        same = expected is got if isinstance(expected, bool) or isinstance(got, bool) else False
        return None if same else f"{path or 'value'}: expected {expected!r}, got {got!r}"
    return None if expected == got else f"{path or 'value'}: expected {expected!r}, got {got!r}"


def error_mismatch(expected: dict[str, Any], code: int, message: str, data: Any) -> str | None:
    if code != expected["code"]:
        return f"error code {code} ({message}), expected {expected['code']}"
    if "message" in expected:
        why = mismatch(expected["message"], message, "error.message")
        if why:
            return why
    if "data" in expected:
        return mismatch(expected["data"], data, "data")
    return None

"""What an application or task name may be.

Users name things as they like (``pg-main``, ``PostgreSQL 16``,
``duckdb.worker-1``, ``Zürich``): any printable UTF-8 text of 1 to
:data:`MAX_NAME_BYTES` bytes is accepted.  Only empty names, names that are
too long and names holding control characters (or unpaired surrogates,
which are not text) are refused.  Where a name becomes something else
(a Prolog atom, a cgroup directory) it is escaped there, injectively, so two
names never collide.
"""

from __future__ import annotations

import unicodedata

MAX_NAME_BYTES = 128


def name_problem(name: object) -> str | None:
    """Why ``name`` is not a valid name, or None when it is."""
    if not isinstance(name, str):
        return f"must be a string, not {type(name).__name__}"
    if not name:
        return "must not be empty"
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        return "holds an unpaired surrogate, which is not text"
    if size > MAX_NAME_BYTES:
        return f"is {size} bytes long; at most {MAX_NAME_BYTES} bytes of UTF-8"
    for ch in name:
        if unicodedata.category(ch) in ("Cc", "Cs", "Zl", "Zp"):
            return f"holds the control character U+{ord(ch):04X}; names must be printable"
    return None


def is_valid_name(name: object) -> bool:
    return name_problem(name) is None

"""What a user hands COD in a file: read up to a size, parsed down to a depth.

Every file a command reads because a user named it (a task list, an operator
graph, an hwloc export, a Prolog file, a script on standard input) is read
through :func:`read_bytes` or :func:`read_stream`: at most
:data:`MAX_INPUT_BYTES`, so ``/dev/zero`` or a pipe that never ends is refused
instead of filling memory.  JSON and TOML are parsed by :func:`loads_json` and
:func:`loads_toml`, which refuse values nested deeper than :data:`MAX_NESTING`
(Python's parsers recurse and would raise RecursionError far deeper; the code
that walks the value afterwards recurses too).  The hwloc XML reader bounds
its element depth with the same number.  Both limits are in docs/security.md.
"""

from __future__ import annotations

import json
import os
import stat
import tomllib
from pathlib import Path
from typing import Any, BinaryIO

from cod.protocol.errors import CodError

MAX_INPUT_BYTES = 16 << 20  # 16 MiB: a 4,096-CPU hwloc export is under 4 MiB
MAX_NESTING = 64  # levels of arrays/objects (JSON, TOML) or elements (XML); real inputs use under 16


class InputError(CodError):
    """A user's input is too large, endless or nested too deep; the message says which limit."""


def _too_large(limit: int) -> InputError:
    return InputError(f"larger than {limit >> 20} MiB (or endless): COD reads at most "
                      f"{limit >> 20} MiB of one input")


def read_bytes(path: str | Path, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The contents of ``path``, at most ``limit`` bytes; InputError beyond, OSError as open() raises it.

    A regular file is refused by its size before it is read; anything else (a device, a
    pipe, a FIFO) is read up to one byte past the limit."""
    with open(path, "rb") as f:
        info = os.fstat(f.fileno())
        if stat.S_ISREG(info.st_mode) and info.st_size > limit:
            raise _too_large(limit)
        return read_stream(f, limit)


def read_stream(stream: BinaryIO, limit: int = MAX_INPUT_BYTES) -> bytes:
    """What ``stream`` holds up to its end, at most ``limit`` bytes (standard input, a pipe)."""
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise _too_large(limit)
    return data


def nesting(value: Any) -> int:
    """How deep lists and dicts nest in ``value`` (a scalar: 0), without recursing."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def _too_deep() -> InputError:
    return InputError(f"nested deeper than {MAX_NESTING} levels of arrays and objects")


def _bounded(value: Any) -> Any:
    if nesting(value) > MAX_NESTING:
        raise _too_deep()
    return value


def loads_json(text: str | bytes) -> Any:
    """``json.loads(text)`` for a user's text: InputError when it nests deeper than MAX_NESTING,
    ValueError (json's) when it is not JSON."""
    try:
        return _bounded(json.loads(text))
    except RecursionError:
        raise _too_deep() from None


def loads_toml(text: str) -> Any:
    """``tomllib.loads(text)`` with the same bound; tomllib.TOMLDecodeError when it is not TOML."""
    try:
        return _bounded(tomllib.loads(text))
    except RecursionError:
        raise _too_deep() from None

"""CPU set notations: Linux cpulists, Linux hex masks and hwloc bitmaps.

Three text forms name a set of CPU (or node) numbers:

* Linux cpulist, e.g. ``0-3,8,10-11`` (``/sys/.../cpulist``, ``Cpus_allowed_list``);
  the kernel also accepts a stride form ``0-7:2/4`` (first 2 of every 4), which we read;
* Linux hex mask, e.g. ``0000,0000003f``: 32-bit hex words, most significant
  first, no ``0x`` (``cpumap``, ``shared_cpu_map``, ``thread_siblings``);
* hwloc bitmap, e.g. ``0x00006000,,0x00040000``: the same words with ``0x``;
  an empty word means zero and a leading ``0xf...f`` means every higher bit
  is set too (an infinite set).

Parsers are strict: anything else raises :class:`ValueError` with a message
saying what was wrong; readers add the file name and re-raise as FactsError.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_RANGE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+)/(\d+))?)?$")


def parse_cpulist(text: str) -> tuple[int, ...]:
    """``"0-3,8"`` -> ``(0, 1, 2, 3, 8)``; empty text is the empty set."""
    text = text.strip()
    if not text:
        return ()
    cpus: set[int] = set()
    for part in text.split(","):
        m = _RANGE.match(part.strip())
        if m is None:
            raise ValueError(f"bad cpulist item {part!r} in {text!r}")
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) is not None else first
        if last < first:
            raise ValueError(f"descending range {part!r} in cpulist {text!r}")
        if m.group(3) is not None:
            used, group = int(m.group(3)), int(m.group(4))
            if group == 0 or used == 0 or used > group:
                raise ValueError(f"bad stride {part!r} in cpulist {text!r}")
            cpus.update(c for c in range(first, last + 1) if (c - first) % group < used)
        else:
            cpus.update(range(first, last + 1))
    return tuple(sorted(cpus))


def format_cpulist(cpus: Iterable[int]) -> str:
    """``(0, 1, 2, 3, 8)`` -> ``"0-3,8"``; the empty set is ``""``."""
    ordered = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        parts.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(parts)


_HEX_WORD = re.compile(r"[0-9a-fA-F]{1,8}")
_MASK = re.compile(r"[0-9a-fA-F]{1,8}(?:,[0-9a-fA-F]{1,8})*")


def _bits_of_int(value: int) -> tuple[int, ...]:
    """Set bit numbers of ``value``, ascending (word by word: sets are sparse)."""
    out: list[int] = []
    base = 0
    while value:
        word = value & 0xFFFFFFFF
        while word:
            low = word & -word
            out.append(base + low.bit_length() - 1)
            word ^= low
        value >>= 32
        base += 32
    return tuple(out)


def _int_of_words(words: list[str]) -> int:
    """32-bit hex words, most significant first, each already validated."""
    return int("".join(w.zfill(8) for w in words) or "0", 16)


def parse_cpumask(text: str) -> tuple[int, ...]:
    """Linux hex mask ``"0000,0000003f"`` -> ``(0, 1, 2, 3, 4, 5)``."""
    text = text.strip()
    if not _MASK.fullmatch(text):
        raise ValueError(f"bad cpu mask {text[:80]!r} (expected hex words like 0000,0000003f)")
    return _bits_of_int(_int_of_words(text.split(",")))


def parse_hwloc_bitmap(text: str) -> tuple[tuple[int, ...], bool]:
    """hwloc bitmap -> (set bits of the finite part, infinite?).

    ``"0xf...f"`` alone is the full infinite set: ``((), True)``;
    ``"0xf...f,0x0000ffff"`` is bits 0-15 plus every bit from 32 up:
    ``((0, ..., 15), True)``.  The caller decides what an infinite tail means
    (for a machine's cpuset it is "every CPU there is").
    """
    text = text.strip()
    if not text:
        raise ValueError("empty hwloc bitmap")
    words_text = text.split(",")
    infinite = False
    if words_text[0].strip().lower() == "0xf...f":
        infinite = True
        words_text = words_text[1:]
    words = []
    for word in words_text:
        raw = word.strip()
        if raw == "":
            words.append("0")  # hwloc writes a zero word as nothing: "0x1,,0x2"
            continue
        if raw[:2].lower() != "0x" or not _HEX_WORD.fullmatch(raw[2:]):
            raise ValueError(f"bad hwloc bitmap word {word!r} in {text[:80]!r} "
                             "(expected 0x followed by up to 8 hex digits)")
        words.append(raw[2:])
    return _bits_of_int(_int_of_words(words)), infinite


def format_hwloc_bitmap(cpus: Iterable[int]) -> str:
    """The inverse of :func:`parse_hwloc_bitmap` for finite sets (hwloc's own spelling)."""
    ordered = sorted(set(cpus))
    if not ordered:
        return "0x0"
    n_words = ordered[-1] // 32 + 1
    words = [0] * n_words
    for cpu in ordered:
        words[cpu // 32] |= 1 << (cpu % 32)
    return ",".join("" if w == 0 and i not in (0, n_words - 1) else f"0x{w:08x}"
                    for i, w in reversed(list(enumerate(words))))

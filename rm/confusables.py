"""When a name would pass for another: Unicode's confusable detection (UTS #39), through ICU.

Two names *look alike* when their confusable skeletons agree (UTS #39 section 4, ICU's
``SpoofChecker.getSkeleton``, the data of Unicode's confusables.txt), compared without case.
Case folding and the skeleton do not commute, so each name has two keys and one agreeing is
enough: the skeleton of its NFKC case fold (``DB1`` ~ ``db1``, ``STRASSE`` ~ ``straße``,
fullwidth ``ｄｂ１`` ~ ``db1``) and the case fold of its skeleton (``dbI`` ~ ``db1``, where folding
first would turn the capital I into an i; Cyrillic ``ԁЬ1`` ~ ``db1``).  Runs of spaces count as
one.  A name is also refused on its own when it mixes scripts beyond UTS #39's *highly
restrictive* level (section 5.2: one script, or Latin with Han and kana, Bopomofo or Hangul;
digits, punctuation and spaces go with any), mixes digits of two numbering systems, or repeats a
combining mark (ICU's checks of the same names).

Pure functions of the names given; the keys of a name are computed once (:func:`keys` caches).
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from typing import Callable, Iterable

import icu

_CHECKS = icu.USpoofChecks
_CHECKER = icu.SpoofChecker()
_CHECKER.setRestrictionLevel(icu.URestrictionLevel.HIGHLY_RESTRICTIVE)
_CHECKER.setChecks(_CHECKS.RESTRICTION_LEVEL | _CHECKS.MIXED_NUMBERS | _CHECKS.INVISIBLE)
_ANY_SCRIPT = frozenset(["Common", "Inherited", "Unknown"])  # they go with every script
_SPACES = re.compile(" {2,}")
# What a refusal says of the comparison (every look-alike refusal: one wording).
LOOK_ALIKE_RULE = "names are compared by their Unicode confusable skeletons (UTS #39), case ignored"


def _skeleton(text: str) -> str:
    return _CHECKER.getSkeleton(0, _SPACES.sub(" ", text))  # the type argument is unused since ICU 58


def _folded_skeleton(name: str) -> str:
    """The skeleton of the name's NFKC case fold (UTS #31's NFKC_Casefold, as near as Python has it)."""
    return _skeleton(unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", name).casefold()))


def _skeleton_folded(name: str) -> str:
    """The case fold of the name's skeleton."""
    return unicodedata.normalize("NFD", _skeleton(unicodedata.normalize("NFKC", name)).casefold())


_KEYS: tuple[Callable[[str], str], ...] = (_folded_skeleton, _skeleton_folded)


@lru_cache(maxsize=8192)
def keys(name: str) -> tuple[str, ...]:
    """What :func:`look_alike` compares: one key per way of ignoring case."""
    return tuple(key(name) for key in _KEYS)


def look_alike(name: str, existing: Iterable[str]) -> str | None:
    """The first of ``existing`` that ``name`` looks like without being it, or None."""
    mine = keys(name)
    for other in existing:
        if other != name and any(a == b for a, b in zip(mine, keys(other))):
            return other
    return None


@lru_cache(maxsize=None)
def _numbered(key: Callable[[str], str], prefix: str, end: str) -> re.Pattern[str]:
    """The keys of ``prefix``, digits, ``end`` ("" for the end of the name), as a pattern."""
    digits = {key(str(d)): str(d) for d in range(10)}
    assert all(len(k) == 1 for k in digits), digits  # each digit's prototype is one character
    tail = re.escape(key(end)) if end else "$"
    return re.compile(re.escape(key(prefix)) + "([" + re.escape("".join(digits)) + "]+)" + tail)


def looks_numbered(name: str, prefix: str, end: str = "") -> int | None:
    """N when ``name`` looks like ``prefix`` N ``end`` in either case (``uidl000.``, ``UlD1000.``
    like ``uid1000.``), or None."""
    for key in _KEYS:
        for form in (prefix, prefix.upper()):
            match = _numbered(key, form, end).match(key(name))
            if match:
                back = {key(str(d)): str(d) for d in range(10)}
                return int("".join(back[c] for c in match.group(1)))
    return None


def _shown(ch: str) -> str:
    return repr(ch) if ch.isascii() else f"{ch!r} (U+{ord(ch):04X} {unicodedata.name(ch, '?')})"


def _scripts(name: str) -> str:
    """Each script of ``name`` with its first character: "'d' is Latin, 'Ь' (U+042C ...) is Cyrillic"."""
    first: dict[str, str] = {}
    for ch in name:
        script = icu.Script.getScript(ch).getName()
        if script not in _ANY_SCRIPT:
            first.setdefault(script, ch)
    return ", ".join(f"{_shown(ch)} is {script}" for script, ch in first.items())


def _numbering_systems(name: str) -> str:
    """The first digit of each numbering system in ``name``: "'1' and '١' (U+0661 ...)"."""
    first: dict[int, str] = {}
    for ch in name:
        if unicodedata.decimal(ch, None) is not None:
            first.setdefault(ord(ch) - unicodedata.decimal(ch), ch)
    return " and ".join(_shown(ch) for ch in first.values())


def script_problem(name: str) -> str | None:
    """Why ``name`` (NFC, visible characters) could pass for a name in another script, or None."""
    failed = _CHECKER.check(name)
    if failed & _CHECKS.RESTRICTION_LEVEL:
        return (f"mixes scripts ({_scripts(name)}); a name is written in one script (Latin may go with "
                f"Han, Hiragana, Katakana, Bopomofo or Hangul) so that it cannot pass for another name")
    if failed & _CHECKS.MIXED_NUMBERS:
        return f"mixes the digits of two numbering systems ({_numbering_systems(name)})"
    if failed & _CHECKS.INVISIBLE:
        return "repeats a combining mark on one letter, where the second cannot be seen"
    return None

"""What a name the daemon accepts may be: an application, task or elastic group name.

The wire's rule (:func:`cod.protocol.names.name_problem`: 1 to 128 bytes of
UTF-8 without control characters) plus what keeps two names from looking
alike (issue 23): a name is in Unicode normal form NFC, and holds no
invisible character (zero-width spaces and joiners, format characters,
fillers, variation selectors, spaces other than U+0020) and no bidirectional
control (U+202A..U+202E, U+2066..U+2069, the marks U+200E, U+200F, U+061C),
so ``vic\\u200btim`` and ``\\u202emitciv`` are refused rather than shown as
"victim".  Issue 47 adds: no space at either end (``db1 `` is refused, not stripped: the name a
client sent is the name it later uses), one script per name, digits of one numbering system, no
combining mark repeated (:func:`cod.rm.confusables.script_problem`).  A refusal says which
character, by code point and name.  Whether a name looks like one already in use is decided
where the names in use are known (the registry, admission), by :func:`cod.rm.confusables.look_alike`.
"""

from __future__ import annotations

import unicodedata

from cod.protocol.names import name_problem as wire_problem

from .confusables import looks_numbered, script_problem

# Invisible although not of a format category: fillers, the combining grapheme joiner,
# Khmer inherent vowels, Mongolian free variation selectors, variation selectors, the braille blank.
_INVISIBLE = frozenset([0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x180B, 0x180C, 0x180D, 0x180F, 0x2800, 0x3164,
                        0xFFA0, *range(0xFE00, 0xFE10), *range(0xE0100, 0xE01F0)])
_BIDI_CONTROLS = frozenset([0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)])


def name_problem(name: object) -> str | None:
    """Why ``name`` may not be used, or None when it may."""
    problem = wire_problem(name)
    if problem is not None:
        return problem
    assert isinstance(name, str)
    for ch in name:
        cat = unicodedata.category(ch)
        if cat in ("Cf", "Co", "Cn") or (cat == "Zs" and ch != " ") or ord(ch) in _INVISIBLE:
            what = unicodedata.name(ch, "unassigned or private")
            kind = "a bidirectional control" if ord(ch) in _BIDI_CONTROLS else "invisible"
            return (f"holds U+{ord(ch):04X} ({what}), which is {kind}; names must be made of visible "
                    f"characters so that two names cannot look alike")
    if unicodedata.normalize("NFC", name) != name:
        return "is not in Unicode normal form NFC (send it composed: unicodedata.normalize('NFC', name))"
    if name[0] == " " or name[-1] == " ":
        return (f"{'begins' if name[0] == ' ' else 'ends'} with a space, which cannot be seen; "
                f"send the name without it")
    return script_problem(name)



def other_task_name(pid: int) -> str:
    """A confined busy process's name in the allocator and the enforcer (its confinement is
    recorded and undone like any task's)."""
    return f"other.{pid}"


def other_pid(name: str) -> int | None:
    """The pid of an :func:`other_task_name`, None for a task's name."""
    prefix, _, pid = name.partition(".")
    return int(pid) if prefix == "other" and pid.isdigit() else None


def looks_like_other(name: str) -> bool:
    """``name`` is, or looks like, an :func:`other_task_name` (``other.123``, ``OTHER.l23``)."""
    return other_pid(name) is not None or looks_numbered(name, "other.") is not None

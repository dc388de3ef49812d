"""Text as it may reach a terminal: every character that is not printable, escaped.

Names come from files and from the daemon (a task list's task names, an hwloc
file's name, a stored fact's atoms): an ESC in one would otherwise move the
cursor, recolour or clear the screen, a newline would make one error two
lines, a bidirectional override would show a name reversed.  Each such
character is shown as its escape (``\\x1b``, ``\\n``, ``\\u202e``) instead; printable
text, accents and scripts included, is left as it is.  Every printer of the
``cod`` command and its shell writes through :func:`terminal_safe` (the shell's
output layer, clients/cli/shell/output.py, for each thing it prints).
"""

from __future__ import annotations

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(ch: str) -> str:
    code = ord(ch)
    if ch in _NAMED:
        return _NAMED[ch]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def terminal_safe(text: str) -> str:
    """``text`` with each character that str.isprintable() refuses (controls, format and
    separator characters but the space, surrogates, unassigned code points) escaped."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


def terminal_safe_lines(text: str) -> str:
    """``text`` of several lines made safe, its newlines kept (a table, a JSON document)."""
    if text.replace("\n", "").isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch == "\n" else _escape(ch) for ch in text)

"""How a client's values are shown back in error messages: bounded, whatever was sent.

A refusal names what was wrong, but a 5,000-digit number or a megabyte of
text is not repeated whole: a number is shown up to :data:`MAX_DIGITS`
digits, then by its length; a text is cut at :data:`MAX_TEXT` characters.
The daemon's reply to a bad request is then never larger than the request
(issue 23).
"""

from __future__ import annotations

import re
from typing import Any

MAX_DIGITS = 24  # more than any count of CPUs, bytes or ids a request means
MAX_TEXT = 1000  # characters of one error message
INT64 = 1 << 63


def number(value: Any) -> str:
    """``value`` as shown in a message: itself, or "a 5000-digit number"."""
    if isinstance(value, int) and not isinstance(value, bool):
        digits = len(str(abs(value))) if abs(value) < 10 ** 4000 else _digits(abs(value))
        if digits > MAX_DIGITS:
            return f"a {digits}-digit {'negative ' if value < 0 else ''}number"
    return str(value)


def _digits(value: int) -> int:
    # str() of an int over 4,300 digits may raise; its bit length tells the digits, to within one.
    d = int(value.bit_length() * 0.30102999566398120)
    return d + 1 if value >= 10 ** d else d


def count(value: Any, unit: str) -> str:
    """``3 cores``, or ``a 5000-digit number of cores``."""
    shown = number(value)
    return f"{shown} of {unit}" if shown.startswith("a ") else f"{shown} {unit}"


def datum(value: Any) -> Any:
    """``value`` as carried in an error's data: an integer beyond 64 bits becomes its description."""
    if isinstance(value, int) and not isinstance(value, bool) and not -INT64 <= value < INT64:
        return number(value)
    return value


def text(message: str, limit: int = MAX_TEXT) -> str:
    """``message`` cut to ``limit`` characters, saying how much was cut."""
    if len(message) <= limit:
        return message
    return f"{message[:limit]}... ({len(message) - limit} more characters not shown)"


_LONG_NUMBER = re.compile(r"\d{%d,}" % (MAX_DIGITS + 1))


def message(msg: str) -> str:
    """An error message as sent: every run of more than MAX_DIGITS digits by its length, then cut."""
    return text(_LONG_NUMBER.sub(lambda m: f"a {len(m.group())}-digit number", msg))


def request_id_problem(rid: Any) -> str | None:
    """Why a request id is refused (JSON-RPC allows any number or string; this daemon bounds them)."""
    if isinstance(rid, int) and not isinstance(rid, bool) and not -INT64 <= rid < INT64:
        return f"request id is {number(rid)}; ids are integers of at most 64 bits or strings of at most 128 characters"
    if isinstance(rid, str) and len(rid) > 128:
        return (f"request id is a string of {len(rid)} characters; ids are integers of at most 64 bits or "
                f"strings of at most 128 characters")
    return None

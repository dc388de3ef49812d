"""The pipe protocol between Python and the swipl child (no I/O here).

Requests are Prolog terms, one per line: ``req(Id, Operation).``  User text
(facts, clauses, goals) travels inside Prolog string literals and is parsed
by the engine, so nothing the user sends is ever read as a request.
Replies are one JSON object per line (skb/prolog/cod_server.pl).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterable

from .errors import SKBError

APP_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}\Z")

_PLAIN = re.compile(r'[^\\"\x00-\x1f\x7f]*')
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def prolog_string(text: str) -> str:
    """``text`` as a double-quoted Prolog string literal (ISO escapes)."""
    if not isinstance(text, str):
        raise SKBError("invalid", f"expected a string, got {type(text).__name__}")
    if _PLAIN.fullmatch(text):
        return f'"{text}"'
    out = ['"']
    for ch in text:
        esc = _ESCAPES.get(ch)
        if esc is not None:
            out.append(esc)
        elif ch < " " or ch == "\x7f":
            out.append(f"\\x{ord(ch):x}\\")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def prolog_string_list(texts: Iterable[str]) -> str:
    return "[" + ",".join(prolog_string(t) for t in texts) + "]"


def app_atom(app: str) -> str:
    if not isinstance(app, str) or not APP_NAME.match(app):
        raise SKBError(
            "invalid",
            f"invalid application name {app!r}: use [a-z][a-z0-9_]*, at most 64 characters",
        )
    return app


def number(value: float | int, what: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise SKBError("invalid", f"{what} must be a positive number, got {value!r}")
    return f"{value:.6f}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Op:
    """One engine operation: its Prolog text and how the journal keeps it.

    ``journal`` is None for reads; otherwise a key: replaying the journal
    after an engine restart rebuilds the state, and a newer entry with the
    same ``replaces`` key makes older ones obsolete.
    """

    text: str
    journal: bool = False
    app: str | None = None
    replaces: str | None = None


def load_system(prolog_text: str) -> Op:
    return Op(f"load_system({prolog_string(prolog_text)})", True, replaces="load_system")


def add_system_facts(facts: list[str]) -> Op:
    return Op(f"add_system_facts({prolog_string_list(facts)})", True)


def remove_system_facts(pattern: str) -> Op:
    return Op(f"remove_system_facts({prolog_string(pattern)})", True)


def replace_system_facts(pattern: str, facts: list[str]) -> Op:
    return Op(
        f"replace_system_facts({prolog_string(pattern)},{prolog_string_list(facts)})",
        True,
        replaces=f"replace:{pattern}",
    )


def add_facts(app: str, facts: list[str]) -> Op:
    return Op(f"add_facts({app_atom(app)},{prolog_string_list(facts)})", True, app=app)


def remove_facts(app: str, pattern: str) -> Op:
    return Op(f"remove_facts({app_atom(app)},{prolog_string(pattern)})", True, app=app)


def add_procedure(app: str, text: str) -> Op:
    return Op(f"add_procedure({app_atom(app)},{prolog_string(text)})", True, app=app)


def drop_app(app: str) -> Op:
    return Op(f"drop_app({app_atom(app)})", True, app=app)


def load_library(path: str) -> Op:
    return Op(f"load_library({prolog_string(path)})", True)


def list_facts(app: str, predicate: str | None) -> Op:
    if predicate is None:
        sel = "all"
    else:
        m = re.fullmatch(r"([a-z][A-Za-z0-9_]*)(?:/(\d+))?", predicate)
        if not m:
            raise SKBError("invalid", f"invalid predicate {predicate!r}: use name or name/arity")
        sel = m.group(1) if m.group(2) is None else f"{m.group(1)}/{m.group(2)}"
    return Op(f"list_facts({app_atom(app)},{sel})")


def query(
    app: str,
    goal: str,
    *,
    all_solutions: bool,
    max_solutions: int,
    timeout_s: float,
    inference_limit: int | None,
) -> Op:
    opts = _query_options(all_solutions, max_solutions, timeout_s, inference_limit)
    return Op(f"query({app_atom(app)},{prolog_string(goal)},{opts})")


@lru_cache(maxsize=64)
def _query_options(
    all_solutions: bool, max_solutions: int, timeout_s: float, inference_limit: int | None
) -> str:
    # Cached: queries nearly always use the same options, and this is on the hot path.
    opts = [
        f"all({'true' if all_solutions else 'false'})",
        f"max_solutions({number(int(max_solutions), 'max_solutions')})",
        f"time_limit({number(float(timeout_s), 'timeout_s')})",
    ]
    if inference_limit is not None:
        opts.append(f"inference_limit({number(int(inference_limit), 'inference_limit')})")
    return "[" + ",".join(opts) + "]"


def snapshot() -> Op:
    return Op("snapshot")


def restore_system(facts: list[str]) -> Op:
    return Op(f"restore_system({prolog_string_list(facts)})", True, replaces="system")


def time_query(app: str, goal: str, times: int) -> Op:
    return Op(f"time_query({app_atom(app)},{prolog_string(goal)},{number(times, 'times')})")


def request_line(request_id: int, op: Op) -> bytes:
    return f"req({request_id},{op.text}).\n".encode("utf-8")


class StaleReply(Exception):
    """The reply to an earlier request whose caller gave up waiting (cancelled)."""


def decode_reply(line: bytes, request_id: int) -> Any:
    """The ``ok`` value of a reply line, or raise its :class:`SKBError`.

    Raises :class:`StaleReply` for the answer to an earlier request: the
    caller skips it and reads on, so one abandoned call cannot shift every
    later answer onto the wrong request."""
    try:
        reply = json.loads(line)
    except ValueError as err:
        raise SKBError("engine", f"unreadable reply from the engine: {line[:200]!r}") from err
    rid = reply.get("id")
    if isinstance(rid, int) and 0 < rid < request_id:
        raise StaleReply(rid)
    if rid != request_id:
        raise SKBError("engine", f"reply for request {reply.get('id')} while waiting for {request_id}")
    if "ok" in reply:
        return reply["ok"]
    err = reply.get("error") or {}
    raise SKBError(
        str(err.get("code", "engine")), str(err.get("message", "unknown error")), err.get("data") or {}
    )

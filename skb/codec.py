"""The operations of the SKB server's control channel, as Prolog text (no I/O here).

Requests are Prolog terms, one per line: ``req(Id, Operation).``  User text
(facts, clauses, goals, names) travels inside Prolog string literals or
quoted atoms written by :mod:`cod.protocol.prolog_text`, and is parsed by
the engine, so nothing a user sends is ever read as a request.  Replies are
one JSON object per line (skb/prolog/cod_server.pl), in any order: the
engine runs queries on many threads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterable, Mapping

from cod.protocol.jsonrpc import loads
from cod.protocol.names import name_problem
from cod.protocol.prolog_text import PrologTextError, atom, string, string_list

from .errors import SKBError


def app_atom(app: str) -> str:
    problem = name_problem(app)
    if problem is not None:
        raise SKBError("invalid", f"invalid application name {app!r}: {problem}")
    return atom(app)


def number(value: float | int, what: str) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise SKBError("invalid", f"{what} must be a finite positive number, got {value!r}")
    return f"{value:.6f}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Limits:
    """How much an application may hold after a write (None: no limit)."""

    facts: int | None = None
    fact_chars: int | None = None
    clauses: int | None = None
    clause_chars: int | None = None

    def text(self) -> str:
        if self == NO_LIMITS:
            return "none"
        big = 1 << 62
        values = (self.facts, self.fact_chars, self.clauses, self.clause_chars)
        return "limits(" + ",".join(str(big if v is None else max(0, v)) for v in values) + ")"


NO_LIMITS = Limits()

# A fact is held by a connection of its application (an integer id) or kept
# after the application's last connection leaves.
PERSISTENT = "persistent"
Owner = int | str


def owner_term(owner: Owner) -> str:
    if owner == PERSISTENT:
        return "persistent"
    if isinstance(owner, int) and not isinstance(owner, bool) and owner >= 0:
        return f"conn({owner})"
    raise SKBError("invalid", f"a fact's owner is a connection id or {PERSISTENT!r}, not {owner!r}")


@dataclass(frozen=True)
class Op:
    """One engine operation: its Prolog text, and how the journal keeps it.

    ``journal`` is False for reads; a write is journalled so that a restarted
    engine can be rebuilt.  ``replaces`` are keys: a newer entry with a key
    makes older entries with that key obsolete.  ``app`` is the application
    the operation concerns (``drop_app`` forgets all its entries).
    """

    text: str
    journal: bool = False
    app: str | None = None
    replaces: frozenset[str] = frozenset()
    drops: frozenset[str] = frozenset()  # keys whose entries this one cancels (and is not kept itself)


def _system(text: str, *replaces: str) -> Op:
    return Op(text, True, replaces=frozenset(replaces))


# ---- system-level facts (the Resource Manager and administrators) ------------------------------
def load_system(prolog_text: str) -> Op:
    return _system(f"load_system({string(prolog_text)})", "load_system")


def add_system_facts(facts: Iterable[str]) -> Op:
    return _system(f"add_system_facts({string_list(facts)})")


def remove_system_facts(pattern: str) -> Op:
    return _system(f"remove_system_facts({string(pattern)})")


def replace_system_facts(pattern: str, facts: Iterable[str]) -> Op:
    return _system(f"replace_system_facts({string(pattern)},{string_list(facts)})", f"replace:{pattern}")


def replace_many(replacements: Mapping[str, Iterable[str]]) -> Op:
    """Several replacements in one transaction: no reader sees some done and others not."""
    pairs = ",".join(f"{string(p)}-{string_list(f)}" for p, f in replacements.items())
    return _system(f"replace_many([{pairs}])", *(f"replace:{p}" for p in replacements))


def restore_system(facts: list[str]) -> Op:
    return _system(f"restore_system({string_list(facts)})", "system")


# ---- application facts and procedures ----------------------------------------------------------
def add_facts(app: str, owner: Owner, facts: Iterable[str], limits: Limits = NO_LIMITS) -> Op:
    return Op(f"add_facts({app_atom(app)},{owner_term(owner)},{string_list(facts)},{limits.text()})",
              True, app=app)


def remove_facts(app: str, patterns: Iterable[str]) -> Op:
    return Op(f"remove_facts({app_atom(app)},{string_list(patterns)})", True, app=app)


def add_procedure(app: str, text: str, persistent: bool = False, limits: Limits = NO_LIMITS) -> Op:
    flag = "true" if persistent else "false"
    return Op(f"add_procedure({app_atom(app)},{string(text)},{flag},{limits.text()})", True, app=app)


def drop_owner(app: str, owner: Owner) -> Op:
    return Op(f"drop_owner({app_atom(app)},{owner_term(owner)})", True, app=app)


def release_app(app: str) -> Op:
    return Op(f"release_app({app_atom(app)})", True, app=app)


def drop_app(app: str) -> Op:
    return Op(f"drop_app({app_atom(app)})", True, app=app, drops=frozenset({f"app:{app}"}))


def restore_app(app: str, state: Mapping[str, Any]) -> Op:
    facts = ",".join(
        f"{string(text)}-[{','.join(owner_term(o) for o in owners)}]" for text, owners in state.get("facts", []))
    procs = ",".join(f"{string(text)}-{'true' if p else 'false'}" for text, p in state.get("procedures", []))
    declared = ",".join(f"{atom(name)}/{int(arity)}" for name, arity in state.get("declared", []))
    return Op(f"restore_app({app_atom(app)},state([{facts}],[{procs}],[{declared}]))", True, app=app)


def load_library(path: str) -> Op:
    return Op(f"load_library({string(path)})", True)


def batch(ops: list[Op]) -> Op:
    """Several writes as one: all or nothing, and no reader sees part of them."""
    if any(not o.journal or o.text.startswith(("batch(", "snapshot")) for o in ops):
        raise SKBError("invalid", "only single writes can be batched")
    apps = {o.app for o in ops}
    return Op(f"batch([{','.join(o.text for o in ops)}])", True,
              app=apps.pop() if len(apps) == 1 else None,
              replaces=frozenset().union(*(o.replaces for o in ops)) if all(o.replaces for o in ops) else frozenset())


# ---- the direct channel's capabilities ---------------------------------------------------------
_TOKEN = re.compile(r"[0-9a-f]{16,128}\Z")


Client = tuple[int, bool]  # whom a query runs for: the peer's uid, and whether it is privileged


def _uid(client: Client) -> int:
    uid = client[0]
    if isinstance(uid, bool) or not isinstance(uid, int) or uid < 0:
        raise SKBError("invalid", f"a uid is a non-negative integer, got {uid!r}")
    return uid


def client_term(client: Client) -> str:
    return f"client({_uid(client)},{'true' if client[1] else 'false'})"


def grant(token: str, app: str, client: Client | None = None) -> Op:
    """``client``: whose connections the token opens (the direct channel's per-uid caps); none: the daemon's."""
    if not _TOKEN.match(token):
        raise SKBError("invalid", "a capability token is 16..128 lower-case hex digits")
    whom = "" if client is None else f",{client_term(client)}"
    return Op(f"grant({atom(token)},{app_atom(app)}{whom})", True, replaces=frozenset({f"token:{token}"}))


def revoke(token: str) -> Op:
    if not _TOKEN.match(token):
        raise SKBError("invalid", "a capability token is 16..128 lower-case hex digits")
    return Op(f"revoke({atom(token)})", True, drops=frozenset({f"token:{token}"}))


# ---- reads -------------------------------------------------------------------------------------
def list_facts(app: str, predicate: str | None) -> Op:
    if predicate is None:
        sel = "all"
    else:
        m = re.fullmatch(r"([a-z][A-Za-z0-9_]*)(?:/(\d+))?", predicate)
        if not m:
            raise SKBError("invalid", f"invalid predicate {predicate!r}: use name or name/arity")
        sel = m.group(1) if m.group(2) is None else f"{m.group(1)}/{m.group(2)}"
    return Op(f"list_facts({app_atom(app)},{sel})")


def list_procedures(app: str) -> Op:
    return Op(f"list_procedures({app_atom(app)})")


def usage(app: str) -> Op:
    return Op(f"usage({app_atom(app)})")


def describe_app(app: str) -> Op:
    """The app's procedures (with their text) and how many facts each predicate holds."""
    return Op(f"describe_app({app_atom(app)})")


PREDICATE_KINDS = ("system", "library", "app", "all")


def predicates(app: str, kind: str) -> Op:
    """The predicates the app's code may call, of one kind (PREDICATE_KINDS)."""
    if kind not in PREDICATE_KINDS:
        raise SKBError("invalid", f"invalid predicate kind {kind!r}: use one of {', '.join(PREDICATE_KINDS)}")
    return Op(f"predicates({app_atom(app)},{kind})")


def abandon(tag: str) -> Op:
    """The client of ``tag`` is gone: stop its running queries, answer its queued ones without running."""
    return Op(f"abandon({atom(tag)})")


def cancel(tag: str) -> Op:
    """Stop every query running for ``tag`` (a client's capability token); the reply counts them."""
    return Op(f"cancel({atom(tag)})")


def query(app: str, goal: str, *, all_solutions: bool, max_solutions: int, timeout_s: float,
          inference_limit: int | None, tag: str | None = None, client: Client | None = None) -> Op:
    """``client``: whom the query runs for (the pool's per-uid shares); none: the daemon."""
    opts = _query_options(all_solutions, max_solutions, timeout_s, inference_limit)
    if tag is not None:
        opts = f"[tag({atom(tag)}),{opts[1:]}"
    if client is not None:
        opts = f"[uid({_uid(client)}),privileged({'true' if client[1] else 'false'}),{opts[1:]}"
    return Op(f"query({app_atom(app)},{string(goal)},{opts})")


@dataclass(frozen=True)
class Staged:
    """A change evaluate() applies in a discarded snapshot before reading queries."""

    facts: tuple[str, ...] = ()
    owner: Owner = PERSISTENT
    procedures: tuple[tuple[str, bool], ...] = ()  # (text, persistent)
    limits: Limits = NO_LIMITS


def evaluate(app: str, staged: Staged, queries: Iterable[tuple[str, str | None]], *, timeout_s: float,
             inference_limit: int | None, round_limit_s: float | None = None, client: Client | None = None) -> Op:
    """Each (goal, var) query's first value of var (var None: every binding of the first solution),
    as the namespace would be after ``staged``.  ``round_limit_s``: no query starts once the
    evaluation has run this long (those left are answered ``skipped``); ``client``: whom it runs
    for (the pool's per-uid shares); none: the daemon."""
    changes = [f"procedure({string(t)},{'true' if p else 'false'},{staged.limits.text()})"
               for t, p in staged.procedures]
    if staged.facts:
        changes.append(f"facts({owner_term(staged.owner)},{string_list(staged.facts)},{staged.limits.text()})")
    qs = ",".join(f"first({string(g)})" if v is None else f"query({string(g)},{string(v)})" for g, v in queries)
    opts = _query_options(False, 1, timeout_s, inference_limit)
    if round_limit_s is not None:
        opts = f"[round_limit({number(float(round_limit_s), 'round_limit_s')}),{opts[1:]}"
    if client is not None:
        opts = f"[uid({_uid(client)}),privileged({'true' if client[1] else 'false'}),{opts[1:]}"
    return Op(f"evaluate({app_atom(app)},[{','.join(changes)}],[{qs}],{opts})")


def time_query(app: str, goal: str, times: int) -> Op:
    return Op(f"time_query({app_atom(app)},{string(goal)},{number(times, 'times')})")


def snapshot() -> Op:
    return Op("snapshot")


PING = Op("ping")
STATS = Op("stats")


@lru_cache(maxsize=64)
def _query_options(all_solutions: bool, max_solutions: int, timeout_s: float, inference_limit: int | None) -> str:
    # Cached: queries nearly always use the same options, and this is on the hot path.
    opts = [
        f"all({'true' if all_solutions else 'false'})",
        f"max_solutions({number(int(max_solutions), 'max_solutions')})",
        f"time_limit({number(float(timeout_s), 'timeout_s')})",
    ]
    if inference_limit is not None:
        opts.append(f"inference_limit({number(int(inference_limit), 'inference_limit')})")
    return "[" + ",".join(opts) + "]"


def request_line(request_id: int, op: Op) -> bytes:
    return f"req({request_id},{op.text}).\n".encode("utf-8")


def encode_request(request_id: int, op: Op) -> bytes:
    try:
        return request_line(request_id, op)
    except UnicodeEncodeError as err:
        raise SKBError("invalid", f"text holds an unpaired surrogate: {err.reason}") from None


_REPLY_ID = re.compile(rb'\{"id":(\d+),')


def decode_reply(line: bytes) -> tuple[int, Any]:
    """(request id, result) of a reply line; the result of an error reply is its :class:`SKBError`."""
    try:
        reply = loads(line)
    except (ValueError, RecursionError) as err:
        m = _REPLY_ID.match(line)
        if m is None:
            raise SKBError("engine", f"unreadable reply from the engine: {line[:200]!r}") from err
        # Its caller gets the error; nobody waits for an answer that will not come.
        return int(m.group(1)), SKBError("engine", f"the engine's answer could not be read: {err}")
    rid = reply.get("id") if isinstance(reply, dict) else None
    if not isinstance(rid, int):
        raise SKBError("engine", f"reply without a request id: {line[:200]!r}")
    if "ok" in reply:
        return rid, reply["ok"]
    err = reply.get("error") or {}
    return rid, SKBError(str(err.get("code", "engine")), str(err.get("message", "unknown error")),
                         err.get("data") or {})


__all__ = ["Op", "Limits", "NO_LIMITS", "PERSISTENT", "Staged", "SKBError", "PrologTextError"]

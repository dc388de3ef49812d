"""Knowledge: the facts, stored procedures and queries of a `Client`'s application in the SKB.

Every write carries a request key (docs/protocol.md, "Write outcomes"): one the caller gives, else
a fresh random one.  A write whose outcome is not known (the daemon's -32080, no reply in time, a
connection lost after sending) raises `OutcomeUnknown`; `retry(err)` sends it again with its key
and gets its first outcome, so it is never applied twice and the held state learns the truth.
"""

from __future__ import annotations

import secrets
from typing import Any

from cod.protocol.jsonrpc import OUTCOME_UNKNOWN, REQUEST_KEY

from .errors import CallTimeout, ConnectionLost, OutcomeUnknown, ProtocolMismatch, ReplyLost, RMError
from .direct import DirectQueries
from .parts import log

WRITES = ("add_facts", "remove_facts", "add_procedure")


def new_request_key() -> str:
    """A request key nobody else picks: 128 random bits in hex."""
    return secrets.token_hex(16)


class Knowledge(DirectQueries):
    """The knowledge part of `Client`: facts, procedures (held for a reconnection) and queries."""

    def add_fact(self, fact: str, *, persistent: bool = False, request_key: str | None = None) -> int:
        return self.add_facts([fact], persistent=persistent, request_key=request_key)

    def add_facts(self, facts: list[str], *, scope: str = "app", persistent: bool = False,
                  request_key: str | None = None) -> int:
        """Add facts (all or none) to this application's namespace, or with scope="system" (root only)."""
        params = {"facts": list(facts), "scope": scope, "persistent": persistent}
        return self._write("add_facts", params, request_key)["added"]

    def remove_facts(self, patterns: str | list[str], *, scope: str = "app", request_key: str | None = None) -> int:
        """Retract every fact matching the pattern(s), e.g. "db_rtime(_)"; returns how many went."""
        pats = [patterns] if isinstance(patterns, str) else list(patterns)
        return self._write("remove_facts", {"patterns": pats, "scope": scope}, request_key)["removed"]

    def add_procedure(self, text: str, *, persistent: bool = False, request_key: str | None = None) -> list[str]:
        """Add clauses (a stored procedure) to this application; returns ["name/arity", ...]."""
        return self._write("add_procedure", {"text": text, "persistent": persistent}, request_key)["predicates"]

    def retry(self, err: OutcomeUnknown) -> Any:
        """Send a write whose outcome was unknown again, with its request key: the daemon's result
        (``{"added": n}``, ...) of its first run, or that run's error; OutcomeUnknown again while it
        is still under way.  On a new connection (after a reconnection) the key is not known there
        and the write runs again, which is what the new connection needs."""
        if err.method not in WRITES or err.params is None:
            raise ValueError("retry takes an OutcomeUnknown raised by add_facts, remove_facts or add_procedure")
        params = {k: v for k, v in err.params.items() if k != REQUEST_KEY}
        return self._write(err.method, params, err.request_key)

    def _write(self, method: str, params: dict[str, Any], request_key: str | None) -> dict[str, Any]:
        """One write with its key; its outcome, noted in the held state when it took effect."""
        sent = {**params, REQUEST_KEY: request_key or new_request_key()}
        try:
            result = self.call(method, sent)
        except OutcomeUnknown as err:  # the daemon's answer: it says why and which key
            err.method, err.params = method, sent
            raise
        except (CallTimeout, ReplyLost) as err:  # sent, and no answer came
            key = sent[REQUEST_KEY]
            unknown = OutcomeUnknown(OUTCOME_UNKNOWN, f"{err}; the write may or may not take effect: retry(err) "
                                                      f"sends it again with request_key {key!r}", {REQUEST_KEY: key})
            unknown.method, unknown.params = method, sent
            raise unknown from err
        with self._state_lock:
            if method == "add_facts":
                self._held.added(params["facts"], params["scope"], params["persistent"])
            elif method == "remove_facts":
                self._held.removed(params["patterns"], params["scope"])
            else:
                self._held.procedure(params["text"], params["persistent"], result["predicates"])
        return result

    def execute_query(self, goal: str, *, all_solutions: bool = True, timeout_s: float | None = None,
                      max_solutions: int | None = None) -> list[dict[str, Any]]:
        """Run a goal; one dict per solution, variable name to value."""
        params: dict[str, Any] = {"goal": goal}
        if not all_solutions:
            params["all_solutions"] = False
        if timeout_s is not None:
            params["timeout_s"] = timeout_s
        if max_solutions is not None:
            params["max_solutions"] = max_solutions
        direct = self._direct or self._reopen_direct()
        if direct is not None and direct.lock.acquire(blocking=False):
            # The calling thread talks to the SKB itself: one hop, no thread hand-off.
            # (A second concurrent caller takes the daemon's road instead of waiting.)
            try:
                return direct.call("execute_query", params, self.call_timeout_s)["solutions"]
            except (OSError, ConnectionLost, ProtocolMismatch) as err:
                log.info("direct query channel lost (%s); querying through the RM", err)
                self._drop_direct(direct)
            except RMError as err:
                if err.code != -32010:
                    raise
                log.info("the direct query channel's capability was refused; querying through the RM")
                self._drop_direct(direct)
            finally:
                direct.lock.release()
        return self.call("execute_query", params)["solutions"]

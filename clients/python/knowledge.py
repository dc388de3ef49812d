"""Knowledge: the facts, stored procedures and queries of a `Client`'s application in the SKB."""

from __future__ import annotations

from typing import Any

from .errors import ConnectionLost, ProtocolMismatch, RMError
from .direct import DirectQueries
from .parts import log


class Knowledge(DirectQueries):
    """The knowledge part of `Client`: facts, procedures (held for a reconnection) and queries."""

    def add_fact(self, fact: str, *, persistent: bool = False) -> int:
        return self.add_facts([fact], persistent=persistent)

    def add_facts(self, facts: list[str], *, scope: str = "app", persistent: bool = False) -> int:
        """Add facts (all or none) to this application's namespace, or with scope="system" (root only)."""
        facts = list(facts)
        n = self.call("add_facts", {"facts": facts, "scope": scope, "persistent": persistent})["added"]
        with self._state_lock:
            self._held.added(facts, scope, persistent)
        return n

    def remove_facts(self, patterns: str | list[str], *, scope: str = "app") -> int:
        """Retract every fact matching the pattern(s), e.g. "db_rtime(_)"; returns how many went."""
        pats = [patterns] if isinstance(patterns, str) else list(patterns)
        n = self.call("remove_facts", {"patterns": pats, "scope": scope})["removed"]
        with self._state_lock:
            self._held.removed(pats, scope)
        return n

    def add_procedure(self, text: str, *, persistent: bool = False) -> list[str]:
        """Add clauses (a stored procedure) to this application; returns ["name/arity", ...]."""
        preds = self.call("add_procedure", {"text": text, "persistent": persistent})["predicates"]
        with self._state_lock:
            self._held.procedure(text, persistent, preds)
        return preds

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

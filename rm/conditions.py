"""Condition subscriptions: a goal over the SKB that a client wants to hear about when it turns true or false.

Pure rules, no I/O: :func:`step` takes a condition and the result of its
latest evaluation and says what to tell the subscriber (the goal became true,
with the bindings of its first solution, or false again) or whether to drop
it (it kept failing with errors).  The ResourceManager evaluates the goals
after each change of what they can read and carries the outcomes out: one
application's in one round under its own time budget in the SKB, where the
goals a round had no time left for are ``skipped`` and go first in the next
(:meth:`ConditionWatch.of_app`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Consecutive evaluations that end in an error before the subscription is dropped.
MAX_ERRORS = 5


@dataclass
class Condition:
    sub_id: int
    conn_id: int
    app: str
    goal: str
    state: bool | None = None  # None: not evaluated yet
    errors: int = 0
    skipped: int = 0  # rounds in a row that ended before its turn


@dataclass(frozen=True)
class Outcome:
    notify: dict[str, Any] | None = None  # the upcall's payload (without the subscription id)
    drop: str | None = None  # why the subscription ends


def step(cond: Condition, result: dict[str, Any]) -> Outcome:
    """Apply one evaluation result ({"bindings": ...} | {"none": true} | {"error": {...}} |
    {"skipped": true}: its round's budget was spent before its turn) to ``cond``."""
    if "skipped" in result:
        cond.skipped += 1
        return Outcome()
    cond.skipped = 0
    if "error" in result:
        cond.errors += 1
        if cond.errors >= MAX_ERRORS:
            message = str(result["error"].get("message", "error"))
            return Outcome(drop=f"its goal failed {cond.errors} times in a row; last: {message}")
        return Outcome()
    cond.errors = 0
    now = "bindings" in result
    if now == cond.state:
        return Outcome()
    cond.state = now
    return Outcome(notify={"event": "condition", "goal": cond.goal, "state": now,
                           "bindings": result.get("bindings", {}) if now else {}})


@dataclass
class ConditionWatch:
    """Every condition subscription, by subscription id."""

    conditions: dict[int, Condition] = field(default_factory=dict)

    def of_app(self, app: str) -> list[Condition]:
        """The application's conditions in the order of its next round: those skipped longest
        first, then in the order they were made (so every one has its turn)."""
        return sorted((c for c in self.conditions.values() if c.app == app), key=lambda c: -c.skipped)

    def apps(self) -> set[str]:
        return {c.app for c in self.conditions.values()}

    def forget_connection(self, conn_id: int) -> None:
        for sid in [s for s, c in self.conditions.items() if c.conn_id == conn_id]:
            del self.conditions[sid]

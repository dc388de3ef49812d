"""Condition subscriptions: a goal over the SKB that a client wants to hear about when it turns true or false.

Pure rules, no I/O: :func:`step` takes a condition and the result of its
latest evaluation and says what to tell the subscriber (the goal became true,
with the bindings of its first solution, or false again) or whether to drop
it (it kept failing with errors).  The ResourceManager evaluates the goals
after each change of what they can read and carries the outcomes out.
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


@dataclass(frozen=True)
class Outcome:
    notify: dict[str, Any] | None = None  # the upcall's payload (without the subscription id)
    drop: str | None = None  # why the subscription ends


def step(cond: Condition, result: dict[str, Any]) -> Outcome:
    """Apply one evaluation result ({"bindings": ...} | {"none": true} | {"error": {...}}) to ``cond``."""
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
        return [c for c in self.conditions.values() if c.app == app]

    def apps(self) -> set[str]:
        return {c.app for c in self.conditions.values()}

    def forget_connection(self, conn_id: int) -> None:
        for sid in [s for s, c in self.conditions.items() if c.conn_id == conn_id]:
            del self.conditions[sid]

"""What a client holds on the daemon now, so a reconnection can put it back.

Compacted as it changes: a fact removed by pattern is dropped from the
facts added before (unification, :mod:`cod.protocol.terms`), a procedure
sent again replaces its earlier text, an unsubscription forgets the
subscription.  So a reconnection costs what is held, not the history: 500
updates of one SLA fact replay as one fact.  Only a removal whose pattern
(or an earlier fact) this client cannot read is kept as an operation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cod.protocol import terms


@dataclass
class FactOp:
    kind: str  # "add" | "remove"
    texts: list[str]
    scope: str
    persistent: bool = False


@dataclass
class HeldState:
    fact_ops: list[FactOp] = field(default_factory=list)
    procedures: dict[frozenset[str], tuple[str, bool]] = field(default_factory=dict)  # predicates -> (text, persistent)
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> register_task params

    def added(self, facts: list[str], scope: str, persistent: bool) -> None:
        held = {t for op in self.fact_ops if op.kind == "add" and op.scope == scope for t in op.texts}
        new = [f for f in dict.fromkeys(facts) if f not in held]
        if new:
            self.fact_ops.append(FactOp("add", new, scope, persistent))

    def removed(self, patterns: list[str], scope: str) -> None:
        readable = [terms.read(p) for p in patterns]
        exact = all(r is not None for r in readable)
        kept: list[FactOp] = []
        for op in self.fact_ops:
            if op.kind == "add" and op.scope == scope:
                left = []
                for text in op.texts:
                    fact = terms.read(text)
                    if fact is None:
                        exact = False
                        left.append(text)
                    elif not any(r is not None and terms.unifiable(r, fact) for r in readable):
                        left.append(text)
                if not left:
                    continue
                op = FactOp("add", left, op.scope, op.persistent)
            kept.append(op)
        if not exact:  # something could not be matched here: the daemon must do it again
            kept.append(FactOp("remove", list(patterns), scope))
        self.fact_ops = kept

    def procedure(self, text: str, persistent: bool, predicates: list[str]) -> None:
        key = frozenset(predicates)
        # A procedure that redefines some of an earlier one's predicates replaces them there.
        for old in [k for k in self.procedures if k & key]:
            if old <= key:
                del self.procedures[old]
        self.procedures[key] = (text, persistent)

    def size(self) -> int:
        """Operations a reconnection replays."""
        return sum(1 for _ in self.fact_ops) + len(self.procedures) + len(self.tasks)

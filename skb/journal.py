"""What a restarted engine must be told to be what it was: every write that succeeded.

Entries that later ones make obsolete are dropped as they come (see
:meth:`Journal.record`); churn that cannot be dropped that way (facts added
and removed, tasks coming and going) is folded by :meth:`Journal.compact`
into a snapshot of the engine's state once the journal has doubled.
"""

from __future__ import annotations

from typing import Any

from . import codec
from .codec import Op


class Journal:
    COMPACT_AT_LEAST = 1000

    def __init__(self) -> None:
        self._ops: list[Op] = []
        self._compact_at = self.COMPACT_AT_LEAST

    def record(self, op: Op) -> None:
        if not op.journal:
            return
        if op.drops:
            apps = {k[4:] for k in op.drops if k.startswith("app:")}
            self._ops = [o for o in self._ops
                         if not (o.replaces & op.drops) and not (o.app is not None and o.app in apps)]
            if apps:
                return  # the application is gone: nothing of it to replay
            if not op.text.startswith("revoke("):
                self._ops.append(op)
            return
        if op.replaces:
            self._ops = [o for o in self._ops if not (o.replaces and o.replaces <= op.replaces)]
        self._ops.append(op)

    def ops(self) -> list[Op]:
        return list(self._ops)

    def needs_compaction(self) -> bool:
        return len(self._ops) >= self._compact_at

    def compact(self, snapshot: dict[str, Any]) -> None:
        """Replace the journal by library loads and capabilities, plus a snapshot of the state."""
        keep = [o for o in self._ops if o.text.startswith(("load_library(", "grant("))]
        ops = [o for o in keep if o.text.startswith("load_library(")]
        ops.append(codec.restore_system(list(snapshot.get("system", []))))
        for app, state in sorted(snapshot.get("apps", {}).items()):
            ops.append(codec.restore_app(app, state))
        ops.extend(o for o in keep if o.text.startswith("grant("))
        self._ops = ops
        self._compact_at = max(self.COMPACT_AT_LEAST, 2 * len(ops))

    def __len__(self) -> int:
        return len(self._ops)

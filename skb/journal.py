"""What a restarted engine must be told to be what it was: every write that succeeded.

Entries that later ones make obsolete are dropped as they come (see
:meth:`Journal.record`); churn that cannot be dropped that way (facts added
and removed, tasks coming and going) is folded by :meth:`Journal.compact`
into a snapshot of the engine's state once the journal has doubled.

The entries are indexed by their keys and their application, so a write that
makes some obsolete finds them without scanning the journal: it grows to
``COMPACT_AT_LEAST`` entries between compactions, and every registration and
departure through the Resource Manager records such a write.
"""

from __future__ import annotations

from typing import Any

from . import codec
from .codec import Op


class Journal:
    COMPACT_AT_LEAST = 1000

    def __init__(self) -> None:
        self._ops: dict[int, Op] = {}  # in the order recorded (dicts keep insertion order)
        self._seq = 0
        self._by_key: dict[str, set[int]] = {}  # a key of ``replaces`` -> the entries that hold it
        self._by_app: dict[str, set[int]] = {}
        self._compact_at = self.COMPACT_AT_LEAST

    def record(self, op: Op) -> None:
        """Keep ``op`` and drop what it makes obsolete.

        An op that ``drops`` keys removes every entry holding one of them, and
        every entry of an ``app:NAME`` key's application (then it is not kept
        itself; a ``revoke`` is not kept either).  An op that ``replaces`` keys
        removes every entry whose (non-empty) keys are all among them.
        """
        if not op.journal:
            return
        if op.drops:
            apps = {k[4:] for k in op.drops if k.startswith("app:")}
            self._remove(self._holding(op.drops) | self._of_apps(apps))
            if not apps and not op.text.startswith("revoke("):
                self._append(op)
            return
        if op.replaces:
            self._remove({i for i in self._holding(op.replaces) if self._ops[i].replaces <= op.replaces})
        self._append(op)

    def _holding(self, keys: frozenset[str]) -> set[int]:
        found: set[int] = set()
        for key in keys:
            found |= self._by_key.get(key, set())
        return found

    def _of_apps(self, apps: set[str]) -> set[int]:
        found: set[int] = set()
        for app in apps:
            found |= self._by_app.get(app, set())
        return found

    def _append(self, op: Op) -> None:
        i = self._seq
        self._seq += 1
        self._ops[i] = op
        for key in op.replaces:
            self._by_key.setdefault(key, set()).add(i)
        if op.app is not None:
            self._by_app.setdefault(op.app, set()).add(i)

    def _remove(self, ids: set[int]) -> None:
        for i in ids:
            op = self._ops.pop(i)
            for key in op.replaces:
                self._unindex(self._by_key, key, i)
            if op.app is not None:
                self._unindex(self._by_app, op.app, i)

    @staticmethod
    def _unindex(index: dict[str, set[int]], key: str, i: int) -> None:
        held = index[key]
        held.discard(i)
        if not held:
            del index[key]

    def ops(self) -> list[Op]:
        return list(self._ops.values())

    def needs_compaction(self) -> bool:
        return len(self._ops) >= self._compact_at

    def compact(self, snapshot: dict[str, Any]) -> None:
        """Replace the journal by library loads and capabilities, plus a snapshot of the state."""
        keep = [o for o in self._ops.values() if o.text.startswith(("load_library(", "grant("))]
        ops = [o for o in keep if o.text.startswith("load_library(")]
        ops.append(codec.restore_system(list(snapshot.get("system", []))))
        for app, state in sorted(snapshot.get("apps", {}).items()):
            ops.append(codec.restore_app(app, state))
        ops.extend(o for o in keep if o.text.startswith("grant("))
        self._ops, self._by_key, self._by_app = {}, {}, {}
        for op in ops:
            self._append(op)
        self._compact_at = max(self.COMPACT_AT_LEAST, 2 * len(ops))

    def __len__(self) -> int:
        return len(self._ops)

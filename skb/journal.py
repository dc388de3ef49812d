"""What a restarted engine must be told to be what it was: every write that succeeded.

Entries that later ones make obsolete are dropped as they come (see
:meth:`Journal.record`); churn that cannot be dropped that way (facts added
and removed, tasks coming and going) is folded by :meth:`Journal.compact`
into a snapshot of the engine's state once the journal has doubled.

The entries are indexed by their keys and their application, so a write that
makes some obsolete finds them without scanning the journal: it grows to
``COMPACT_AT_LEAST`` entries between compactions, and every registration and
departure through the Resource Manager records such a write.

Replies come in any order (a large reply, a snapshot above all, waits in the
engine's output behind small ones), but the engine applies writes in the
order of their requests (one writer thread).  So each entry keeps the id of
its request, and the journal is that order, not the order of the replies:
replay sorts by it, a write makes obsolete only entries of earlier requests,
and a compaction by the snapshot of request ``s`` replaces exactly the
entries of requests before ``s``, keeps those after it, and ignores the late
replies of writes the snapshot already holds.
"""

from __future__ import annotations

from typing import Any

from . import codec
from .codec import Op

# Entries that a snapshot (the facts and procedures of the engine) does not hold.
OUTSIDE_SNAPSHOT = ("load_library(", "grant(", "revoke(")


class Journal:
    COMPACT_AT_LEAST = 1000

    def __init__(self, compact_at_least: int | None = None) -> None:
        self._ops: dict[int, Op] = {}  # entry -> op, in the order recorded
        self._order: dict[int, int] = {}  # entry -> its request id: the order the engine applied them
        self._seq = 0
        self._last = -1  # the latest request id recorded (an op recorded without one comes after it)
        self._by_key: dict[str, set[int]] = {}  # a key of ``replaces`` -> the entries that hold it
        self._by_app: dict[str, set[int]] = {}
        self._least = self.COMPACT_AT_LEAST if compact_at_least is None else max(1, compact_at_least)
        self._compact_at = self._least
        self._snapshot_rid = -1  # the request of the last snapshot folded in
        self._pending_snapshot: int | None = None  # a snapshot requested, its reply not yet folded in
        self._dropped: list[tuple[int, frozenset[str]]] = []  # (request, applications) dropped meanwhile

    def record(self, op: Op, rid: int | None = None) -> None:
        """Keep ``op``, the write of engine request ``rid``, and drop what it makes obsolete.

        An op that ``drops`` keys removes every earlier entry holding one of
        them, and every earlier entry of an ``app:NAME`` key's application
        (then it is not kept itself; a ``revoke`` is not kept either).  An op
        that ``replaces`` keys removes every earlier entry whose (non-empty)
        keys are all among them.  The late reply of a write that the last
        snapshot holds is not kept again.
        """
        if not op.journal:
            return
        order = self._last + 1 if rid is None else rid
        if order < self._snapshot_rid:
            if not op.text.startswith(OUTSIDE_SNAPSHOT):
                return
            order = self._snapshot_rid  # with the snapshot's entries, as those of its time are
        self._last = max(self._last, order)
        if op.drops:
            apps = frozenset(k[4:] for k in op.drops if k.startswith("app:"))
            self._remove(self._before(order, self._holding(op.drops) | self._of_apps(apps)))
            if not apps and not op.text.startswith("revoke("):
                self._append(op, order)
            elif apps and self._pending_snapshot is not None and order > self._pending_snapshot:
                self._dropped.append((order, apps))  # the snapshot on its way still holds them
            return
        if op.replaces:
            held = {i for i in self._holding(op.replaces) if self._ops[i].replaces <= op.replaces}
            self._remove(self._before(order, held))
        self._append(op, order)

    def _before(self, order: int, ids: set[int]) -> set[int]:
        return {i for i in ids if self._order[i] < order}

    def _holding(self, keys: frozenset[str]) -> set[int]:
        found: set[int] = set()
        for key in keys:
            found |= self._by_key.get(key, set())
        return found

    def _of_apps(self, apps: frozenset[str]) -> set[int]:
        found: set[int] = set()
        for app in apps:
            found |= self._by_app.get(app, set())
        return found

    def _append(self, op: Op, order: int) -> None:
        i = self._seq
        self._seq += 1
        self._ops[i] = op
        self._order[i] = order
        for key in op.replaces:
            self._by_key.setdefault(key, set()).add(i)
        if op.app is not None:
            self._by_app.setdefault(op.app, set()).add(i)

    def _remove(self, ids: set[int]) -> None:
        for i in ids:
            op = self._ops.pop(i)
            del self._order[i]
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
        """The entries in the order the engine applied them: what a restart replays."""
        return [self._ops[i] for i in sorted(self._ops, key=lambda i: (self._order[i], i))]

    def needs_compaction(self) -> bool:
        """Time to ask for a snapshot: the journal has doubled, and no snapshot is on its way."""
        return len(self._ops) >= self._compact_at and self._pending_snapshot is None

    def snapshot_requested(self, rid: int) -> None:
        self._pending_snapshot = rid

    def snapshot_lost(self) -> None:
        """The snapshot on its way will not come (its engine was restarted)."""
        self._pending_snapshot = None
        self._dropped = []

    def compact(self, snapshot: dict[str, Any], rid: int | None = None) -> None:
        """Fold in ``snapshot``: the engine's state once the writes requested before ``rid`` were applied.

        The entries of earlier requests become the library loads and
        capabilities among them plus the snapshot; the entries of later
        requests (recorded while the snapshot's reply was on its way) stay,
        and an application one of them dropped is left out of the snapshot.
        A snapshot older than the last one folded in changes nothing."""
        cut = self._last + 1 if rid is None else rid
        if cut < self._snapshot_rid:
            return
        entries = [(self._order[i], self._ops[i]) for i in self._ops]
        earlier = [(r, o) for r, o in entries if r < cut]
        later = [(r, o) for r, o in entries if r > cut]
        dropped = frozenset().union(*(apps for r, apps in self._dropped if r > cut))
        self._ops, self._order, self._by_key, self._by_app = {}, {}, {}, {}
        for r, op in earlier:  # the libraries first: the procedures restored may call them
            if op.text.startswith("load_library("):
                self._append(op, r)
        self._append(codec.restore_system(list(snapshot.get("system", []))), cut)
        for app, state in sorted(snapshot.get("apps", {}).items()):
            if app not in dropped:
                self._append(codec.restore_app(app, state), cut)
        for r, op in earlier:
            if op.text.startswith("grant("):
                self._append(op, cut)
        for r, op in later:
            self._append(op, r)
        self._snapshot_rid = cut
        self._last = max(self._last, cut)
        self._pending_snapshot = None
        self._dropped = []
        self._compact_at = max(self._least, 2 * len(self._ops))

    def __len__(self) -> int:
        return len(self._ops)

"""Best-fit packing of task totals into classes: counts without search.

Given how many CPUs each task gets (the totals of the relaxation in
:mod:`.bounds`), decide counts per class (as the count model of :mod:`.cpsat`
would) by a deterministic best-fit bin packing over L3 domains / NUMA nodes:

1. order: tasks that both pollute and are cache-sensitive (they need domains
   of their own), then polluters (packed together), then cache-sensitive
   tasks, then numa-sensitive ones (which may use polluted domains), each by
   weight (numa + cache) and size, largest first, then the others (whole-core
   tasks before PU tasks before shareable ones);
2. every task first takes back the classes it holds CPUs in now (O4), all
   tasks before any new placement;
3. a sensitive task fills the nodes / domains it already spans, then the
   smallest one that holds the rest (best fit), else the largest one, and
   repeats; a polluter likewise over domains, preferring polluted ones; the
   others fill polluted domains first, then the fullest classes.

Capacity per class is that of the count model: whole cores of exclusive
no-SMT-sharing tasks, PUs of exclusive SMT-sharing ones, and one shared pool
for shareable tasks (C3, C6); per node memory (C4); C5 per domain.  Returns
None when some task does not fit (fragmentation): the caller then searches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from .model import TaskSpec
from .problem import is_e1, is_other
from .topology import View


@dataclass
class Packed:
    counts: dict[str, dict[int, int]]  # task -> class index -> PUs
    cores: dict[str, dict[int, int]]  # E1 task -> class index -> whole cores
    pool: dict[int, int]  # class index -> shared pool PUs
    complete: bool = True  # every task got the total it was packed for


class _State:
    """Counts per (task, class) and what they use up; every change goes through
    :meth:`set_count`, which also takes counts back (the pool shrinks to the
    largest remaining share)."""

    def __init__(self, view: View, tasks: Sequence[TaskSpec]) -> None:
        self.view = view
        self.tasks = {t.name: t for t in tasks}
        self.room = {g.index: g.size for g in view.classes}  # PUs no task has claimed
        self.pool = {g.index: 0 for g in view.classes}
        self.excl = {g.index: 0 for g in view.classes}  # PUs claimed by exclusive tasks
        self.shared: dict[int, dict[str, int]] = {g.index: {} for g in view.classes}
        self.mem = dict(view.node_free)
        self.polluters: dict[int, dict[str, int]] = {d: {} for d in range(view.n_domains)}
        self.sensitive: dict[int, dict[str, int]] = {d: {} for d in range(view.n_domains)}
        self.counts: dict[str, dict[int, int]] = {t.name: {} for t in tasks}
        self.cores: dict[str, dict[int, int]] = {t.name: {} for t in tasks if is_e1(t)}
        # C7: the classes an other may use (absent: any)
        self.allowed = {t.name: view.allowed_classes(t.allowed) for t in tasks if is_other(t) and t.allowed is not None}

    @classmethod
    def of(cls, view: View, tasks: Sequence[TaskSpec], alloc: Mapping[str, Sequence[int]]) -> "_State":
        """The counts of a CPU-level allocation (whole cores for E1 tasks)."""
        st = cls(view, tasks)
        class_of = {c: g.index for g in view.classes for c in g.cpus}
        for t in tasks:
            per: dict[int, list[int]] = {}
            for c in alloc.get(t.name, ()):
                if c in class_of:
                    per.setdefault(class_of[c], []).append(c)
            for gi, cpus in per.items():
                if is_e1(t):  # set_count derives whole cores from the count: use the cores held
                    st.cores[t.name][gi] = 0
                st.set_count(t, gi, len(cpus))
                if is_e1(t):
                    n_cores = len({view.core_of[c] for c in cpus})
                    g = view.classes[gi]
                    st.excl[gi] += (n_cores - st.cores[t.name][gi]) * g.threads
                    st.cores[t.name][gi] = n_cores
                    st.room[gi] = g.size - st.excl[gi] - st.pool[gi]
        return st

    def copy(self) -> "_State":
        st = _State.__new__(_State)
        st.view, st.tasks = self.view, dict(self.tasks)
        st.room, st.pool, st.excl = dict(self.room), dict(self.pool), dict(self.excl)
        st.shared = {gi: dict(v) for gi, v in self.shared.items()}
        st.mem = dict(self.mem)
        st.polluters = {d: dict(v) for d, v in self.polluters.items()}
        st.sensitive = {d: dict(v) for d, v in self.sensitive.items()}
        st.counts = {n: dict(v) for n, v in self.counts.items()}
        st.cores = {n: dict(v) for n, v in self.cores.items()}
        st.allowed = dict(self.allowed)
        return st

    def add_task(self, t: TaskSpec) -> None:
        self.tasks[t.name] = t
        self.counts[t.name] = {}
        if is_e1(t):
            self.cores[t.name] = {}
        if is_other(t) and t.allowed is not None:
            self.allowed[t.name] = self.view.allowed_classes(t.allowed)

    def remove_task(self, name: str) -> None:
        t = self.tasks[name]
        for gi in list(self.counts[name]):
            self.set_count(t, gi, 0)
        del self.tasks[name], self.counts[name]
        self.cores.pop(name, None)
        self.allowed.pop(name, None)

    def avail(self, t: TaskSpec, gi: int, pool_only: bool = False) -> int:
        """Most PUs ``t`` can add in class ``gi`` to what it holds there;
        ``pool_only``: for a shareable task, without growing the shared pool."""
        g = self.view.classes[gi]
        allowed = self.allowed.get(t.name)
        if allowed is not None and gi not in allowed:
            return 0
        if t.pollutes_cache or "cache" in t.sensitive:
            if "cache" in t.sensitive and any(n != t.name for n in self.polluters[g.domain]):
                return 0
            if t.pollutes_cache and any(n != t.name for n in self.sensitive[g.domain]):
                return 0
        room = self.room[gi]
        if t.exclusive:
            if t.allow_smt_sharing:
                n = room
            else:
                n = room - room % g.threads + self.cores[t.name].get(gi, 0) * g.threads \
                    - self.counts[t.name].get(gi, 0)
        else:
            n = self.pool[gi] - self.counts[t.name].get(gi, 0) + (0 if pool_only else room)
        if t.working_set_bytes:
            free = self.mem.get(g.node)
            if free is not None:
                n = min(n, free // t.working_set_bytes)
        return n if n > 0 else 0

    def take(self, t: TaskSpec, gi: int, n: int) -> None:
        self.set_count(t, gi, self.counts[t.name].get(gi, 0) + n)

    def set_count(self, t: TaskSpec, gi: int, n: int) -> None:
        g = self.view.classes[gi]
        old = self.counts[t.name].get(gi, 0)
        if is_e1(t):
            c_old = self.cores[t.name].get(gi, 0)
            c_new = -(-n // g.threads)
            self.excl[gi] += (c_new - c_old) * g.threads
            if c_new:
                self.cores[t.name][gi] = c_new
            else:
                self.cores[t.name].pop(gi, None)
        elif t.exclusive:
            self.excl[gi] += n - old
        else:
            if n:
                self.shared[gi][t.name] = n
            else:
                self.shared[gi].pop(t.name, None)
            self.pool[gi] = max(self.shared[gi].values(), default=0)
        self.room[gi] = g.size - self.excl[gi] - self.pool[gi]
        if t.working_set_bytes and self.mem.get(g.node) is not None:
            self.mem[g.node] -= (n - old) * t.working_set_bytes
        for flag, per in ((t.pollutes_cache, self.polluters), ("cache" in t.sensitive, self.sensitive)):
            if flag:
                k = per[g.domain].get(t.name, 0) + (1 if n else 0) - (1 if old else 0)
                if k:
                    per[g.domain][t.name] = k
                else:
                    per[g.domain].pop(t.name, None)
        if n:
            self.counts[t.name][gi] = n
        else:
            self.counts[t.name].pop(gi, None)

    def span(self, t: TaskSpec) -> int:
        """O3 of ``t``: nodes (numa) plus domains (cache) it spans."""
        used = [self.view.classes[gi] for gi in self.counts[t.name]]
        return (("numa" in t.sensitive) * len({g.node for g in used})
                + ("cache" in t.sensitive) * len({g.domain for g in used}))


# Task orders tried, the best packing wins (each costs 1-10 ms on 384 CPUs):
# "cache-first" puts cache-sensitive tasks before numa-only ones (these may
# use polluted domains); "pool-last" places shareable tasks after every
# exclusive one; "largest-first" places polluters first, then first-fit
# decreasing over every other kind.  Measured on 30 seeded instances (8-128 tasks, both 384-CPU
# machines): orders by weight only or by size only, and placing sensitive
# shareable tasks without using the existing pool first, never beat these.
VARIANTS = ("cache-first", "pool-last", "largest-first")


def _order(tasks: Sequence[TaskSpec], totals: Mapping[str, int], variant: str) -> list[TaskSpec]:
    def key(t: TaskSpec) -> tuple:
        isolated = t.pollutes_cache and "cache" in t.sensitive
        kind = (0 if isolated else 1 if t.pollutes_cache else 2 if "cache" in t.sensitive
                else 3 if t.sensitive else 4)
        shape = 0 if is_e1(t) else 1 if t.exclusive else 2
        if variant == "pool-last":
            return (not t.exclusive, kind, -totals[t.name], -len(t.sensitive), shape, t.name)
        if variant == "largest-first":
            return (kind > 1, kind, -totals[t.name], -len(t.sensitive), shape, t.name) if kind <= 1 \
                else (True, 0, -totals[t.name], kind, -len(t.sensitive), shape, t.name)
        return (kind, -len(t.sensitive), -totals[t.name], shape, t.name)
    # others last: registered tasks take back their CPUs first, others fill what is left
    return sorted(tasks, key=lambda t: (is_other(t), key(t)))


def pack(view: View, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]],
         totals: Mapping[str, int], target: tuple[int, int] = (0, 0)) -> Packed | None:
    """The best of the packings of every variant (fewest spread, then moves);
    stops at the first one reaching ``target``
    (the lower bound).  If no variant places every total: the best partial
    packing (every task at least ``min_cores``, then topped up; most CPUs per
    priority level first), with ``complete`` False; None if none admits all."""
    best: tuple[tuple[int, int], _State] | None = None
    for variant in VARIANTS:
        st = _pack(view, tasks, current, totals, variant)
        if st is None:
            continue
        score = _score(view, tasks, current, st)
        if best is None or score < best[0]:
            best = (score, st)
        if score <= target:
            break
    if best is None:
        return _partial(view, tasks, current, totals)
    st = best[1]
    return Packed(st.counts, st.cores, st.pool)


def _partial(view: View, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]],
             totals: Mapping[str, int]) -> Packed | None:
    from .problem import effective_max, priority_levels

    levels = priority_levels(tasks)
    best: tuple[tuple, _State] | None = None
    for variant in VARIANTS:
        st = _pack(view, tasks, current, totals, variant, partial=True)
        if st is None:
            continue
        for t in sorted(tasks, key=lambda t: (-t.priority, t.name)):  # top up
            more = effective_max(t, view) - sum(st.counts[t.name].values())
            if more > 0:
                if not t.exclusive:
                    more = _fill(st, t, more, pool_only=True)
                if more > 0:
                    _fill(st, t, more)
        granted = tuple(-sum(sum(st.counts[t.name].values()) for t in tasks if t.priority == p)
                        for p in levels)
        key = granted + _score(view, tasks, current, st)
        if best is None or key < best[0]:
            best = (key, st)
    if best is None:
        return None
    st = best[1]
    return Packed(st.counts, st.cores, st.pool, complete=False)


def _score(view: View, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]],
           p: "_State | Packed") -> tuple[int, int]:
    """(O3, an estimate of O4) of a packing, from its counts."""
    class_of = {c: g.index for g in view.classes for c in g.cpus}
    spread = moves = 0
    for t in tasks:
        used = [view.classes[gi] for gi, n in p.counts[t.name].items() if n]
        if "numa" in t.sensitive:
            spread += len({g.node for g in used})
        if "cache" in t.sensitive:
            spread += len({g.domain for g in used})
        held: dict[int, int] = {}
        for cpu in current.get(t.name, ()):
            gi = class_of.get(cpu)
            held[gi] = held.get(gi, 0) + 1
        moves += sum(max(0, n - p.counts[t.name].get(gi, 0)) if gi is not None else n
                     for gi, n in held.items())
    return spread, moves


def _pack(view: View, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]],
          totals: Mapping[str, int], variant: str, partial: bool = False) -> _State | None:
    """One packing in the order of ``variant``; None if some task does not get
    its total.  ``partial``: first every task's ``min_cores`` (admission),
    then the totals as far as they fit; None only if admission fails."""
    st = _State(view, tasks)
    class_of = {c: g.index for g in view.classes for c in g.cpus}
    order = _order(tasks, totals, variant)
    # Warm start: every task first takes back the classes it holds now (all
    # tasks before any new placement, so nobody lands on what another keeps).
    for t in order:
        need = t.min_cores if partial else totals[t.name]
        held: dict[int, int] = {}
        for cpu in current.get(t.name, ()):
            if cpu in class_of:
                held[class_of[cpu]] = held.get(class_of[cpu], 0) + 1
        for gi, n in sorted(held.items(), key=lambda kv: (-kv[1], kv[0])):
            k = min(n, need, st.avail(t, gi))
            if k > 0:
                st.take(t, gi, k)
                need -= k
    for t in order:
        need = (t.min_cores if partial else totals[t.name]) - sum(st.counts[t.name].values())
        if _place(st, t, need) > 0:
            return None
    if partial:
        for t in order:
            _place(st, t, totals[t.name] - sum(st.counts[t.name].values()))
    return st


def _place(st: _State, t: TaskSpec, need: int) -> int:
    """``need`` more PUs for ``t``; returns what did not fit."""
    if need > 0 and not t.exclusive:
        # shareable tasks share one pool: use it before growing it
        need = _fill(st, t, need, pool_only=True)
    if need > 0:
        need = _fill(st, t, need)
    return need


def _fill(st: _State, t: TaskSpec, need: int, pool_only: bool = False) -> int:
    """Place ``need`` more PUs of ``t``; returns what is left unplaced."""
    view = st.view
    if "cache" in t.sensitive or t.pollutes_cache:
        group_of = lambda g: g.domain  # noqa: E731
    elif "numa" in t.sensitive:
        group_of = lambda g: g.node  # noqa: E731
    else:
        group_of = None
    if group_of is None:
        # Not sensitive: polluted domains first (sensitive tasks cannot use
        # them), then the fullest classes, keeping large empty ones whole.
        order = sorted((g for g in view.classes if st.avail(t, g.index, pool_only) > 0),
                       key=lambda g: (not st.polluters[g.domain], st.avail(t, g.index, pool_only), g.index))
        for g in order:
            if need == 0:
                break
            k = min(need, st.avail(t, g.index, pool_only))
            if k > 0:
                st.take(t, g.index, k)
                need -= k
        return need
    while need > 0:
        used_nodes = {view.classes[gi].node for gi in st.counts[t.name]}
        used_domains = {view.classes[gi].domain for gi in st.counts[t.name]}
        groups: dict[int, list[tuple[int, int]]] = {}
        for g in view.classes:
            a = st.avail(t, g.index, pool_only)
            if a > 0:
                groups.setdefault(group_of(g), []).append((a, g.index))
        if not groups:
            return need

        def cost(members: list[tuple[int, int]]) -> int:
            g = view.classes[members[0][1]]
            return (("cache" in t.sensitive and g.domain not in used_domains)
                    + ("numa" in t.sensitive and g.node not in used_nodes))

        def key(item: tuple[int, list[tuple[int, int]]]) -> tuple:
            gid, members = item
            size = sum(a for a, _ in members)
            polluted = bool(st.polluters[view.classes[members[0][1]].domain])
            fits = size >= need
            # fewest new nodes/domains; a polluter prefers polluted domains;
            # then best fit (smallest that holds the rest), else the largest
            # (a numa-only task likewise, as cache-sensitive ones cannot use them)
            return (cost(members), "cache" not in t.sensitive and not polluted, not fits,
                    size if fits else -size, gid)

        _, members = min(groups.items(), key=key)
        for a, gi in sorted(members, key=lambda m: (not st.polluters[view.classes[m[1]].domain], -m[0], m[1])):
            if need == 0:
                break
            k = min(need, st.avail(t, gi, pool_only))  # memory is per node: not ``a`` any more
            if k > 0:
                st.take(t, gi, k)
                need -= k
    return need

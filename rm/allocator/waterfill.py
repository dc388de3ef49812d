"""The lexicographic bound of O2 without CP-SAT: the class-free relaxation
filled level by level.

The relaxation of :func:`.relaxation.relaxation` (one total X_t per task; whole
cores for E1 tasks' ``min_cores``; one shared pool P; C5 as a number q of
"polluted" L3 domains) has a simple structure once P and q are fixed: every
shareable task holds min(cap, P), every exclusive task its ``min_cores``
(rounded up to whole cores), and the K = C - (those) - P CPUs left go to the
levels from the highest down, each level taking first what uses no C5 room
(neutral tasks), then what cache-sensitive tasks can use in the D - q clean
domains, then what polluters can use in the q polluted ones.  That greedy is
the relaxation's lexicographic optimum for the given (P, q) (the constraints
form a laminar family: the total, the clean room, the polluted room), so the
lexicographic maximum over all P and q is the relaxation's optimum: a valid
upper bound of O2.  Every P is tried on small machines; on large ones the
marginal gain of one more pool PU (one per shareable task whose cap is above
P, against the unit of K that level loses) only decreases, so the first P
where it stops paying is found by bisection.

Caps (:func:`.bounds.task_caps`) carry per-node memory (C4) per task and, per
q, what cache-sensitive tasks and polluters can hold in their domains.
Relaxed further (so the bound may be loose, never invalid): the machine-wide
memory budget is left out; a task that both pollutes and is cache-sensitive
("isolated": it needs domains of its own) takes the fewest domains its
``min_cores`` need away from the others, while itself it may hold its whole
cap; shareable polluters and cache-sensitive tasks hold at most what their
q domains hold, without sub-pools.  With domains of different sizes and C5
coupling :func:`waterfill_bound` returns "unsupported" and callers use the
CP-SAT relaxation (:func:`.bounds.relaxed_bound`).

O3: a sensitive task spans at least the fewest nodes / domains holding the
least total it can have in any solution reaching the levels (its
``min_cores``, or what its level needs beyond the others' caps); O4: current
CPUs beyond the most it can have must move.  The totals returned reach the
levels and give the extra CPUs of a level to tasks that do not care where
they are first, so the packing (:mod:`.packing`) can turn them into counts.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

from .bounds import fewest, forced_moves, tail_bound, task_caps
from .model import TaskSpec
from .problem import is_e1, is_other, priority_levels
from .topology import View

# Up to this many possible pool sizes (or clean parts of the pool) every one
# is tried; beyond, bisection.
SCAN_POOL_SIZES = 64
# Evaluations of the levels this bound may spend (about 5 us each) before it
# leaves the case to the CP-SAT relaxation: q x pool sizes x splits grows fast
# on large machines with polluters and shareable tasks (128 tasks on 384 PUs:
# up to 80 000 evaluations, 400 ms).
WORK_BUDGET = 1500


@dataclass(frozen=True)
class Fill:
    """A lexicographic bound (as :class:`.bounds.RelaxedBound`) and totals reaching its O2."""

    levels: tuple[int, ...]
    spread: int
    moves: int
    totals: dict[str, int]
    tail: tuple[int, ...] = ()

    @property
    def objective(self) -> tuple[int, ...]:
        return self.levels + (-self.spread, -self.moves) + self.tail


@dataclass
class _Task:
    spec: TaskSpec
    level: int  # index in priority_levels, 0 = highest
    lo: int  # min_cores
    cap: int  # most it can ever hold (task_caps), per q for C5 groups
    use: int  # CPUs its min_cores use (whole cores for E1)
    group: str  # "n" neutral, "c" cache-sensitive, "p" polluter (when C5 couples them)


def waterfill_bound(view: View, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]],
                    caps: Mapping[str, tuple[int, list[int], list[int]]] | None = None
                    ) -> Fill | None | str:
    """:class:`Fill`; None when the relaxation (so the problem) is infeasible;
    "unsupported" for the cases listed in the module doc."""
    levels = priority_levels(tasks)
    level_of = {p: i for i, p in enumerate(levels)}
    isolated = [t for t in tasks if t.pollutes_cache and "cache" in t.sensitive]
    polluters = [t for t in tasks if t.pollutes_cache and "cache" not in t.sensitive]
    sensitive = [t for t in tasks if "cache" in t.sensitive and not t.pollutes_cache]
    coupled = bool((polluters and sensitive) or (isolated and (polluters or sensitive or len(isolated) > 1)))
    dom_size = [0] * view.n_domains
    for g in view.classes:
        dom_size[g.domain] += g.size
    if coupled and len(set(dom_size)) > 1:
        return "unsupported"
    pool_range = len(view.cpus) + 1 if any(not t.exclusive for t in tasks) else 1
    n_q = max(1, view.n_domains) if coupled else 1
    if n_q * _search_cost(pool_range) * (_search_cost(pool_range) if coupled else 1) > WORK_BUDGET:
        return "unsupported"
    caps = caps if caps is not None else task_caps(view, tasks)
    k = math.gcd(*(g.threads for g in view.classes)) if view.classes else 1
    base: list[_Task] = []
    for t in tasks:
        cap = caps[t.name][0]
        if t.min_cores > cap:
            return None
        use = k * -(-t.min_cores // k) if is_e1(t) and k > 1 else t.min_cores
        group = "n"
        if coupled and not (t.pollutes_cache and "cache" in t.sensitive):
            group = "c" if "cache" in t.sensitive else "p" if t.pollutes_cache else "n"
        base.append(_Task(t, level_of[t.priority], t.min_cores, cap, use, group))
    # isolated tasks take the fewest domains their min_cores need from the others
    n_dom = view.n_domains - (sum(fewest(caps[t.name][2], t.min_cores) for t in isolated) if coupled else 0)
    size = dom_size[0] if dom_size else 0
    shape = _Shape(len(view.cpus), len(levels), coupled, n_dom, size, (view.n_domains - n_dom) * size)

    best: tuple[tuple[int, ...], _Fixed, int, int] | None = None  # (levels, problem for q, P, s)
    # q: domains holding (plain) polluters; the others are clean
    q_range = range(1 if polluters else 0, n_dom - (1 if sensitive else 0) + 1) if coupled else (0,)
    for q in q_range:
        fixed = _fix(base, shape, q, caps)
        if fixed is None:
            continue
        got = fixed.best()
        if got is not None and (best is None or got[0] > best[0]):
            best = (got[0], fixed, got[1], got[2])
    if best is None:
        return None
    u, fixed, pool, split = best
    totals = fixed.totals(pool, split)

    # O3 / O4 among every solution reaching u: least / most each task can hold.
    cap_sum = [0] * len(levels)
    for t in base:
        cap_sum[t.level] += t.cap
    spread = 0
    most: dict[str, int] = {}
    for t in base:
        least = max(t.lo, u[t.level] - (cap_sum[t.level] - t.cap))
        most[t.spec.name] = t.cap
        _, node_caps, dom_caps = caps[t.spec.name]
        if "numa" in t.spec.sensitive:
            spread += fewest(node_caps, least)
        if "cache" in t.spec.sensitive:
            spread += fewest(dom_caps, least)
    moves = forced_moves(view, tasks, current, most)
    return Fill(u, spread, moves, totals, tail_bound(tasks, moves))


@dataclass(frozen=True)
class _Shape:
    cpus: int
    levels: int
    coupled: bool
    domains: int  # L3 domains the clean and polluted kinds share (isolated tasks' taken out)
    domain_size: int
    isolated_room: int  # PUs of the domains isolated tasks take (the pool may lie there too)


class _Fixed:
    """The relaxation for one number q of polluted domains: tasks with their
    caps for q, per level the sorted caps of shareable tasks per group, the
    CPUs exclusive tasks hold at their min_cores and what they want beyond."""

    def __init__(self, tasks: list[_Task], shape: _Shape, q: int) -> None:
        self.tasks, self.shape, self.q = tasks, shape, q
        excl = [t for t in tasks if t.spec.exclusive]
        shared = [t for t in tasks if not t.spec.exclusive]
        self.used = sum(t.use for t in excl)
        self.rooms = {"c": (shape.domains - q) * shape.domain_size - sum(t.use for t in excl if t.group == "c"),
                      "p": q * shape.domain_size - sum(t.use for t in excl if t.group == "p")}
        n = shape.levels
        self.fixed = [0] * n
        self.demand = [{"n": 0, "c": 0, "p": 0} for _ in range(n)]
        self.shared_caps = [{"n": [], "c": [], "p": []} for _ in range(n)]
        for t in excl:
            slack = min(t.use, t.cap) - t.lo  # an E1 task's min rounded up to whole cores costs nothing more
            self.fixed[t.level] += t.lo + slack
            self.demand[t.level][t.group] += t.cap - t.lo - slack
        for t in shared:
            self.shared_caps[t.level][t.group].append(t.cap)
        self.prefix = []
        for per in self.shared_caps:
            pre = {}
            for grp, c in per.items():
                c.sort()
                acc = [0]
                for v in c:
                    acc.append(acc[-1] + v)
                pre[grp] = acc
            self.prefix.append(pre)
        self.lo_pool = {"n": max((t.lo for t in shared if t.group == "n"), default=0),
                        "c": max((t.lo for t in shared if t.group == "c"), default=0),
                        "p": max((t.lo for t in shared if t.group == "p"), default=0)}
        self.has_shared = bool(shared)

    def feasible(self) -> bool:
        return self.used <= self.shape.cpus and (not self.shape.coupled or min(self.rooms.values()) >= 0)

    def _polluted_left(self, pool: int, split: int) -> int:
        """Polluted room left beside the pool's non-clean part (which may lie
        in isolated tasks' domains first: generous, so still a bound)."""
        return self.rooms["p"] - max(0, pool - split - self.shape.isolated_room)

    def split_range(self, pool: int) -> tuple[int, int]:
        """Clean part s of a pool of ``pool`` PUs (the polluted part is pool - s)."""
        if not self.shape.coupled:
            return 0, 0
        lo = max(self.lo_pool["c"], pool - self.rooms["p"] - self.shape.isolated_room)
        hi = min(pool - self.lo_pool["p"], self.rooms["c"])
        return lo, hi

    def value(self, pool: int, split: int) -> tuple[int, ...]:
        room = self.shape.cpus - self.used - pool
        sub = {"n": pool, "c": split, "p": pool - split}
        left = {"c": self.rooms["c"] - split, "p": self._polluted_left(pool, split)} if self.shape.coupled else None
        out = []
        for j in range(self.shape.levels):
            total = self.fixed[j]
            for grp, caps in self.shared_caps[j].items():
                if caps:
                    i = bisect.bisect_right(caps, sub[grp])
                    total += self.prefix[j][grp][i] + sub[grp] * (len(caps) - i)
            d = self.demand[j]
            g = min(d["n"], room)
            room -= g
            for grp in ("c", "p"):
                if d[grp]:
                    x = min(d[grp], room, left[grp] if left else room)
                    room -= x
                    g += x
                    if left:
                        left[grp] -= x
            out.append(total + g)
        return tuple(out)

    def best(self) -> tuple[tuple[int, ...], int, int] | None:
        """(levels, P, s) maximising the levels, or None if infeasible."""
        if not self.feasible():
            return None
        if not self.has_shared and not self.shape.coupled:
            return self.value(0, 0), 0, 0
        lo_pool = max(self.lo_pool.values()) if not self.shape.coupled else \
            max(self.lo_pool["n"], self.lo_pool["c"] + self.lo_pool["p"])
        hi_pool = self.shape.cpus - self.used
        if not self.has_shared:
            hi_pool = lo_pool = 0  # no pool: nothing to split

        def inner(pool: int) -> tuple[tuple[int, ...], int] | None:
            a, b = self.split_range(pool)
            if a > b:
                return None
            s = _argmax(lambda x: self.value(pool, x), a, b)
            return self.value(pool, s), s

        pools = {}

        def outer(pool: int) -> tuple[int, ...]:
            if pool not in pools:
                pools[pool] = inner(pool)
            got = pools[pool]
            return got[0] if got is not None else ()  # () is below every value

        if hi_pool < lo_pool:
            return None
        pool = _argmax(outer, lo_pool, hi_pool)
        got = pools.get(pool) or inner(pool)
        if got is None:
            return None
        return got[0], pool, got[1]

    def totals(self, pool: int, split: int) -> dict[str, int]:
        """Totals reaching value(pool, split): the extra CPUs of a level go to
        tasks without sensitivity first, then to sensitive ones."""
        sub = {"n": pool, "c": split, "p": pool - split}
        room = self.shape.cpus - self.used - pool
        left = {"c": self.rooms["c"] - split, "p": self._polluted_left(pool, split)} if self.shape.coupled else None
        out: dict[str, int] = {}
        excl = [t for t in self.tasks if t.spec.exclusive]
        for t in self.tasks:
            out[t.spec.name] = min(t.cap, sub[t.group]) if not t.spec.exclusive else min(t.use, t.cap)
        for j in range(self.shape.levels):
            here = [t for t in excl if t.level == j]
            for grp in ("n", "c", "p"):
                for t in sorted((t for t in here if t.group == grp),
                                key=lambda t: (len(t.spec.sensitive), is_other(t.spec), t.spec.name)):
                    x = min(t.cap - out[t.spec.name], room, left[grp] if left and grp != "n" else room)
                    if x > 0:
                        out[t.spec.name] += x
                        room -= x
                        if left and grp != "n":
                            left[grp] -= x
        return out


def _fix(base: list[_Task], shape: _Shape, q: int, caps) -> _Fixed | None:
    """The tasks with C5 applied for q polluted domains: a cache-sensitive task
    holds at most its ``domains - q`` largest domain capacities, a polluter its q largest."""
    tasks = base
    if shape.coupled:
        tasks = []
        for t in base:
            dom_caps = caps[t.spec.name][2]
            cap = t.cap
            if t.group == "c":
                cap = min(cap, sum(dom_caps[: shape.domains - q]))
            elif t.group == "p":
                cap = min(cap, sum(dom_caps[:q]))
            if t.lo > cap:
                return None
            tasks.append(_Task(t.spec, t.level, t.lo, cap, t.use, t.group))
    return _Fixed(tasks, shape, q)


def _search_cost(n: int) -> int:
    """Evaluations :func:`_argmax` spends on a range of ``n`` values."""
    return n if n <= SCAN_POOL_SIZES + 1 else 2 * max(1, n.bit_length())


def _argmax(f, lo: int, hi: int) -> int:
    """The smallest x in [lo, hi] maximising f: every x when the range is
    short, else bisection on the sign of f(x + 1) - f(x), which only
    decreases (the marginal value of one more pool PU)."""
    if hi - lo <= SCAN_POOL_SIZES:
        return max(range(lo, hi + 1), key=lambda x: (f(x), -x))
    while lo < hi:
        mid = (lo + hi) // 2
        if f(mid + 1) > f(mid):
            lo = mid + 1
        else:
            hi = mid
    return lo

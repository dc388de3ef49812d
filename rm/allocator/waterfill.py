"""The lexicographic bound of O2 without CP-SAT: the class-free relaxation
filled level by level.

The relaxation of :func:`.cpsat.relaxation` (one total X_t per task; whole
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

# Up to this many possible pool sizes every one is tried; beyond, bisection.
SCAN_POOL_SIZES = 192


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
    caps = caps if caps is not None else task_caps(view, tasks)
    levels = priority_levels(tasks)
    level_of = {p: i for i, p in enumerate(levels)}
    isolated = [t for t in tasks if t.pollutes_cache and "cache" in t.sensitive]
    polluters = [t for t in tasks if t.pollutes_cache and t not in isolated]
    sensitive = [t for t in tasks if "cache" in t.sensitive and t not in isolated]
    coupled = bool((polluters and sensitive) or (isolated and (polluters or sensitive or len(isolated) > 1)))
    dom_size = [0] * view.n_domains
    for g in view.classes:
        dom_size[g.domain] += g.size
    if coupled and len(set(dom_size)) > 1:
        return "unsupported"
    k = math.gcd(*(g.threads for g in view.classes)) if view.classes else 1
    n_cpus = len(view.cpus)
    base: list[_Task] = []
    for t in tasks:
        cap = caps[t.name][0]
        if t.min_cores > cap:
            return None
        use = k * -(-t.min_cores // k) if is_e1(t) and k > 1 else t.min_cores
        group = "n"
        if coupled and t not in isolated and t.exclusive:
            group = "c" if "cache" in t.sensitive else "p" if t.pollutes_cache else "n"
        base.append(_Task(t, level_of[t.priority], t.min_cores, cap, use, group))

    # isolated tasks take the fewest domains their min_cores need from the others
    n_dom = view.n_domains - (sum(fewest(caps[t.name][2], t.min_cores) for t in isolated) if coupled else 0)
    best: tuple[tuple[int, ...], int, int] | None = None  # (levels, P, q)
    # q: domains holding (plain) polluters; the others are clean
    q_range = range(1 if polluters else 0, n_dom - (1 if sensitive else 0) + 1) if coupled else (0,)
    for q in q_range:
        got = _best_pool(base, levels, n_cpus, k, q, n_dom, dom_size[0] if dom_size else 0, caps, coupled)
        if got is not None and (best is None or got[0] > best[0]):
            best = (got[0], got[1], q)
    if best is None:
        return None
    u, pool, q = best
    tasks_q = _with_q(base, q, n_dom, caps, coupled)
    totals = _totals(tasks_q, levels, n_cpus, k, pool, q, n_dom, dom_size[0] if dom_size else 0)

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


def _with_q(base: list[_Task], q: int, n_dom: int, caps, coupled: bool) -> list[_Task]:
    """The tasks with C5 applied for q polluted domains: a cache-sensitive task
    holds at most its n_dom - q largest domain capacities, a polluter its q largest."""
    if not coupled:
        return base
    out = []
    for t in base:
        dom_caps = caps[t.spec.name][2]
        cap = t.cap
        both = t.spec.pollutes_cache and "cache" in t.spec.sensitive
        if "cache" in t.spec.sensitive and not both:
            cap = min(cap, sum(dom_caps[: n_dom - q]))
        elif t.spec.pollutes_cache and not both:
            cap = min(cap, sum(dom_caps[:q]))
        out.append(_Task(t.spec, t.level, t.lo, cap, t.use, t.group))
    return out


def _best_pool(base, levels, n_cpus, k, q, n_dom, dom_size, caps, coupled):
    """(levels, P) maximising the levels for this q, or None if infeasible."""
    tasks = _with_q(base, q, n_dom, caps, coupled)
    if any(t.lo > t.cap for t in tasks):
        return None
    shared = [t for t in tasks if not t.spec.exclusive]
    excl = [t for t in tasks if t.spec.exclusive]
    used = sum(t.use for t in excl)
    rooms = None
    if coupled:
        rooms = {"c": (n_dom - q) * dom_size - sum(t.use for t in excl if t.group == "c"),
                 "p": q * dom_size - sum(t.use for t in excl if t.group == "p")}
        if rooms["c"] < 0 or rooms["p"] < 0:
            return None
    lo_pool = max((t.lo for t in shared), default=0)
    hi_pool = n_cpus - used if shared else 0
    if hi_pool < lo_pool:
        return None
    prep = _prepare(tasks, levels, k)

    def value(pool: int) -> tuple[int, ...]:
        return _levels(prep, levels, n_cpus - used - pool, pool, rooms)

    if not shared:
        return value(0), 0
    if hi_pool - lo_pool <= SCAN_POOL_SIZES:
        best_pool = max(range(lo_pool, hi_pool + 1), key=lambda p: (value(p), -p))
        return value(best_pool), best_pool
    # bisection on the sign of the marginal gain of one more pool PU
    a, b = lo_pool, hi_pool
    while a < b:
        mid = (a + b) // 2
        if value(mid + 1) > value(mid):
            a = mid + 1
        else:
            b = mid
    return value(a), a


@dataclass
class _Prepared:
    shared_caps: list[list[int]]  # per level: sorted caps of shareable tasks
    shared_prefix: list[list[int]]
    fixed: list[int]  # per level: min_cores + free whole-core slack of exclusive tasks
    demand: list[dict[str, int]]  # per level and group: exclusive CPUs wanted beyond that


def _prepare(tasks: list[_Task], levels, k: int) -> _Prepared:
    n = len(levels)
    caps_by: list[list[int]] = [[] for _ in range(n)]
    fixed = [0] * n
    demand = [{"n": 0, "c": 0, "p": 0} for _ in range(n)]
    for t in tasks:
        if not t.spec.exclusive:
            caps_by[t.level].append(t.cap)
            continue
        slack = min(t.use, t.cap) - t.lo  # an E1 task's min rounded up to whole cores costs nothing more
        fixed[t.level] += t.lo + slack
        demand[t.level][t.group] += t.cap - t.lo - slack
    prefix = []
    for c in caps_by:
        c.sort()
        acc = [0]
        for v in c:
            acc.append(acc[-1] + v)
        prefix.append(acc)
    return _Prepared(caps_by, prefix, fixed, demand)


def _levels(prep: _Prepared, levels, room: int, pool: int, rooms: dict[str, int] | None) -> tuple[int, ...]:
    out = []
    left = dict(rooms) if rooms else None
    for j in range(len(levels)):
        caps = prep.shared_caps[j]
        i = bisect.bisect_right(caps, pool)  # caps <= pool count in full
        shared = prep.shared_prefix[j][i] + pool * (len(caps) - i)
        d = prep.demand[j]
        g = min(d["n"], room)
        room -= g
        for grp in ("c", "p"):
            if d[grp]:
                x = min(d[grp], room, left[grp] if left else room)
                room -= x
                g += x
                if left:
                    left[grp] -= x
        out.append(shared + prep.fixed[j] + g)
    return tuple(out)


def _totals(tasks: list[_Task], levels, n_cpus: int, k: int, pool: int, q: int, n_dom: int, dom_size: int
            ) -> dict[str, int]:
    """Totals reaching the levels of (pool, q): the extra CPUs of a level go to
    tasks without sensitivity first, then to sensitive ones in the order of
    how little they grow in nodes / domains."""
    excl = [t for t in tasks if t.spec.exclusive]
    room = n_cpus - sum(t.use for t in excl) - pool
    left = None
    if any(t.group != "n" for t in tasks):
        left = {"c": (n_dom - q) * dom_size - sum(t.use for t in excl if t.group == "c"),
                "p": q * dom_size - sum(t.use for t in excl if t.group == "p")}
    out: dict[str, int] = {}
    for t in tasks:
        if not t.spec.exclusive:
            out[t.spec.name] = min(t.cap, pool)
        else:
            out[t.spec.name] = t.lo + (min(t.use, t.cap) - t.lo)
    for j in range(len(levels)):
        here = [t for t in excl if t.level == j]
        for grp in ("n", "c", "p"):
            for t in sorted((t for t in here if t.group == grp),
                            key=lambda t: (len(t.spec.sensitive), is_other(t.spec), t.spec.name)):
                want = t.cap - out[t.spec.name]
                x = min(want, room, left[grp] if left and grp != "n" else room)
                if x > 0:
                    out[t.spec.name] += x
                    room -= x
                    if left and grp != "n":
                        left[grp] -= x
    return out

"""Choosing and running the exact solvers, with the greedy allocator as fast path and fallback.

``cpsat``:
1. Run the greedy allocator (tens of microseconds to a few milliseconds).  If
   its objective reaches :func:`upper_bound`, it is optimal: done, without
   building a model (status "optimal", solver "greedy").
2. Otherwise solve the count model (:mod:`.cpsat`) and map counts to CPUs
   (:mod:`.mapping`).  Status "optimal" or "feasible" (time limit hit with a
   solution; the gap is in the log of :mod:`.cpsat`).
3. No solution within the time limit: the greedy allocation, status "fallback".
4. Proven infeasible: status "infeasible", reason from the greedy admission.
``naive``: the Figure 4 matrix model (:mod:`.naive`), same fallback rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from .check import effective_max, objective, priority_levels, violations
from .cpsat import solve_counts
from .greedy import solve_greedy
from .mapping import map_counts
from .model import TaskSpec
from .naive import solve_naive
from .topology import View

Alloc = dict[str, list[int]]


def task_caps(view: View, tasks: Sequence[TaskSpec]) -> dict[str, tuple[int, list[int], list[int]]]:
    """Per task: (most CPUs it can ever get, its capacity per node, per domain).

    A node holds at most free // working_set of its CPUs for the task (C4); a
    cache-sensitive task loses at least one whole domain when any other task
    pollutes the cache (C5: polluters hold at least one CPU somewhere).
    """
    per_node_cpus: dict[int, int] = {}
    per_dn: dict[tuple[int, int], int] = {}
    for c in view.cpus:
        n, d = view.node_of[c], view.domain_of[c]
        per_node_cpus[n] = per_node_cpus.get(n, 0) + 1
        per_dn[d, n] = per_dn.get((d, n), 0) + 1
    out = {}
    for t in tasks:
        node_cap = {}
        for n, k in per_node_cpus.items():
            free = view.node_free.get(n)
            node_cap[n] = k if free is None or not t.working_set_bytes else min(k, free // t.working_set_bytes)
        dom_cap = [0] * view.n_domains
        for (d, n), k in per_dn.items():
            dom_cap[d] += min(k, node_cap[n])
        cap = min(effective_max(t, view), sum(node_cap.values()))
        if "cache" in t.sensitive and any(u.pollutes_cache and u.name != t.name for u in tasks):
            cap = min(cap, sum(dom_cap) - min(dom_cap))
        out[t.name] = (max(cap, 0), sorted(node_cap.values(), reverse=True), sorted(dom_cap, reverse=True))
    return out


def upper_bound(
    view: View, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]]
) -> tuple[int, ...]:
    """An objective no allocation can beat (compare with :func:`.check.objective`).

    O2: every task at its cap (:func:`task_caps`).  O3: if O2 reaches that
    bound, every task holds exactly its cap, so it spans at least the fewest
    nodes / domains whose capacities for it add up to the cap.  O4: current
    CPUs that are gone or exceed the cap must move.
    """
    caps = task_caps(view, tasks)
    granted = tuple(
        sum(caps[t.name][0] for t in tasks if t.priority == p) for p in priority_levels(tasks)
    )
    spread = 0
    for t in tasks:
        need, node_caps, dom_caps = caps[t.name]
        if "numa" in t.sensitive:
            spread += _fewest(node_caps, need)
        if "cache" in t.sensitive:
            spread += _fewest(dom_caps, need)
    avail = set(view.cpus)
    forced = 0
    for t in tasks:
        cur = set(current.get(t.name, ()))
        forced += len(cur - avail) + max(0, len(cur & avail) - caps[t.name][0])
    return granted + (-spread, -forced)


def _fewest(sizes: list[int], need: int) -> int:
    total = 0
    for i, s in enumerate(sizes):
        if total >= need:
            return i
        total += s
    return len(sizes)


@dataclass(frozen=True)
class Outcome:
    alloc: Alloc | None
    reason: str | None
    status: str
    solver: str  # the one whose allocation this is
    gap: float | None = None


def solve_exact(
    view: View,
    tasks: Sequence[TaskSpec],
    current: Mapping[str, Sequence[int]],
    solver: str,
    time_limit_s: float,
) -> Outcome:
    greedy, reason = solve_greedy(view, tasks, current)
    gap = None
    if solver == "cpsat":
        if greedy is not None and objective(view, tasks, greedy, current) == upper_bound(view, tasks, current):
            return Outcome(greedy, None, "optimal", "greedy")
        sol = solve_counts(view, tasks, current, time_limit_s, hint=greedy)
        status, gap = sol.status, sol.gap
        alloc = map_counts(view, tasks, current, sol.counts, sol.cores) if status in ("optimal", "feasible") else None
    else:
        status, alloc = solve_naive(view, tasks, current, time_limit_s)
    if status == "infeasible":
        why = reason or "no allocation satisfies every task's min_cores and the constraints together"
        return Outcome(None, why, "infeasible", solver)
    if alloc is None:
        if greedy is None:  # neither found anything in time
            return Outcome(None, f"no allocation found in {time_limit_s} s; greedy: {reason}", "infeasible", solver)
        return Outcome(greedy, None, "fallback", "greedy")
    broken = violations(view, tasks, alloc)
    if broken:  # a bug, not a user error: say so loudly
        raise AssertionError(f"{solver} produced an infeasible allocation: {broken[0]}")
    if greedy is not None and objective(view, tasks, greedy, current) > objective(view, tasks, alloc, current):
        # Time ran out before the solver beat greedy, or (only O4) the mapping
        # kept fewer CPUs than the count model hoped.
        return Outcome(greedy, None, "feasible", "greedy", gap)
    return Outcome(alloc, None, status, solver, gap)

"""Lower bounds of the allocation objective (what no allocation can beat).

Two kinds:

* :func:`upper_bound`: closed form, microseconds; O2 from every task's cap.  It
  proves a greedy answer optimal when every task reaches its cap (the paper's
  Table 4 scenario).
* :func:`relaxed_bound`: the class-free relaxation (:mod:`.relaxation`) solved
  lexicographically: O2 per level, then O3 (each sensitive task spans at least
  the fewest nodes / domains whose capacities for it hold its total, and a
  shareable one every domain of the shared pool it cannot do without:
  :func:`_pool_cover_cuts`), then O4
  (CPUs of the current allocation beyond the task's total must move).  A few
  milliseconds; tight on the machines we measured (see docs/design-allocator.md).

Objective tuples compare as in :func:`cod.rm.allocator.problem.objective`:
larger is better, so O3/O4 bounds appear negated.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from ortools.sat.python import cp_model

from .problem import allowed_max, effective_max, is_other, lexicographic_weights, n_tail, priority_levels
from .model import TaskSpec
from .relaxation import relaxation
from .topology import View


def task_caps(view: View, tasks: Sequence[TaskSpec]) -> dict[str, tuple[int, list[int], list[int]]]:
    """Per task: (most CPUs it can ever get, its capacity per node, per domain),
    capacities sorted from the largest down.

    A node holds at most free // working_set of its CPUs for the task (C4); a
    cache-sensitive task loses at least one whole domain when any other task
    pollutes the cache (C5: polluters hold at least one CPU somewhere).
    """
    per_node_cpus: dict[int, int] = {}
    per_dn: dict[tuple[int, int], int] = {}
    for g in view.classes:
        per_node_cpus[g.node] = per_node_cpus.get(g.node, 0) + g.size
        per_dn[g.domain, g.node] = per_dn.get((g.domain, g.node), 0) + g.size
    out = {}
    for t in tasks:
        node_cap = {}
        for n, k in per_node_cpus.items():
            free = view.node_free.get(n)
            node_cap[n] = k if free is None or not t.working_set_bytes else min(k, free // t.working_set_bytes)
        dom_cap = [0] * view.n_domains
        for (d, n), k in per_dn.items():
            dom_cap[d] += min(k, node_cap[n])
        cap = min(allowed_max(view, t), sum(node_cap.values()))
        if "cache" in t.sensitive and any(u.pollutes_cache and u.name != t.name for u in tasks):
            cap = min(cap, sum(dom_cap) - min(dom_cap)) if dom_cap else 0
        out[t.name] = (max(cap, 0), sorted(node_cap.values(), reverse=True), sorted(dom_cap, reverse=True))
    return out


def fewest(sizes: list[int], need: int) -> int:
    """How many of ``sizes`` (sorted, largest first) it takes to hold ``need``."""
    total = 0
    for i, s in enumerate(sizes):
        if total >= need:
            return i
        total += s
    return len(sizes)


def forced_moves(view: View, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]],
                 totals: Mapping[str, int]) -> int:
    """CPUs of ``current`` that must move when each task holds ``totals[t]``
    CPUs (registered tasks: O4)."""
    avail = set(view.cpus)
    out = 0
    for t in tasks:
        if is_other(t):
            continue
        cur = set(current.get(t.name, ()))
        out += len(cur - avail) + max(0, len(cur & avail) - totals[t.name])
    return out


def upper_bound(
    view: View, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]]
) -> tuple[int, ...]:
    """An objective no allocation can beat (compare with :func:`.problem.objective`).

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
            spread += fewest(node_caps, need)
        if "cache" in t.sensitive:
            spread += fewest(dom_caps, need)
    forced = forced_moves(view, tasks, current, {t.name: caps[t.name][0] for t in tasks})
    return granted + (-spread, -forced) + tail_bound(tasks, forced)


def tail_bound(tasks: Sequence[TaskSpec], moves: int) -> tuple[int, ...]:
    """Bounds of O5-O7 (with others): a task is touched when anything moves."""
    return (-(moves > 0), 0, 0) if n_tail(tasks) > 2 else ()


@dataclass(frozen=True)
class RelaxedBound:
    """The relaxation's lexicographic optimum (or bound, when ``proven`` is False
    for O3/O4): no allocation has an objective above ``objective``."""

    levels: tuple[int, ...]  # O2 per level, proven optimal in the relaxation
    spread: int  # lower bound of O3 among allocations reaching ``levels``
    moves: int  # lower bound of O4 among those also reaching ``spread``
    totals: dict[str, int]  # CPUs per task in the relaxation's optimum
    tail: tuple[int, ...] = ()  # bounds of O5-O7 with others (:func:`tail_bound`)

    @property
    def objective(self) -> tuple[int, ...]:
        return self.levels + (-self.spread, -self.moves) + self.tail


def relaxed_bound(
    view: View, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]],
    time_limit_s: float,
) -> RelaxedBound | None | str:
    """See :func:`_relaxed_bound`; with others, the bounds of O5-O7 follow."""
    rb = _relaxed_bound(view, tasks, current, time_limit_s)
    if isinstance(rb, RelaxedBound) and n_tail(tasks) > 2:
        rb = replace(rb, tail=tail_bound(tasks, rb.moves))
    return rb


def _relaxed_bound(
    view: View, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]],
    time_limit_s: float,
) -> RelaxedBound | None | str:
    """:class:`RelaxedBound`; None when the relaxation (so the problem) is
    infeasible; "unknown" when O2 was not proven within the time limit.
    O3 and O4 get what O2 left of the time limit; unproven, they keep the
    solver's bound (still valid) or the trivial one."""
    deadline = time.perf_counter() + time_limit_s
    if any(t.min_cores > effective_max(t, view) for t in tasks):
        return None  # more than the machine has
    m, X, pool = relaxation(view, tasks)
    o2 = _o2_bound(view, tasks, m, X, time_limit_s)
    if not isinstance(o2, tuple):
        return o2
    u, hint = o2
    spread_terms, span, const = _o3_spans(view, tasks, m, X)
    if pool is not None:
        _pool_cover_cuts(view, tasks, m, X, pool, span)
    for name, v in hint.items():
        m.add_hint(X[name], v)
    spread_lb = const
    totals = hint
    if spread_terms:
        m.minimize(sum(spread_terms))
        solver = _solver(deadline - time.perf_counter())
        st = solver.solve(m)
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return RelaxedBound(u, const + len(spread_terms), _gone(view, tasks, current), hint)
        spread_lb = const + math.ceil(solver.best_objective_bound - 1e-6)
        totals = {name: int(solver.value(v)) for name, v in X.items()}
        if st != cp_model.OPTIMAL:  # a bound, not an optimum: O4 is left at its trivial bound
            return RelaxedBound(u, spread_lb, 0, totals)
        m.add(sum(spread_terms) == spread_lb - const)
    if not current:
        return RelaxedBound(u, spread_lb, 0, totals)
    return _o4_bound(view, tasks, current, m, X, deadline, RelaxedBound(u, spread_lb, 0, totals))


def _o2_bound(view: View, tasks: Sequence[TaskSpec], m: cp_model.CpModel, X: dict[str, cp_model.IntVar],
              time_limit_s: float) -> tuple[tuple[int, ...], dict[str, int]] | None | str:
    """O2, lexicographic per priority level: (its optimum, fixed in ``m``, and the totals that reach
    it); None when infeasible, "unknown" when not proven within the time limit."""
    levels = priority_levels(tasks)
    sums = [sum(X[t.name] for t in tasks if t.priority == p) for p in levels]
    caps = [sum(effective_max(t, view) for t in tasks if t.priority == p) for p in levels]
    weights = lexicographic_weights(caps)
    if weights is None:
        return "unknown"
    solver = _solver(time_limit_s)
    m.maximize(sum(w * e for e, w in zip(sums, weights)))
    st = solver.solve(m)
    if st == cp_model.INFEASIBLE:
        return None
    if st != cp_model.OPTIMAL:
        return "unknown"
    u = tuple(int(solver.value(e)) for e in sums)
    for e, v in zip(sums, u):
        m.add(e == v)
    return u, {name: int(solver.value(v)) for name, v in X.items()}


def _o3_spans(view: View, tasks: Sequence[TaskSpec], m: cp_model.CpModel, X: dict[str, cp_model.IntVar],
              ) -> tuple[list[cp_model.LinearExprT], dict[tuple[str, str], cp_model.LinearExprT], int]:
    """O3: per sensitive task, nodes / domains spanned >= fewest holding X_t.  Returns the span
    variables to minimise, every span by (task, "numa"/"cache") (a variable D_t, or 1), and the
    count of spans that are 1 whatever the task's total."""
    tcaps = task_caps(view, tasks)
    spread_terms: list[cp_model.LinearExprT] = []
    span: dict[tuple[str, str], cp_model.LinearExprT] = {}  # (task, "numa"/"cache") -> D_t, or 1
    const = 0
    for t in tasks:
        for key, sizes in (("numa", tcaps[t.name][1]), ("cache", tcaps[t.name][2])):
            if key not in t.sensitive:
                continue
            hi = effective_max(t, view)
            if not sizes or sizes[0] >= hi:
                const += 1
                span[t.name, key] = 1
                continue
            prefix = [0]
            for s in sizes:
                prefix.append(prefix[-1] + s)
            lo = fewest(sizes, t.min_cores)
            d = m.new_int_var(max(1, lo), len(sizes), f"D{key}{t.name}")
            # X <= prefix[D], prefix concave in D: the minimum of its linear
            # pieces, one per distinct size (one constraint on uniform
            # machines).  Linear, so the LP is tight: 3x faster than an element
            # constraint (14 -> 5 ms with 128 tasks).
            for k, size in enumerate(sizes):
                if k == 0 or size != sizes[k - 1]:
                    m.add(X[t.name] <= prefix[k] + size * (d - k))
            spread_terms.append(d)
            span[t.name, key] = d
    return spread_terms, span, const


def _o4_bound(view: View, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]],
              m: cp_model.CpModel, X: dict[str, cp_model.IntVar], deadline: float,
              so_far: RelaxedBound) -> RelaxedBound:
    """O4: CPUs beyond a task's total must move (``m`` has O2 and O3 fixed; ``so_far`` is the
    bound with them and the totals that reach them)."""
    avail = set(view.cpus)
    gone = _gone(view, tasks, current)
    move_terms = []
    for t in tasks:
        if is_other(t):
            continue
        cur = set(current.get(t.name, ()))
        here = len(cur & avail)
        if here > t.min_cores:
            mv = m.new_int_var(0, here, f"M{t.name}")
            m.add(mv >= here - X[t.name])
            move_terms.append(mv)
    u, spread_lb, totals = so_far.levels, so_far.spread, so_far.totals
    if not move_terms:
        return RelaxedBound(u, spread_lb, gone, totals)
    m.clear_hints()
    for name, v in totals.items():
        m.add_hint(X[name], v)
    m.minimize(sum(move_terms))
    solver = _solver(deadline - time.perf_counter())
    st = solver.solve(m)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return RelaxedBound(u, spread_lb, gone, totals)
    return RelaxedBound(u, spread_lb, gone + math.ceil(solver.best_objective_bound - 1e-6),
                        {name: int(solver.value(v)) for name, v in X.items()})


def _gone(view: View, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]]) -> int:
    """Current CPUs of registered tasks that are not available any more: they move."""
    avail = set(view.cpus)
    return sum(len(set(current.get(t.name, ())) - avail) for t in tasks if not is_other(t))


def _pool_cover_cuts(view: View, tasks: Sequence[TaskSpec], m: cp_model.CpModel,
                     X: Mapping[str, cp_model.IntVar], pool: cp_model.IntVar,
                     span: Mapping[tuple[str, str], cp_model.LinearExprT]) -> None:
    """A shareable task spans every domain (node) of the shared pool but those
    whose pool PUs it can do without: D_t >= N - (P - X_t), N = domains (nodes)
    holding pool PUs, each at least one.  N is at least the sum of what the
    C5-disjoint groups of shareable tasks span: clean (cache-sensitive), polluted
    (polluters) and each isolated task (both).  Found on the 128-task bench mix:
    a numa-sensitive task as large as the pool must also cover the polluters'
    pool domain, which the per-task bound (X_t over the largest nodes) missed.

    Nodes count like domains only when every node lies in one L3 domain (then
    domains of different groups never share a node)."""
    shared = [t for t in tasks if not t.exclusive]
    groups: dict[str, list[TaskSpec]] = {}
    for t in shared:
        if t.pollutes_cache and "cache" in t.sensitive:
            groups[t.name] = [t]
        elif t.pollutes_cache:
            groups.setdefault("polluted", []).append(t)
        elif "cache" in t.sensitive:
            groups.setdefault("clean", []).append(t)
    if not groups or not any((t.name, k) in span and not isinstance(span[t.name, k], int)
                             for t in shared for k in ("numa", "cache")):
        return
    node_domains: dict[int, set[int]] = {}
    for g in view.classes:
        node_domains.setdefault(g.node, set()).add(g.domain)
    levels = {"cache": view.n_domains}
    if all(len(ds) == 1 for ds in node_domains.values()):
        levels["numa"] = len(node_domains)
    for key, n_units in levels.items():
        parts = []
        for label, group in groups.items():
            # every task of the group spans at least one unit, its own D when it has one
            n = m.new_int_var(1, n_units, f"N{key}_{label}")
            for t in group:
                for k in ("cache", "numa"):
                    # a task's domains are distinct units of either kind when
                    # nodes lie in one domain; nodes of one task are units for "numa"
                    if (t.name, k) in span and (k == "cache" or key == "numa"):
                        m.add(n >= span[t.name, k])
            parts.append(n)
        covered = sum(parts)
        m.add(covered <= n_units)
        for t in shared:
            d = span.get((t.name, key))
            if d is None or isinstance(d, int):
                continue
            m.add(d >= covered - (pool - X[t.name]))


def _solver(seconds: float) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = max(0.001, seconds)
    # as in cpsat._solver: presolve's symmetry detection and probing dominate here
    solver.parameters.symmetry_level = 0
    solver.parameters.cp_model_probing_level = 0
    return solver

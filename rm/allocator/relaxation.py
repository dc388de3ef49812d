"""The class-free relaxation of the count model: one total per task, no classes.

Solved by :func:`relaxed_levels` (O2 per level, for the count model's stages,
:mod:`.cpsat`) and by :func:`.bounds.relaxed_bound` (O2, O3, O4 lexicographically);
:mod:`.waterfill` solves the same relaxation without CP-SAT.
"""

from __future__ import annotations

import math
from typing import Sequence

from ortools.sat.python import cp_model

from .model import TaskSpec
from .problem import allowed_max, effective_max, is_e1, lexicographic_weights, priority_levels
from .topology import View


def relaxation(
    view: View, tasks: Sequence[TaskSpec]
) -> tuple[cp_model.CpModel, dict[str, cp_model.IntVar], cp_model.IntVar | None]:
    """The class-free relaxation of :func:`relaxed_levels`: the model, X per
    task and the shared pool's size P (None without shareable tasks)."""
    k = math.gcd(*(g.threads for g in view.classes)) if view.classes else 1
    m = cp_model.CpModel()
    X = {t.name: m.new_int_var(t.min_cores, allowed_max(view, t), f"X{t.name}") for t in tasks}
    total = len(view.cpus)
    load = []
    usage: dict[str, cp_model.LinearExprT] = {}  # PUs a task keeps from others
    shared = [t for t in tasks if not t.exclusive]
    pool = None
    if shared:
        pool = m.new_int_var(0, total, "P")
        for t in shared:
            m.add(X[t.name] <= pool)
            usage[t.name] = X[t.name]
        load.append(pool)
    for t in tasks:
        if not t.exclusive:
            continue
        if is_e1(t) and k > 1:
            cores = m.new_int_var(0, total // k, f"C{t.name}")
            m.add(k * cores >= X[t.name])
            usage[t.name] = k * cores
        else:
            usage[t.name] = X[t.name]
        load.append(usage[t.name])
    m.add(sum(load) <= total)
    _c5_rooms(m, view, tasks, X, usage, pool)
    if all(f is not None for f in view.node_free.values()):
        unit = math.gcd(*(t.working_set_bytes for t in tasks))
        if unit:
            budget = sum(view.node_free.values()) // unit
            m.add(sum(t.working_set_bytes // unit * X[t.name] for t in tasks) <= budget)
    return m, X, pool


def _c5_rooms(m: cp_model.CpModel, view: View, tasks: Sequence[TaskSpec], X: dict[str, cp_model.IntVar],
              usage: dict[str, cp_model.LinearExprT], pool: cp_model.IntVar | None) -> None:
    """C5 in aggregate: every domain is "clean" (cache-sensitive tasks may go
    there), "polluted" (plain polluters may), or owned by one task that both
    pollutes and is cache-sensitive (it may share with neither kind)."""
    polluters = [t for t in tasks if t.pollutes_cache and "cache" not in t.sensitive]
    sensitive = [t for t in tasks if "cache" in t.sensitive and not t.pollutes_cache]
    isolated = [t for t in tasks if t.pollutes_cache and "cache" in t.sensitive]
    if not (isolated or (polluters and sensitive)):
        return
    total = len(view.cpus)
    cap = [0] * view.n_domains
    for g in view.classes:
        cap[g.domain] += g.size
    kinds = ["clean", "polluted"] + [t.name for t in isolated]
    # Domains of equal size are interchangeable here: count them per kind
    # (an integer per size and kind, not a boolean per domain and kind:
    # no symmetric solutions; 24 domains of one size -> 3 integers).
    sizes: dict[int, int] = {}
    for d in range(view.n_domains):
        sizes[cap[d]] = sizes.get(cap[d], 0) + 1
    kind = {(z, k): m.new_int_var(0, n, f"kind{z}_{k}") for z, n in sizes.items() for k in kinds}
    for z, n in sizes.items():
        m.add(sum(kind[z, k] for k in kinds) == n)

    def room(k: str) -> cp_model.LinearExprT:
        return sum(z * kind[z, k] for z in sizes)

    sub_pools: list[cp_model.LinearExprT] = []

    def demand(group: list[TaskSpec], label: str) -> cp_model.LinearExprT:
        # exclusive tasks add up; shareable ones may share one pool
        out = sum(usage[t.name] for t in group if t.exclusive)
        shared_here = [t for t in group if not t.exclusive]
        if shared_here:
            sub_pool = m.new_int_var(0, total, f"pool_{label}")
            for t in shared_here:
                m.add(X[t.name] <= sub_pool)
            sub_pools.append(sub_pool)
            out += sub_pool
        return out

    m.add(demand(sensitive, "clean") <= room("clean"))
    m.add(demand(polluters, "polluted") <= room("polluted"))
    for t in isolated:
        m.add(X[t.name] <= room(t.name))
        if not t.exclusive:
            sub_pools.append(X[t.name])
    if len(sub_pools) > 1:
        # the pool's PUs in clean, polluted and isolated domains are disjoint
        m.add(pool >= sum(sub_pools))


def relaxed_levels(
    view: View, tasks: Sequence[TaskSpec], fixed: Sequence[int], workers: int = 1,
    time_limit_s: float = 1.0,
) -> list[int] | None:
    """Upper bounds of O2 per priority level from a relaxation without classes.

    Per task only its total X_t; C3+C6 become one machine-wide capacity (an E1
    task's PUs rounded up to whole cores of the gcd of the SMT widths), C4 one
    machine-wide memory budget, C5 a choice of polluted domains: cache-sensitive
    tasks fit in the others, polluters in those.  Every allocation maps to a
    solution of this relaxation with the same O2, so its lexicographic optimum
    bounds O2 from above; ``fixed`` pins the sums of the first levels.  None:
    infeasible, so the real problem is too.  Tiny model: one variable per task.
    """
    levels = priority_levels(tasks)
    m, X, _ = relaxation(view, tasks)
    sums = [sum(X[t.name] for t in tasks if t.priority == p) for p in levels]
    for e, v in zip(sums, fixed):
        m.add(e == v)
    caps = [sum(effective_max(t, view) for t in tasks if t.priority == p) for p in levels]
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = workers
    solver.parameters.max_time_in_seconds = max(0.001, time_limit_s)
    weights = lexicographic_weights(caps + [0])
    if weights is not None:
        m.maximize(sum(w * e for e, w in zip(sums, weights)))
    st = solver.solve(m)
    if st == cp_model.INFEASIBLE:
        return None
    if st != cp_model.OPTIMAL or weights is None:  # no proof: fall back to the trivial caps
        return caps
    return [int(solver.value(e)) for e in sums]

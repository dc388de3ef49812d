"""Exhaustive search with python-constraint: the oracle for small instances.

One variable per available CPU whose value is the set of tasks holding it
(empty, one exclusive task, or any non-empty set of shareable tasks).  The
constraints C1-C6 of :mod:`cod.rm.allocator.problem` prune partial assignments;
every complete solution is scored with :func:`cod.rm.allocator.problem.objective`.
Meant for tests (up to ~8 CPUs and 4 tasks), not for production.
"""

from __future__ import annotations

from itertools import combinations
from typing import Mapping, Sequence

import constraint

from .problem import allowed_cpus, effective_max, objective, violations
from .model import TaskSpec
from .topology import View

Unassigned = constraint.Unassigned


def search_space(view: View, tasks: Sequence[TaskSpec]) -> int:
    return len(_values(tasks)) ** len(view.cpus)


def _values(tasks: Sequence[TaskSpec]) -> list[frozenset[str]]:
    shared = [t.name for t in tasks if not t.exclusive]
    vals = [frozenset()] + [frozenset([t.name]) for t in tasks if t.exclusive]
    for k in range(1, len(shared) + 1):
        vals += [frozenset(c) for c in combinations(shared, k)]
    return vals


def best(
    view: View, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]] | None = None
) -> tuple[tuple[int, ...] | None, dict[str, list[int]] | None]:
    """(best objective, one allocation reaching it), or (None, None) if infeasible."""
    p = constraint.Problem()
    cpus = list(view.cpus)
    values = _values(tasks)
    allowed = {t.name: allowed_cpus(view, t) for t in tasks}
    for c in cpus:  # C7: a restricted task appears only on its allowed CPUs
        p.addVariable(c, [v for v in values
                          if all(allowed[n] is None or c in allowed[n] for n in v)])
    for t in tasks:  # C2, checked on partial assignments too
        lo, hi = t.min_cores, effective_max(t, view)

        def rows(*vals, name=t.name, lo=lo, hi=hi):
            held = sum(1 for v in vals if v is not Unassigned and name in v)
            open_ = sum(1 for v in vals if v is Unassigned)
            return held <= hi and held + open_ >= lo

        p.addConstraint(constraint.FunctionConstraint(rows, assigned=False), cpus)
    by_name = {t.name: t for t in tasks}
    for node, free in view.node_free.items():  # C4
        if free is None:
            continue
        on = [c for c in cpus if view.node_of[c] == node]

        def mem(*vals, free=free):
            return sum(by_name[n].working_set_bytes for v in vals if v is not Unassigned for n in v) <= free

        p.addConstraint(constraint.FunctionConstraint(mem, assigned=False), on)
    for c in cpus:  # C6
        for s in view.siblings[c]:
            if s > c:
                def smt(a, b):
                    if a is Unassigned or b is Unassigned:
                        return True
                    for x, y in ((a, b), (b, a)):
                        for n in x:
                            t = by_name[n]
                            if t.exclusive and not t.allow_smt_sharing and (y - {n}):
                                return False
                    return True

                p.addConstraint(constraint.FunctionConstraint(smt, assigned=False), [c, s])
    best_obj: tuple[int, ...] | None = None
    best_alloc: dict[str, list[int]] | None = None
    for sol in p.getSolutionIter():
        alloc = {t.name: sorted(c for c in cpus if t.name in sol[c]) for t in tasks}
        if violations(view, tasks, alloc):  # C5 and anything not pruned above
            continue
        obj = objective(view, tasks, alloc, current)
        if best_obj is None or obj > best_obj:
            best_obj, best_alloc = obj, alloc
    return best_obj, best_alloc

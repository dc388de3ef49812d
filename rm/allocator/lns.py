"""Closing the last gap of a packing: CP-SAT on a small neighbourhood.

A packing (:mod:`.packing`) that reaches the O2 bound is typically one or two
nodes/domains above the O3 bound: some sensitive task has a small piece in
one more node than it needs.  The fix usually moves several other tasks
between two nodes, which a greedy cannot see but the count model solves in a
few milliseconds when restricted to those nodes:

1. pick a task above its own bound (its total against its largest
   capacities) and the nodes of its two smallest pieces, then those plus one
   more node; close the set over domains (every class of those nodes and of their domains), so memory (C4)
   and C5 are entirely inside it;
2. every task keeps, inside the set, the number of PUs it has there (O2 and
   everything outside stay as they are); the count model of :mod:`.cpsat`
   on the sub-machine re-places them, minimising spread (then moves);
3. keep the answer if the spread went down; repeat while time is left.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Mapping, Sequence

from ortools.sat.python import cp_model

from .bounds import fewest, task_caps
from .cpsat import _build, _lower_objective, _solver
from .problem import is_e1
from .model import TaskSpec
from .topology import CpuClass, View

Counts = dict[str, dict[int, int]]


def improve(view: View, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]],
            counts: Counts, cores: Counts, deadline: float, per_solve_s: float = 0.03
            ) -> tuple[Counts, Counts, int]:
    """Better (counts, cores) and how many neighbourhoods improved; the
    arguments are not modified."""
    counts = {k: dict(v) for k, v in counts.items()}
    cores = {k: dict(v) for k, v in cores.items()}
    caps = task_caps(view, tasks)
    totals = {t.name: sum(counts[t.name].values()) for t in tasks}
    own = {t.name: ("numa" in t.sensitive) * fewest(caps[t.name][1], totals[t.name])
           + ("cache" in t.sensitive) * fewest(caps[t.name][2], totals[t.name]) for t in tasks}
    tried: set[frozenset[int]] = set()
    improved = 0
    while time.perf_counter() + per_solve_s / 2 < deadline:
        hood = None
        for t in sorted(tasks, key=lambda t: (own[t.name] - _span(view, t, counts[t.name]), t.name)):
            if _span(view, t, counts[t.name]) <= own[t.name]:
                break
            for cand in _neighbourhoods(view, t, counts[t.name]):
                if cand not in tried:
                    hood = cand
                    break
            if hood is not None:
                break
        if hood is None:
            break
        tried.add(hood)
        budget = min(per_solve_s, deadline - time.perf_counter())
        if _solve_hood(view, tasks, current, counts, cores, hood, budget):
            improved += 1
            tried.clear()
    return counts, cores, improved


def _span(view: View, t: TaskSpec, per_class: Mapping[int, int]) -> int:
    used = [view.classes[gi] for gi, n in per_class.items() if n]
    return (("numa" in t.sensitive) * len({g.node for g in used})
            + ("cache" in t.sensitive) * len({g.domain for g in used}))


def _neighbourhoods(view: View, t: TaskSpec, per_class: Mapping[int, int]) -> list[frozenset[int]]:
    """The nodes of t's two smallest pieces, then those plus one more node
    (nodes t does not use first: where the tasks in the way can go); each
    closed over domains, as sets of classes."""
    pieces: dict[int, int] = {}
    for gi, n in per_class.items():
        if n:
            node = view.classes[gi].node
            pieces[node] = pieces.get(node, 0) + n
    if len(pieces) < 2:
        return []
    base = set(sorted(pieces, key=lambda n: (pieces[n], n))[:2])
    others = sorted(set(view.nodes) - base, key=lambda n: (n in pieces, n))
    return [_closed(view, base)] + [_closed(view, base | {n}) for n in others]


def _closed(view: View, nodes: set[int]) -> frozenset[int]:
    nodes = set(nodes)
    while True:
        classes = {g.index for g in view.classes if g.node in nodes}
        domains = {view.classes[gi].domain for gi in classes}
        more = {g.node for g in view.classes if g.domain in domains} - nodes
        if not more:
            return frozenset(classes)
        nodes |= more


def _solve_hood(view: View, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]],
                counts: Counts, cores: Counts, hood: frozenset[int], budget: float) -> bool:
    old = sorted(hood)
    domains = sorted({view.classes[gi].domain for gi in old})
    dmap = {d: i for i, d in enumerate(domains)}
    new_of = {gi: i for i, gi in enumerate(old)}
    classes = tuple(CpuClass(i, dmap[view.classes[gi].domain], view.classes[gi].node,
                             view.classes[gi].threads, view.classes[gi].cores, view.classes[gi].part)
                    for i, gi in enumerate(old))
    cpus = tuple(sorted(c for g in classes for c in g.cpus))
    nodes = tuple(sorted({g.node for g in classes}))
    sub_view = View(
        cpus=cpus, node_of={c: view.node_of[c] for c in cpus},
        domain_of={c: dmap[view.domain_of[c]] for c in cpus}, core_of={c: view.core_of[c] for c in cpus},
        siblings={c: view.siblings[c] for c in cpus}, domain_labels=tuple(view.domain_labels[d] for d in domains),
        nodes=nodes, node_free={n: view.node_free.get(n) for n in nodes}, classes=classes,
        allowed_sets=view.allowed_sets,
    )
    inside = {t.name: sum(counts[t.name].get(gi, 0) for gi in old) for t in tasks}
    # same kinds (others stay others, with their allowed CPUs), sizes fixed
    sub_tasks = [replace(t, min_cores=inside[t.name], max_cores=inside[t.name], priority=0)
                 for t in tasks if inside[t.name]]
    by_name = {t.name: t for t in tasks}
    sub_current = {name: [c for c in cur if c in sub_view.node_of] for name, cur in current.items()}
    mod = _build(sub_view, sub_tasks, sub_current)
    before = sum(_span(view, by_name[t.name], {gi: counts[t.name].get(gi, 0) for gi in old}) for t in sub_tasks)
    pool: dict[int, int] = {}
    for t in sub_tasks:
        for gi in old:
            n = counts[t.name].get(gi, 0)
            mod.m.add_hint(mod.x[t.name, new_of[gi]], n)
            if (t.name, new_of[gi]) in mod.c:
                mod.m.add_hint(mod.c[t.name, new_of[gi]], cores.get(t.name, {}).get(gi, 0))
            if not t.exclusive:
                pool[new_of[gi]] = max(pool.get(new_of[gi], 0), n)
    for i, v in mod.pool.items():
        mod.m.add_hint(v, pool.get(i, 0))
    if mod.spread_cap:
        mod.m.add(mod.spread <= before - 1)  # only strictly better answers are of use
    mod.m.maximize(_lower_objective(mod))
    solver = _solver(1, budget)
    st = solver.solve(mod.m)
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return False
    for t in sub_tasks:
        for gi in old:
            n = int(solver.value(mod.x[t.name, new_of[gi]]))
            if n:
                counts[t.name][gi] = n
            else:
                counts[t.name].pop(gi, None)
            if is_e1(by_name[t.name]):
                key = (t.name, new_of[gi])
                c = int(solver.value(mod.c[key])) if key in mod.c else n
                if c:
                    cores.setdefault(t.name, {})[gi] = c
                else:
                    cores.setdefault(t.name, {}).pop(gi, None)
    return True

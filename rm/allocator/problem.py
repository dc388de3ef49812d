"""The allocation problem stated once, on concrete allocations.

Every solver must produce allocations that :func:`violations` accepts, and the
optimal ones maximise :func:`objective`.  Tests and the python-constraint
oracle use these two functions, so the definition lives in one place.

Constraints (numbered as in the solvers' docstrings):

* C1 a task's CPUs are distinct, available CPUs;
* C2 ``min_cores <= |cpus| <= max_cores`` (max None = every available CPU);
* C3 an exclusive task's CPUs are held by no other task;
* C4 per NUMA node with known free memory, the sum over tasks of (CPUs the
  task holds there x its working set per CPU) fits in the node's free memory;
* C5 a cache-sensitive task shares no domain (L3) with another task that
  pollutes the cache;
* C6 the SMT siblings of an exclusive task's CPUs are held by no other task,
  unless that task has ``allow_smt_sharing``.

Objective, lexicographic, as a tuple compared element by element (larger wins):

* O1 admission: every task gets ``min_cores`` (hard: C2; otherwise infeasible);
* O2 CPUs granted, per priority level from the highest down: one sum per level;
* O3 minus the spread of sensitive tasks: NUMA nodes spanned by each
  numa-sensitive task plus domains spanned by each cache-sensitive task;
* O4 minus the moves: CPUs of the current allocation a task no longer holds.

Ties beyond O4 are broken deterministically by each solver (lowest CPU numbers).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from .model import TaskSpec
from .topology import View


def is_e1(t: TaskSpec) -> bool:
    """E1: exclusive without SMT sharing (holds whole cores); E2: exclusive
    with SMT sharing; S: shareable."""
    return t.exclusive and not t.allow_smt_sharing


def effective_max(task: TaskSpec, view: View) -> int:
    n = len(view.cpus)
    return n if task.max_cores is None else min(task.max_cores, n)


def violations(
    view: View, tasks: Sequence[TaskSpec], alloc: Mapping[str, Sequence[int]]
) -> list[str]:
    """Every broken constraint, as readable strings; [] means feasible."""
    out: list[str] = []
    avail = set(view.cpus)
    holders: dict[int, list[TaskSpec]] = {}
    for t in tasks:
        cpus = list(alloc.get(t.name, ()))
        if len(set(cpus)) != len(cpus):
            out.append(f"C1 {t.name}: duplicate CPUs")
        bad = sorted(set(cpus) - avail)
        if bad:
            out.append(f"C1 {t.name}: CPU {bad[0]} not available")
        n = len(set(cpus))
        if not (t.min_cores <= n <= effective_max(t, view)):
            out.append(f"C2 {t.name}: {n} CPUs outside [{t.min_cores}, {effective_max(t, view)}]")
        for c in set(cpus):
            holders.setdefault(c, []).append(t)
    for c, hs in sorted(holders.items()):
        if len(hs) > 1 and any(h.exclusive for h in hs):
            out.append(f"C3 CPU {c}: exclusive task shares it with {', '.join(h.name for h in hs)}")
    used_on: dict[int, int] = {}
    for t in tasks:
        if t.working_set_bytes:
            for c in set(alloc.get(t.name, ())):
                n = view.node_of.get(c)
                used_on[n] = used_on.get(n, 0) + t.working_set_bytes
    for node, free in view.node_free.items():
        if free is None:
            continue
        used = used_on.get(node, 0)
        if used > free:
            out.append(f"C4 node {node}: {used} bytes of working sets > {free} free")
    domains = {t.name: {view.domain_of[c] for c in alloc.get(t.name, ()) if c in view.domain_of} for t in tasks}
    for t in tasks:
        if "cache" not in t.sensitive:
            continue
        for u in tasks:
            if u.name != t.name and u.pollutes_cache and domains[t.name] & domains[u.name]:
                out.append(f"C5 {t.name} shares an L3 domain with polluter {u.name}")
    for t in tasks:
        if not t.exclusive or t.allow_smt_sharing:
            continue
        for c in set(alloc.get(t.name, ())):
            for s in view.siblings.get(c, ()):
                others = [h.name for h in holders.get(s, ()) if h.name != t.name]
                if others:
                    out.append(f"C6 CPU {s}, SMT sibling of {t.name}'s CPU {c}, held by {others[0]}")
    return out


def priority_levels(tasks: Sequence[TaskSpec]) -> list[int]:
    return sorted({t.priority for t in tasks}, reverse=True)


def moves(tasks: Sequence[TaskSpec], alloc: Mapping[str, Sequence[int]],
          current: Mapping[str, Sequence[int]] | None) -> int:
    if not current:
        return 0
    return sum(len(set(current.get(t.name, ())) - set(alloc.get(t.name, ()))) for t in tasks)


def spread(view: View, tasks: Sequence[TaskSpec], alloc: Mapping[str, Sequence[int]]) -> int:
    total = 0
    for t in tasks:
        cpus = alloc.get(t.name, ())
        if "numa" in t.sensitive:
            total += len({view.node_of[c] for c in cpus})
        if "cache" in t.sensitive:
            total += len({view.domain_of[c] for c in cpus})
    return total


def objective(
    view: View,
    tasks: Sequence[TaskSpec],
    alloc: Mapping[str, Sequence[int]],
    current: Mapping[str, Sequence[int]] | None = None,
) -> tuple[int, ...]:
    """(O2 per level..., -O3, -O4); compare tuples, larger is better."""
    granted = tuple(
        sum(len(set(alloc.get(t.name, ()))) for t in tasks if t.priority == p)
        for p in priority_levels(tasks)
    )
    return granted + (-spread(view, tasks, alloc), -moves(tasks, alloc, current))

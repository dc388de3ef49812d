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
  unless that task has ``allow_smt_sharing``;
* C7 an unregistered process's CPUs lie in whole cores of its ``allowed`` set.

Unregistered busy processes (:class:`.model.OtherDemand`, "others", issue #18)
take part as tasks of their own kind (:class:`OtherSpec`): exclusive, SMT
sharing allowed, ``min_cores`` 0, ``max_cores`` = the cores they need, and a
priority level above every registered task, so a newcomer gets its CPUs
before any registered task grows (as the old ``unavailable`` CPUs did), but
never at the cost of a registered task's ``min_cores``.

Objective, lexicographic, as a tuple compared element by element (larger wins):

* O1 admission: every task gets ``min_cores`` (hard: C2; otherwise infeasible);
* O2 CPUs granted, per priority level from the highest down: one sum per level;
* O3 minus the spread of sensitive tasks: NUMA nodes spanned by each
  numa-sensitive task plus domains spanned by each cache-sensitive task;
* O4 minus the moves: CPUs of the current allocation a (registered) task no
  longer holds.

With others, three more terms follow (without, the tuple ends at O4):

* O5 minus the registered tasks touched: those that lose any current CPU;
* O6 minus the disturbance: per other, the cache-sensitive tasks it shares an
  L3 domain with plus the numa-sensitive tasks it shares a NUMA node with
  (a newcomer lands away from them where it can);
* O7 minus the others' moves: CPUs an other runs on now and no longer gets.

So a newcomer takes free CPUs first, then those of the task that loses least
(lowest priority, fewest tasks touched, not a sensitive one), and moves itself
rather than a registered task.

Ties beyond the last term are broken deterministically by each solver (lowest CPU numbers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from .model import OtherDemand, TaskSpec, TaskSpecError
from .topology import View

# Others' priority: one level above every registered task's.
OTHER_PRIORITY = math.inf


@dataclass(frozen=True)
class OtherSpec(TaskSpec):
    """An :class:`.model.OtherDemand` as the solvers see it (see the module doc)."""

    allowed: frozenset[int] | None = None

    def __post_init__(self) -> None:  # built by as_tasks only: no user input to check
        pass


def as_tasks(others: Iterable[OtherDemand]) -> list[OtherSpec]:
    return [OtherSpec(o.name, min_cores=0, max_cores=o.cores, exclusive=True, allow_smt_sharing=True,
                      priority=OTHER_PRIORITY, allowed=None if o.allowed is None else frozenset(o.allowed))
            for o in others]


def check_names(tasks: Sequence[TaskSpec], others: Sequence[OtherDemand] = ()) -> None:
    """Task and other names are unique together."""
    seen: set[str] = set()
    for kind, name in [("task", t.name) for t in tasks] + [("other", o.name) for o in others]:
        if name in seen:
            raise TaskSpecError(f"{kind} {name!r}: name: appears more than once")
        seen.add(name)


def is_other(t: TaskSpec) -> bool:
    return isinstance(t, OtherSpec)


def allowed_cpus(view: View, t: TaskSpec) -> frozenset[int] | None:
    """The CPUs ``t`` may hold under C7 (None: every available CPU)."""
    if not isinstance(t, OtherSpec) or t.allowed is None:
        return None
    classes = view.allowed_classes(t.allowed)
    return frozenset(c for g in view.classes if g.index in classes for c in g.cpus)


def is_e1(t: TaskSpec) -> bool:
    """E1: exclusive without SMT sharing (holds whole cores); E2: exclusive
    with SMT sharing; S: shareable."""
    return t.exclusive and not t.allow_smt_sharing


def effective_max(task: TaskSpec, view: View) -> int:
    n = len(view.cpus)
    return n if task.max_cores is None else min(task.max_cores, n)


def allowed_max(view: View, t: TaskSpec) -> int:
    """:func:`effective_max`, within the CPUs ``t`` may hold (C7)."""
    allowed = allowed_cpus(view, t)
    hi = effective_max(t, view)
    return hi if allowed is None else min(hi, len(allowed))


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
        allowed = allowed_cpus(view, t)
        if allowed is not None and set(cpus) - allowed:
            out.append(f"C7 {t.name}: CPU {min(set(cpus) - allowed)} outside its allowed whole cores")
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
    """O4: current CPUs registered tasks no longer hold (others: :func:`other_moves`)."""
    if not current:
        return 0
    return sum(len(set(current.get(t.name, ())) - set(alloc.get(t.name, ()))) for t in tasks if not is_other(t))


def touched(tasks: Sequence[TaskSpec], alloc: Mapping[str, Sequence[int]],
            current: Mapping[str, Sequence[int]] | None) -> int:
    """O5: registered tasks that lose any current CPU."""
    if not current:
        return 0
    return sum(1 for t in tasks if not is_other(t) and set(current.get(t.name, ())) - set(alloc.get(t.name, ())))


def disturbance(view: View, tasks: Sequence[TaskSpec], alloc: Mapping[str, Sequence[int]]) -> int:
    """O6: per other, the cache-sensitive tasks sharing one of its L3 domains and
    the numa-sensitive tasks sharing one of its nodes."""
    others = [t for t in tasks if is_other(t) and alloc.get(t.name)]
    if not others:
        return 0
    total = 0
    for o in others:
        o_domains = {view.domain_of[c] for c in alloc[o.name]}
        o_nodes = {view.node_of[c] for c in alloc[o.name]}
        for t in tasks:
            if is_other(t) or not t.sensitive:
                continue
            cpus = alloc.get(t.name, ())
            if "cache" in t.sensitive and o_domains.intersection(view.domain_of[c] for c in cpus):
                total += 1
            if "numa" in t.sensitive and o_nodes.intersection(view.node_of[c] for c in cpus):
                total += 1
    return total


def other_moves(tasks: Sequence[TaskSpec], alloc: Mapping[str, Sequence[int]],
                current: Mapping[str, Sequence[int]] | None) -> int:
    """O7: CPUs others run on now and no longer get."""
    if not current:
        return 0
    return sum(len(set(current.get(t.name, ())) - set(alloc.get(t.name, ()))) for t in tasks if is_other(t))


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
    """(O2 per level..., -O3, -O4[, -O5, -O6, -O7 with others]); compare
    tuples, larger is better."""
    granted = tuple(
        sum(len(set(alloc.get(t.name, ()))) for t in tasks if t.priority == p)
        for p in priority_levels(tasks)
    )
    out = granted + (-spread(view, tasks, alloc), -moves(tasks, alloc, current))
    if any(is_other(t) for t in tasks):
        out += (-touched(tasks, alloc, current), -disturbance(view, tasks, alloc),
                -other_moves(tasks, alloc, current))
    return out


def lexicographic_weights(bounds: list[int]) -> list[int] | None:
    """Weights making a weighted sum of terms (each in [0, bound]) exactly
    lexicographic, as :func:`objective` compares, or None if they exceed 62 bits."""
    weights = [1]
    for ub in reversed(bounds[1:]):
        weights.append(weights[-1] * (ub + 1))
    weights.reverse()
    if weights[0] * (bounds[0] + 1) >= 1 << 62:
        return None
    return weights


def n_tail(tasks: Sequence[TaskSpec]) -> int:
    """How many terms follow O2 in :func:`objective`: 2, or 5 with others."""
    return 5 if any(is_other(t) for t in tasks) else 2

"""The global allocator (issue #5): a pure function from (machine, tasks,
current allocation) to an allocation; no sockets, cgroups or Prolog.

Solvers: ``cpsat`` (a lexicographic relaxation bound, a best-fit packing and
small CP-SAT neighbourhoods that usually prove the answer without search, then
the count model over classes of interchangeable CPUs, with the best answer so
far as fallback on timeout; see :mod:`.solve`), ``naive`` (the paper's
Figure 4 core-by-task boolean matrix, a reference model) and ``greedy``.
The problem itself (constraints C1-C6, objective O1-O4) is stated in
:mod:`cod.rm.allocator.problem`.
"""

from __future__ import annotations

import time
from typing import Iterable, Mapping, Sequence

from cod.facts.model import Machine

from .explain import explain, explain_reservations
from .greedy import solve_greedy
from .solve import Outcome, solve_exact  # imports ortools once, not inside the timed call
from .model import (SOLVERS, AllocationResult, OtherDemand, Reservation, TaskAllocation, TaskSpec,
                    TaskSpecError)
from .problem import as_tasks, check_names
from .topology import View, build_view

__all__ = [
    "Allocator",
    "allocate",
    "AllocationResult",
    "OtherDemand",
    "Reservation",
    "TaskAllocation",
    "TaskSpec",
    "TaskSpecError",
    "SOLVERS",
]


def allocate(
    machine: Machine,
    tasks: Sequence[TaskSpec],
    current: Mapping[str, Sequence[int]] | None = None,
    *,
    others: Sequence[OtherDemand] = (),
    unavailable: Iterable[int] = (),
    solver: str = "cpsat",
    time_limit_s: float = 1.0,
) -> AllocationResult:
    """Allocate CPUs (Linux CPU numbers) to ``tasks`` on ``machine``.

    ``current`` maps task names to the CPUs they hold now (unknown names are
    ignored).  ``others`` are unregistered busy processes: the allocator keeps
    CPUs for them (``result.reservations``) with the same objective (see
    :mod:`.problem`), and names them in ``displaced_by`` of any task that lost
    CPUs to them.  ``unavailable`` are CPUs nobody may be given (the older,
    blunter way to keep CPUs for other work).  The result is "infeasible"
    (with ``reason``) when some task cannot get ``min_cores``.
    """
    start = time.perf_counter()
    if solver not in SOLVERS:
        raise ValueError(f"solver: must be one of {', '.join(SOLVERS)}, got {solver!r}")
    check_names(tasks, others)
    unavailable = tuple(unavailable)
    cpus = set(machine.cpu_ids())
    for o in others:
        bad = sorted(set(o.cpus) - cpus) + sorted(set(o.allowed or ()) - cpus)
        if bad:
            raise ValueError(f"other {o.name!r}: CPU {bad[0]} does not exist on {machine.name}")
    view = build_view(machine, unavailable, [frozenset(o.allowed) for o in others if o.allowed is not None])
    everyone = list(tasks) + as_tasks(others)
    cur = {k: tuple(v) for k, v in (current or {}).items()}
    cur.update({o.name: o.cpus for o in others})

    if solver == "greedy":
        alloc, reason = solve_greedy(view, everyone, cur)
        out = Outcome(alloc, reason, "feasible" if alloc is not None else "infeasible", "greedy", via="greedy")
    else:
        out = solve_exact(view, everyone, cur, solver, time_limit_s)
    return _result(view, everyone, cur, out, start, len(unavailable))


def _result(view: View, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]], out: Outcome,
            start: float, n_unavailable: int) -> AllocationResult:
    if out.alloc is None:
        return AllocationResult("infeasible", out.solver, (time.perf_counter() - start) * 1e3, (), out.reason,
                                via=out.via)
    explained = explain(view, tasks, out.alloc, n_unavailable, current)
    reservations = explain_reservations(view, tasks, out.alloc, current)
    gap = out.gap if out.status == "feasible" else None
    return AllocationResult(out.status, out.solver, (time.perf_counter() - start) * 1e3, explained, None, gap,
                            reservations, out.via)


class Allocator:
    """The allocator the RM keeps between calls: one machine, its view and the
    last published allocation, so that one arrival or departure is re-planned
    from there (see docs/design-allocator.md, "Incremental re-planning")."""

    def __init__(self, machine: Machine, *, solver: str = "cpsat", time_limit_s: float = 1.0) -> None:
        if solver not in SOLVERS:
            raise ValueError(f"solver: must be one of {', '.join(SOLVERS)}, got {solver!r}")
        self.machine = machine
        self.solver = solver
        self.time_limit_s = time_limit_s

    def allocate(self, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]] | None = None, *,
                 others: Sequence[OtherDemand] = (), unavailable: Iterable[int] = (),
                 time_limit_s: float | None = None) -> AllocationResult:
        return allocate(self.machine, tasks, current, others=others, unavailable=unavailable, solver=self.solver,
                        time_limit_s=self.time_limit_s if time_limit_s is None else time_limit_s)

    def reset(self, tasks: Sequence[TaskSpec] = (), published: Mapping[str, Sequence[int]] | None = None) -> None:
        """Forget what was learnt (benchmarks: the same state before each change)."""

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

from .explain import explain
from .greedy import solve_greedy
from .solve import Outcome, solve_exact  # imports ortools once, not inside the timed call
from .model import SOLVERS, AllocationResult, TaskAllocation, TaskSpec, TaskSpecError
from .topology import View, build_view

__all__ = [
    "allocate",
    "AllocationResult",
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
    unavailable: Iterable[int] = (),
    solver: str = "cpsat",
    time_limit_s: float = 1.0,
) -> AllocationResult:
    """Allocate CPUs (Linux CPU numbers) to ``tasks`` on ``machine``.

    ``current`` maps task names to the CPUs they hold now (unknown names are
    ignored); ``unavailable`` are CPUs busy with unregistered work.  The result
    is "infeasible" (with ``reason``) when some task cannot get ``min_cores``.
    """
    start = time.perf_counter()
    if solver not in SOLVERS:
        raise ValueError(f"solver: must be one of {', '.join(SOLVERS)}, got {solver!r}")
    names = [t.name for t in tasks]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise TaskSpecError(f"task {dup[0]!r}: name: appears more than once")
    unavailable = tuple(unavailable)
    view = build_view(machine, unavailable)
    cur = {k: tuple(v) for k, v in (current or {}).items()}

    if solver == "greedy":
        alloc, reason = solve_greedy(view, tasks, cur)
        out = Outcome(alloc, reason, "feasible" if alloc is not None else "infeasible", "greedy")
    else:
        out = solve_exact(view, tasks, cur, solver, time_limit_s)
    return _result(view, tasks, out, start, len(unavailable))


def _result(
    view: View, tasks: Sequence[TaskSpec], out: Outcome, start: float, n_unavailable: int
) -> AllocationResult:
    if out.alloc is None:
        return AllocationResult("infeasible", out.solver, (time.perf_counter() - start) * 1e3, (), out.reason)
    explained = explain(view, tasks, out.alloc, n_unavailable)
    gap = out.gap if out.status == "feasible" else None
    return AllocationResult(out.status, out.solver, (time.perf_counter() - start) * 1e3, explained, None, gap)

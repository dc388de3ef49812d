"""The global allocator (issues #5, #18, #19): a pure function from (machine,
tasks, current allocation, unregistered busy processes) to an allocation and
reservations; no sockets, cgroups or Prolog.  :class:`Allocator` is the same
with memory of its last answer, so the RM re-plans one change incrementally.

Solvers: ``cpsat`` (greedy or a best-fit packing proven by a bound - closed
form, the waterfill of :mod:`.waterfill`, or CP-SAT's relaxation - then small
CP-SAT neighbourhoods and the count model over classes of interchangeable
CPUs, with the best answer so far as fallback on timeout; see :mod:`.solve`),
``naive`` (the paper's Figure 4 core-by-task boolean matrix, a reference
model) and ``greedy``.  The problem itself (constraints C1-C7, objective
O1-O7) is stated in :mod:`cod.rm.allocator.problem`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Iterable, Mapping, Sequence

from cod.facts.model import Machine

from .model import (SOLVERS, AllocationResult, OtherDemand, Reservation, TaskAllocation, TaskSpec,
                    TaskSpecError)

if TYPE_CHECKING:
    from .incremental import Allocator

__all__ = [
    "allocate",
    "Allocator",
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
    (with ``reason``) when some task cannot get ``min_cores``.  The RM keeps
    an :class:`Allocator` instead, which re-plans one change incrementally.
    """
    from .request import prepare, result, solve  # imports ortools on the first call, before the clock

    start = time.perf_counter()
    if solver not in SOLVERS:
        raise ValueError(f"solver: must be one of {', '.join(SOLVERS)}, got {solver!r}")
    req = prepare(machine, tasks, current, others, unavailable)
    return result(req, solve(req, solver, time_limit_s), start)


def __getattr__(name: str) -> object:
    # Allocator on first use: its solvers import OR-Tools (~0.5 s), which the data types above and
    # every `cod` command that only parses its arguments do without (bench/cli_start.py).
    if name == "Allocator":
        from .incremental import Allocator

        return Allocator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

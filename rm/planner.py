"""The daemon's side of the global allocator: one run at a time, off the event loop, on a snapshot.

Policy lives in cod.rm.allocator; this module only adapts the RM's tasks to it
and back.  The allocator is pure Python / OR-Tools, so it runs in a worker
thread (`run_in_executor`) while the loop keeps answering other clients.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from cod.facts.model import Machine

from .allocator import OtherDemand, TaskSpec, allocate


@dataclass(frozen=True)
class Plan:
    """The allocator's answer: CPUs per task, or why it could not admit every task."""

    cores: dict[str, tuple[int, ...]] | None
    reason: str | None
    solver: str
    solve_ms: float
    status: str = "optimal"  # optimal | feasible | fallback | infeasible (cod.rm.allocator)
    binding: dict[str, tuple[str, ...]] = field(default_factory=dict)  # what limited each task
    # CPUs kept for each unregistered busy process (OtherDemand name -> CPUs), chosen by the allocator
    reservations: dict[str, tuple[int, ...]] = field(default_factory=dict)
    # per task that lost CPUs it held to unregistered processes: their names (its upcall's reason)
    displaced_by: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # how the allocator found and proved it, e.g. "greedy = waterfill bound" (AllocationResult.via)
    proof: str = ""

    @property
    def unavailable(self) -> tuple[int, ...]:
        """Every CPU kept for unregistered busy processes."""
        return tuple(sorted({c for cpus in self.reservations.values() for c in cpus}))


def _run_allocator(
    machine: Machine, specs: Sequence[TaskSpec], current: Mapping[str, Sequence[int]],
    others: tuple[OtherDemand, ...], solver: str, time_limit_s: float,
) -> Plan:
    # CP-SAT by default; the allocator itself falls back to greedy when the time limit hits.
    result = allocate(machine, list(specs), dict(current), others=others, solver=solver, time_limit_s=time_limit_s)
    if result.status == "infeasible":
        return Plan(None, result.reason, result.solver, result.solve_ms, result.status, proof=result.via)
    return Plan({t.name: tuple(t.cores) for t in result.tasks}, None, result.solver, result.solve_ms,
                result.status, {t.name: tuple(t.binding) for t in result.tasks},
                {r.name: tuple(r.cpus) for r in result.reservations},
                {t.name: tuple(t.displaced_by) for t in result.tasks if t.displaced_by}, result.via)


class Planner:
    def __init__(self, machine: Machine, solver: str = "cpsat", time_limit_s: float = 1.0) -> None:
        self.machine = machine
        self.solver = solver
        self.time_limit_s = time_limit_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cod-allocator")

    async def run(self, specs: Sequence[TaskSpec], current: Mapping[str, Sequence[int]],
                  others: Sequence[OtherDemand] = ()) -> Plan:
        if not specs:  # no task to keep them from: each other stays where it runs
            return Plan({}, None, "none", 0.0, "optimal", reservations={o.name: o.cpus for o in others})
        loop = asyncio.get_running_loop()
        snapshot = (tuple(specs), {k: tuple(v) for k, v in current.items()}, tuple(others))
        return await loop.run_in_executor(self._executor, _run_allocator, self.machine, *snapshot,
                                          self.solver, self.time_limit_s)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

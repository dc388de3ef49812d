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

from .allocator import TaskSpec, allocate


@dataclass(frozen=True)
class Plan:
    """The allocator's answer: CPUs per task, or why it could not admit every task."""

    cores: dict[str, tuple[int, ...]] | None
    reason: str | None
    solver: str
    solve_ms: float
    status: str = "optimal"  # optimal | feasible | fallback | infeasible (cod.rm.allocator)
    binding: dict[str, tuple[str, ...]] = field(default_factory=dict)  # what limited each task
    unavailable: tuple[int, ...] = ()  # CPUs kept free for unregistered busy processes


def _run_allocator(
    machine: Machine, specs: Sequence[TaskSpec], current: Mapping[str, Sequence[int]],
    unavailable: tuple[int, ...], solver: str, time_limit_s: float,
) -> Plan:
    # CP-SAT by default; the allocator itself falls back to greedy when the time limit hits.
    result = allocate(machine, list(specs), dict(current), unavailable=unavailable,
                      solver=solver, time_limit_s=time_limit_s)
    if result.status == "infeasible":
        return Plan(None, result.reason, result.solver, result.solve_ms, result.status, {}, unavailable)
    return Plan({t.name: tuple(t.cores) for t in result.tasks}, None, result.solver, result.solve_ms,
                result.status, {t.name: tuple(t.binding) for t in result.tasks}, unavailable)


class Planner:
    def __init__(self, machine: Machine, solver: str = "cpsat", time_limit_s: float = 1.0) -> None:
        self.machine = machine
        self.solver = solver
        self.time_limit_s = time_limit_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cod-allocator")

    async def run(self, specs: Sequence[TaskSpec], current: Mapping[str, Sequence[int]],
                  unavailable: Sequence[int] = ()) -> Plan:
        if not specs:
            return Plan({}, None, "none", 0.0, "optimal", {}, tuple(unavailable))
        loop = asyncio.get_running_loop()
        snapshot = (tuple(specs), {k: tuple(v) for k, v in current.items()}, tuple(sorted(unavailable)))
        return await loop.run_in_executor(self._executor, _run_allocator, self.machine, *snapshot,
                                          self.solver, self.time_limit_s)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

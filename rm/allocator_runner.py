"""The daemon's side of the global allocator (not query-plan deployment: that is :mod:`.query_plans`): one run at a time, off the event loop, on a snapshot.

Policy lives in cod.rm.allocator; this module only adapts the RM's tasks to it
and back.  The allocator is pure Python / OR-Tools, so it runs in a worker
thread (`run_in_executor`) while the loop keeps answering other clients.

The runner keeps one :class:`cod.rm.allocator.Allocator` (memory of its last
answer): when the tasks differ from the last run's by one arrival or one
departure and ``current`` is what that run returned, the allocator repairs
its last answer and returns it only when it proves the repair optimal, else
it runs the full solve (docs/design-allocator.md, "In the daemon").  A plan
the service does not adopt (a refused admission) needs no undo: the next run
differs from it in ``current`` or in more than one task (a full solve), or
is one change away from it (a repair, proven against that run's own input).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from cod.facts.model import Machine

from .allocator import AllocationResult, Allocator, OtherDemand, TaskSpec, allocate

log = logging.getLogger(__name__)


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
    # what the allocator did about cache locality (SLS, AllocationResult.cache_policy)
    cache_policy: str = ""

    @property
    def unavailable(self) -> tuple[int, ...]:
        """Every CPU kept for unregistered busy processes."""
        return tuple(sorted({c for cpus in self.reservations.values() for c in cpus}))

    @classmethod
    def of(cls, result: AllocationResult) -> "Plan":
        if result.status == "infeasible":
            return cls(None, result.reason, result.solver, result.solve_ms, result.status, proof=result.via,
                       cache_policy=result.cache_policy)
        return cls({t.name: tuple(t.cores) for t in result.tasks}, None, result.solver, result.solve_ms,
                   result.status, {t.name: tuple(t.binding) for t in result.tasks},
                   {r.name: tuple(r.cpus) for r in result.reservations},
                   {t.name: tuple(t.displaced_by) for t in result.tasks if t.displaced_by}, result.via,
                   result.cache_policy)


class AllocatorRunner:
    def __init__(self, machine: Machine, solver: str = "cpsat", time_limit_s: float = 1.0) -> None:
        self.machine = machine
        self.solver = solver
        self.time_limit_s = time_limit_s
        self._allocator = Allocator(machine, solver=solver, time_limit_s=time_limit_s)
        self._allocator.reset([], {})  # a daemon starts with nothing allocated: its first task is one arrival
        # one worker: the allocator's memory is touched by one thread, in the order of the calls
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cod-allocator")

    async def run(self, specs: Sequence[TaskSpec], current: Mapping[str, Sequence[int]],
                  others: Sequence[OtherDemand] = ()) -> Plan:
        if not specs:  # no task to keep them from: each other stays where it runs
            # the allocator's last answer becomes "nothing allocated" (with others: forgotten)
            self._executor.submit(self._allocator.reset, None if others else [], None if others else {})
            return Plan({}, None, "none", 0.0, "optimal", reservations={o.name: o.cpus for o in others})
        loop = asyncio.get_running_loop()
        snapshot = (tuple(specs), {k: tuple(v) for k, v in current.items()}, tuple(others))
        return await loop.run_in_executor(self._executor, self._run, *snapshot)

    def _run(self, specs: tuple[TaskSpec, ...], current: dict[str, tuple[int, ...]],
             others: tuple[OtherDemand, ...]) -> Plan:
        try:
            return Plan.of(self._allocator.allocate(list(specs), current, others=others))
        except (ValueError, TypeError):
            raise  # bad input: the full solve would refuse it the same way
        except Exception:  # a bug of the incremental repair must not cost an admission
            log.exception("the incremental allocator failed; planning from scratch")
            self._allocator.reset()
            return Plan.of(allocate(self.machine, list(specs), current, others=others, solver=self.solver,
                                    time_limit_s=self.time_limit_s))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

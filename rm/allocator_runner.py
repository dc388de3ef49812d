"""The daemon's side of the global allocator (not query-plan deployment: that is :mod:`.query_plans`): one run at a time, off the event loop, on a snapshot.

Policy lives in cod.rm.allocator; this module only adapts the RM's tasks to it
and back.  The allocator is pure Python / OR-Tools, so it runs in a worker
thread (`run_in_executor`) while the loop keeps answering other clients.

The runner keeps one :class:`cod.rm.allocator.Allocator` (memory of its last
answer): when the tasks differ from the last run's by one arrival or one
departure and ``current`` is what that run returned, the allocator repairs
its last answer and returns it only when it proves the repair optimal, else
it runs the full solve (docs/design-allocator.md, "In the daemon").  The
proven repair is cheap and bounded (no solve runs: ~0.1 ms for a
registration), so it runs on the event loop; only the full solve goes to
the worker thread.  On a busy machine the hand-off to that thread and back
cost more than the repair itself (docs/design-rm.md, "Registration").  A plan
the service does not adopt (a refused admission) needs no undo: the next run
differs from it in ``current`` or in more than one task (a full solve), or
is one change away from it (a repair, proven against that run's own input).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

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
        # (the event loop's repairs only while no run is in the worker: self._busy)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="cod-allocator")
        self._busy: Future[Any] | None = None

    async def run(self, specs: Sequence[TaskSpec], current: Mapping[str, Sequence[int]],
                  others: Sequence[OtherDemand] = ()) -> Plan:
        idle = self._busy is None or self._busy.done()  # no earlier run still in the worker thread
        if not specs:  # no task to keep them from: each other stays where it runs
            # the allocator's last answer becomes "nothing allocated" (with others: forgotten)
            args = (None, None) if others else ([], {})
            if idle:
                self._allocator.reset(*args)
            else:
                self._busy = self._executor.submit(self._allocator.reset, *args)
            return Plan({}, None, "none", 0.0, "optimal", reservations={o.name: o.cpus for o in others})
        snapshot = (tuple(specs), {k: tuple(v) for k, v in current.items()}, tuple(others))
        if idle:
            repaired = self._repair(*snapshot)
            if repaired is not None:
                return repaired
        job = self._executor.submit(self._run, *snapshot)
        self._busy = job  # done only once the thread is done with it, even if our caller is cancelled
        return await asyncio.wrap_future(job)

    def _repair(self, specs: tuple[TaskSpec, ...], current: dict[str, tuple[int, ...]],
                others: tuple[OtherDemand, ...]) -> Plan | None:
        """The allocator's proven repair, here and now; None: the worker thread must solve."""
        try:
            result = self._allocator.repair(list(specs), current, others=others)
        except (ValueError, TypeError):
            raise  # bad input: the full solve would refuse it the same way
        except Exception:  # a bug of the incremental repair must not cost an admission
            log.exception("the incremental allocator failed; planning from scratch")
            self._allocator.reset()
            return None
        return None if result is None else Plan.of(result)

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

"""Query-plan deployment in the daemon (issue 17): a task's operator threads on CPUs of its allocation.

Not the allocation (that is the allocator's plan, :mod:`.allocator_runner`): a task
sends the graph of its query plan (``deploy_plan``); :mod:`.deploy` decides
how many cores it needs and which operator goes where; the task's
``min_cores`` becomes that count (an update, :mod:`.admission`), and each
named thread is pinned to its CPU inside what the task holds
(:mod:`.deployment` matches threads to operators).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from cod.facts import procfs
from cod.facts.model import Machine
from cod.protocol import jsonrpc as rpc
from cod.protocol.jsonrpc import RpcError

from .admission import Admission
from .config import RMConfig
from .deploy import DeployError, GraphError, deploy, parse_graph
from .deploy import Options as DeployOptions
from .deployment import Deployment, Matching, match_threads
from .pinning import Pinning
from .publisher import Publisher
from .registry import Connection, Task
from .taskprops import split_properties

log = logging.getLogger("cod.rm")


class QueryPlans:
    def __init__(self, cfg: RMConfig, machine: Machine, pinning: Pinning, publisher: Publisher,
                 admission: Admission) -> None:
        self.cfg = cfg
        self.machine = machine
        self.pinning = pinning
        self.publisher = publisher
        self.admission = admission

    def deploy_threads(self, task: Task) -> Matching | None:
        """Narrow the task's named operator threads to their CPUs of its deployment (issue 17).

        Called after every pin of the task (which gives every thread the whole
        set again), on thread-name events, and on the live-state refresh (for
        threads named later, and when events are polled)."""
        dep = task.deployment
        if dep is None or self.pinning.closed:
            return None
        held = set(self.publisher.holdings_of(task.name))
        cpus = [c for c in self.publisher.announced(task.name) if c in held]
        if not cpus:
            return None
        placement = dep.placed_in(self.machine, cpus)
        threads: dict[int, str] = {}
        for pid in task.pids():
            threads.update(procfs.thread_names(pid))
        matching = match_threads(placement, threads)
        # Compared with the thread's mask as it is now, not with what was done before: a fork
        # event handled after the thread's name event has widened it again (the connector's
        # events from two CPUs come in either order).
        todo = {tid: (cpu,) for tid, cpu in matching.targets.items() if _mask(tid) != {cpu}}
        if todo:
            self.pinning.pin_threads(task.name, todo)
        return matching

    async def deploy_plan(self, task: Task, graph: Any, conn: Connection) -> dict[str, Any]:
        """Plan the task's operator threads (cod.rm.deploy), make the plan's core count its
        min_cores, and pin each named thread inside its allocation.  Refused, nothing changes."""
        try:
            parsed = parse_graph(graph)
        except GraphError as err:
            raise RpcError(rpc.INVALID_PARAMS, f"deploy_plan: {err}") from None
        options = DeployOptions(time_limit_s=self.cfg.deploy_time_limit_s)
        try:
            # CP-SAT searches for up to the time limit: off the event loop.
            plan = await asyncio.to_thread(deploy, parsed, self.machine, options)
        except DeployError as err:
            raise RpcError(rpc.ADMISSION_REFUSED, f"deploy_plan: {err}") from None
        need = plan.min_cores
        if task.spec.max_cores is not None and task.spec.max_cores < need:
            raise RpcError(rpc.ADMISSION_REFUSED,
                           f"deploy_plan: the plan needs {need} cores; task {task.name!r} has max_cores "
                           f"{task.spec.max_cores} (raise it with update_task first)",
                           {"requested": need, "max_cores": task.spec.max_cores})
        plain, derived = split_properties(task.properties, "deploy_plan")
        derived.pop("min_cores", None)
        plain["min_cores"] = need
        await self.admission.update(task, plain, derived, conn, reason=f"task {task.name} deployed a plan of {need} cores")
        task.deployment = Deployment(plan)
        matching = self.deploy_threads(task)
        return {"task": task.name, "min_cores": need, "cores": plan.cores, "cores_optimal": plan.cores_optimal,
                "numa_nodes": list(plan.numa.nodes), "placement": dict(task.deployment.placement),
                "threads": {str(t): c for t, c in sorted(matching.targets.items())} if matching else {},
                "unmatched": list(matching.unmatched) if matching else sorted(plan.placement),
                "problem": task.deployment.problem, "warnings": list(plan.warnings),
                "allocation": self.publisher.allocation_of(task)}


def _mask(tid: int) -> set[int] | None:
    try:
        return os.sched_getaffinity(tid)
    except OSError:
        return None  # gone

"""Query-plan deployment in the daemon (issue 17): a task's operator threads on CPUs of its allocation.

Not the allocation (that is the allocator's plan, :mod:`.allocator_runner`): a task
sends the graph of its query plan (``deploy_plan``); :mod:`.deploy` decides
how many cores it needs and which operator goes where; the task's
``min_cores`` becomes that count (an update, :mod:`.admission`), and each
named thread is pinned to its CPU inside what the task holds
(:mod:`.deployment` matches threads to operators).

A plan costs the daemon little whatever the graph (docs/security.md,
"deploy_plan"): on the event loop only checks in constant time or one pass
over the raw graph, cheapest first (a planner slot for the uid, the graph's
counts, its lower bound of cores against the CPUs the task could ever get,
its size as JSON); validating and planning it is done by a planner process
(:mod:`.deploy_runner`) with a wall-clock limit.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from cod.facts import procfs
from cod.facts.model import Machine
from cod.protocol import jsonrpc as rpc
from cod.protocol.jsonrpc import RpcError

from .admission import Admission
from .config import RMConfig
from .deploy import (DeployError, DeployPlan, GraphError, GraphLimits, GraphTooLarge, check_bytes, check_size,
                     quick_demand)
from .deploy_runner import PlannerBusy, PlannerError, PlannerLimits, Planners, PlanOutOfMemory, PlanTimedOut
from .deployment import Deployment, Matching, match_threads
from .pinning import Pinning
from .publisher import Publisher
from .quotas import unprivileged_core_budget
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
        self.limits = GraphLimits(cfg.deploy_max_operators, cfg.deploy_max_edges, cfg.deploy_max_graph_bytes)
        self.planners = Planners(PlannerLimits(
            cfg.deploy_plan_timeout_s, cfg.deploy_memory_limit_bytes, cfg.deploy_plans_per_uid,
            cfg.deploy_max_planners, cfg.skb_user, cfg.deploy_time_limit_s), machine)

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
            with self.planners.slot(conn.peer.uid, conn.privileged):
                graph_json = self._screen(task, graph, conn)
                plan = await self._plan(graph_json, graph)
        except PlannerBusy as err:
            raise RpcError(rpc.TOO_BUSY, f"deploy_plan: {err}", _limit_data(err)) from None
        return await self._adopt(task, plan, conn)

    def _screen(self, task: Task, graph: dict[str, Any], conn: Connection) -> bytes:
        """The graph as compact JSON once it passed the cheap checks: its counts and size
        (-32031), what the task could ever hold (-32030)."""
        try:
            check_size(graph, self.limits)
            self._check_demand(task, graph, conn)
            text = json.dumps(graph, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
            check_bytes(len(text), self.limits)
            return text
        except GraphTooLarge as err:
            raise RpcError(rpc.QUOTA_EXCEEDED, f"deploy_plan: {err}",
                           {"quota": err.setting, "limit": err.limit, "requested": err.requested}) from None
        except ValueError as err:  # NaN or infinity: no JSON
            raise RpcError(rpc.INVALID_PARAMS, f"deploy_plan: graph: {err}") from None

    def _check_demand(self, task: Task, graph: dict[str, Any], conn: Connection) -> None:
        """Refuse, before any planning, a plan whose lower bound of cores exceeds what the task could
        ever hold: the machine's CPUs, its max_cores, its uid's budget."""
        need = quick_demand(graph)
        n_cpus = len(self.machine.cpu_ids())
        room: list[tuple[int, str, dict[str, Any]]] = [(n_cpus, f"{self.machine.name} has {n_cpus} CPUs", {})]
        if task.spec.max_cores is not None:
            room.append((task.spec.max_cores, f"task {task.name!r} has max_cores {task.spec.max_cores}; "
                                              f"raise it with update_task first", {"max_cores": task.spec.max_cores}))
        if not conn.privileged:
            budget = unprivileged_core_budget(self.cfg, n_cpus)
            room.append((budget, f"an unprivileged uid may reserve at most {budget} of the {n_cpus} CPUs "
                                 f"(setting unprivileged_max_cores)", {}))
        available, why, extra = min(room, key=lambda r: r[0])
        if need.cores > available:
            reason = f"the plan needs {need.cores} cores; {why} (no packing needs fewer: {need.why})"
            raise RpcError(rpc.ADMISSION_REFUSED, f"deploy_plan: {reason}",
                           {"requested": need.cores, "available": available, "reason": reason, **extra})

    async def _plan(self, graph_json: bytes, graph: dict[str, Any]) -> DeployPlan:
        ops = graph.get("operators")
        ids = [op.get("id") if isinstance(op, dict) else None for op in ops] if isinstance(ops, list) else []
        try:
            return await self.planners.plan(graph_json, ids)
        except GraphError as err:
            raise RpcError(rpc.INVALID_PARAMS, f"deploy_plan: {err}") from None
        except PlanTimedOut as err:
            raise RpcError(rpc.TIMED_OUT, f"deploy_plan: {err}", _limit_data(err)) from None
        except PlanOutOfMemory as err:
            raise RpcError(rpc.QUOTA_EXCEEDED, f"deploy_plan: {err}", _limit_data(err)) from None
        except DeployError as err:
            raise RpcError(rpc.ADMISSION_REFUSED, f"deploy_plan: {err}") from None
        except PlannerError as err:
            log.warning("deploy_plan: %s", err)
            raise RpcError(rpc.INTERNAL_ERROR, f"deploy_plan: {err}",
                           _limit_data(err) if err.setting else None) from None

    async def _adopt(self, task: Task, plan: DeployPlan, conn: Connection) -> dict[str, Any]:
        """The plan's core count as the task's min_cores, its threads pinned."""
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


def _limit_data(err: PlannerError) -> dict[str, Any]:
    return {"quota": err.setting, "limit": err.limit}


def _mask(tid: int) -> set[int] | None:
    try:
        return os.sched_getaffinity(tid)
    except OSError:
        return None  # gone

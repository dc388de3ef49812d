"""The Resource Manager: the wiring of its parts, each with one job and a narrow interface.

Which file decides what (docs/design-rm.md, "Structure"):

* :mod:`.sessions`: connections, ``hello``, what a leaving connection leaves behind;
* :mod:`.knowledge`: facts, procedures, queries, conditions, derived task properties;
* :mod:`.admission`: the transaction that admits, updates and removes a task or an
  elastic group, and the recomputations (the allocator, :mod:`.allocator_runner`, is pure);
* :mod:`.publisher`: the epoch state (rules in :mod:`.epochs`), the queue of
  publications carried out in order, the revocation deadlines; every SKB write
  that describes the allocation;
* :mod:`.demands`: elastic groups and unregistered busy processes, beside the tasks;
* :mod:`.pinning`: the calls into the enforcement backend;
* :mod:`.query_plans`: operator threads of a deployed query plan inside a task's CPUs.

Everything runs on the one asyncio event loop, so the state needs no locks
beyond the allocation lock (:mod:`.admission`) and the per-uid write locks
(:mod:`.knowledge`).  The handlers (:mod:`.handlers`), the monitor
(:mod:`.monitor`) and the elastic groups (:mod:`.elastic_groups`) call the
parts; this class builds them, answers the reports that span them, and shuts
them down in order.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from cod.facts.model import Machine

from . import reasons
from .admission import Admission
from .busy import OtherTask
from .config import RMConfig
from .demands import Demands
from .enforce.backend import Enforcer
from .events import Events, Jobs
from .knowledge import Knowledge
from .pinning import Pinning
from .allocator_runner import AllocatorRunner
from .publisher import CLOSE_WAIT_S, Publisher
from .query_plans import QueryPlans
from .registry import Registry, Task
from .sessions import Sessions

log = logging.getLogger("cod.rm")


class ResourceManager:
    def __init__(self, cfg: RMConfig, machine: Machine, skb: Any, enforcer: Enforcer, *,
                 direct_socket: str | None = None) -> None:
        self.cfg = cfg
        self.machine = machine
        self.skb = skb  # cod.skb.AsyncSKB
        self.enforce_mode = enforcer.name if cfg.enforce else "none"
        self.enforcer = enforcer
        self.started = time.time()
        self.n_cpus = len(machine.cpu_ids())
        self.closing = False
        self.registry = Registry()
        self.events = Events(self.registry)
        self.jobs = Jobs()
        self.demands = Demands()
        self.pinning = Pinning(machine, enforcer)
        self.publisher = Publisher(cfg, machine, skb, self.registry, self.pinning, self.events)
        self.knowledge = Knowledge(cfg, skb, self.registry, self.events, self.jobs)
        self.allocator_runner = AllocatorRunner(machine, cfg.solver, cfg.solver_time_limit_s)
        self.admission = Admission(cfg, self.allocator_runner, skb, self.registry, self.publisher, self.demands,
                                   self.pinning, self.knowledge, self.events, self.n_cpus)
        self.sessions = Sessions(cfg, skb, self.registry, self.knowledge, direct_socket)
        self.query_plans = QueryPlans(cfg, machine, self.pinning, self.publisher, self.admission)
        self.cache: Any = None  # cod.rm.cache.CachePartitioning, set by the daemon where resctrl exists
        self._wire()
        self._periodic_task = (asyncio.get_running_loop().create_task(self.admission.periodic())
                               if cfg.recompute_interval_s > 0 else None)

    def _wire(self) -> None:
        """The callbacks between the parts (each part knows only the interface it calls)."""
        self.publisher.groups = self.demands.groups
        self.publisher.after_pin = self.query_plans.deploy_threads
        self.publisher.acknowledge_for = self.demands.is_group
        self.publisher.on_announced.append(self.knowledge.allocation_changed)
        self.knowledge.schedule = self.admission.schedule
        self.knowledge.respec = self.admission.respec
        self.knowledge.privileged_uid = self.sessions.privileged_uid
        self.sessions.forget_task = self.admission.forget
        self.sessions.schedule = self.admission.schedule

    # ---- what spans the parts --------------------------------------------------------------------
    def find_task(self, name: str) -> Task | None:
        return self.registry.tasks.get(name)

    def tasks(self) -> list[Task]:
        return list(self.registry.tasks.values())

    def managed_pids(self) -> set[int]:
        """Processes that registered tasks hold, or whose registration is under way."""
        return self.registry.managed_pids()

    def task_of_pid(self, pid: int) -> Task | None:
        """The task a process belongs to: its own pid or one of its children."""
        return self.registry.task_of_pid(pid)

    def explain(self, task: Task) -> dict[str, Any]:
        """The allocator's reasons for the task's CPUs, with their evidence (cod.rm.reasons)."""
        plan = self.publisher.last_plan
        binding = list(plan.binding.get(task.name, ())) if plan else []
        specs = {t.name: t.spec for t in self.registry.tasks.values()}
        cores = {name: tuple(c) for name, c in self.publisher.state.announced.items() if name in specs}
        return {"task": task.name, "app": task.app, "cores": list(cores.get(task.name, ())), "binding": binding,
                "constraints": reasons.constraints(task.name, binding, specs, cores,
                                                   plan.unavailable if plan else (), self.machine,
                                                   plan.reservations if plan else {}),
                "plan": self.publisher.plan_summary()}

    def list_tasks(self) -> dict[str, Any]:
        pub = self.publisher
        binding = pub.last_plan.binding if pub.last_plan else {}
        return {"epoch": pub.epoch, "plan": pub.plan_summary(), "tasks": [
            {"task": t.name, "pid": t.pid, "app": t.app, "enforced_by": t.enforced_by, "properties": t.properties,
             "cores": list(pub.announced(t.name)), "epoch": pub.state.announced_epoch.get(t.name, 0),
             "binding": list(binding.get(t.name, ())),
             **({"deployment": {"min_cores": t.deployment.plan.min_cores, "placement": dict(t.deployment.placement),
                                "problem": t.deployment.problem}} if t.deployment is not None else {})}
            for _, t in sorted(self.registry.tasks.items())],
            "other_tasks": self.demands.others_listing(),
            "elastic_groups": self.demands.listing()}

    def allocations(self) -> dict[str, Any]:
        pub = self.publisher
        return {"epoch": pub.epoch, **pub.plan_summary(),
                "tasks": [pub.allocation_of(t) for _, t in sorted(self.registry.tasks.items())]}

    async def busy_changed(self, others: dict[int, OtherTask], why: str) -> int:
        """The unregistered busy processes are now ``others``: recompute, record them in the SKB
        (through the publisher, in order with the allocation), tell subscribers."""
        managed = self.registry.managed_pids()  # registered since the monitor's sample
        added = self.demands.set_others({pid: o for pid, o in others.items() if pid not in managed})
        gen = self.admission.schedule(why)
        await self.publisher.write(self.demands.other_facts(), "writing other_task facts")
        self.knowledge.changed(None)
        self.events.emit("facts_changed", {"scope": "system", "app": None, "op": "add" if added else "remove",
                                           "predicates": ["other_task"]})
        return gen

    def reapply_all(self) -> None:
        """Pin every task again (after lost process events: threads may have been missed)."""
        held = self.publisher.holdings()
        for task in list(self.registry.tasks.values()):
            if self.pinning.pin(task, held.get(task.name, ())) and task.deployment is not None:
                self.query_plans.deploy_threads(task)

    # ---- shutdown --------------------------------------------------------------------------------
    async def close(self) -> None:
        self.closing = self.sessions.closing = self.knowledge.closing = True
        self.pinning.closed = True  # nothing is pinned from here on
        if self._periodic_task is not None:
            self._periodic_task.cancel()
        self.publisher.stop_deadlines()
        await self.admission.stop()
        # A recomputation in flight publishes (and pins) before we release; but a stuck SKB
        # must not keep the processes pinned, so wait for it a bounded time only.
        try:
            await asyncio.wait_for(self.admission.lock.acquire(), CLOSE_WAIT_S)
            locked = True
        except TimeoutError:
            log.warning("a recomputation is still running after %g s; releasing the tasks anyway", CLOSE_WAIT_S)
            locked = False
        try:
            for task in list(self.registry.tasks.values()):
                self.pinning.release(task)
            for demand in list(self.demands.groups.values()):
                self.pinning.release_group(demand)
        finally:
            if locked:
                self.admission.lock.release()
        await self.publisher.close()
        self.allocator_runner.close()

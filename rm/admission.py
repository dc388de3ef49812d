"""The transaction that admits, updates and removes a task (or an elastic group), and the recomputations.

A call that changes the allocation checks everything first, then plans with
the change (:mod:`.allocator_runner`, not adopted yet), then pins the newcomer, then
writes the SKB in one transaction, then adopts the plan (:mod:`.publisher`);
a failure at any step undoes the steps before it, so the daemon's state, the
SKB and the cgroups never disagree.  A refused call changes nothing.  A
registration's write and the publication that admits it are one transaction
(:meth:`.publisher.Publisher.join`): one SKB round trip from plan to upcall.

Allocator runs and the adoption of their plans are serialised by one lock;
requests for a recomputation that arrive meanwhile are coalesced into the
next run (:meth:`Admission.schedule`, :meth:`Admission.wait_for`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable, Iterable

from cod.protocol import jsonrpc as rpc
from cod.protocol.jsonrpc import RpcError
from cod.skb import PERSISTENT, Staged
from cod.skb import codec

from . import quotas, shown
from .confusables import LOOK_ALIKE_RULE, look_alike
from .system_facts import ANY, allocated_fact, task_fact, task_facts as spec_facts, task_property_fact
from .allocator.model import TaskSpec
from .config import RMConfig
from .demands import Demand, Demands
from .events import Events
from .knowledge import Knowledge, app_of, skb_call, skb_quietly
from .pinning import Pinning
from .allocator_runner import Plan, AllocatorRunner
from .publisher import Joining, Publisher
from .registry import Connection, Registry, Task, Usage
from .taskprops import Derived, build_spec

log = logging.getLogger("cod.rm")

Facts = Callable[[tuple[int, ...]], dict[str, list[str]]]


def task_facts(task: Task) -> list[str]:
    return list(spec_facts(task.name, task.pid, task.app, task.spec.to_dict()))


class Admission:
    def __init__(self, cfg: RMConfig, allocator_runner: AllocatorRunner, skb: Any, registry: Registry, publisher: Publisher,
                 demands: Demands, pinning: Pinning, knowledge: Knowledge, events: Events, n_cpus: int) -> None:
        self.cfg = cfg
        self.allocator_runner = allocator_runner
        self.skb = skb
        self.registry = registry
        self.publisher = publisher
        self.demands = demands
        self.pinning = pinning
        self.knowledge = knowledge
        self.events = events
        self.n_cpus = n_cpus
        self.closing = False
        self.lock = asyncio.Lock()  # allocator runs and the adoption of their plans
        self._requested_gen = 0  # recomputations asked for
        self._done_gen = 0  # recomputations whose result is published
        self._gen_changed = asyncio.Condition()
        self._recompute_task: asyncio.Task[None] | None = None
        self._pending_reasons: list[str] = []

    # ---- what a task may be ----------------------------------------------------------------------
    def task_refusal(self, conn: Connection, name: str, properties: dict[str, Any]) -> None:
        why = quotas.task_refusal(self.cfg, self.registry, conn.peer.uid, conn.privileged, name, properties,
                                  self.n_cpus)
        if why is not None:
            raise RpcError(rpc.PERMISSION_DENIED, f"task {name!r}: {why}")

    def group_refusal(self, conn: Connection, floors_of_uid: list[int], min_cores: int) -> str | None:
        """Why ``conn``'s uid may not register one more elastic group (cod.rm.quotas), or None."""
        return quotas.group_refusal(self.cfg, self.registry, conn.peer.uid, conn.privileged, floors_of_uid,
                                    min_cores, self.n_cpus)

    def _refusal(self, spec: TaskSpec, plan: Plan, what: str = "task") -> RpcError:
        reserved = sum(t.spec.min_cores for t in self.registry.tasks.values() if t.name != spec.name)
        reserved += self.demands.floors(but=spec.name)
        free = max(0, self.n_cpus - reserved)
        reason = shown.message(plan.reason) if plan.reason else plan.reason
        return RpcError(
            rpc.ADMISSION_REFUSED,
            f"cannot admit {what} {spec.name!r}: it asks for at least {shown.count(spec.min_cores, 'cores')}, {free} of "
            f"{self.n_cpus} are free" + (f"; the allocator says: {reason}" if reason else ""),
            {"requested": shown.datum(spec.min_cores), "free": free, "available": self.n_cpus, "reason": reason},
        )

    def refuse_taken(self, name: str) -> None:
        """-32021 when a task or elastic group has ``name``, or a name that ``name`` looks like
        (cod.rm.confusables): names are unique on the daemon, and tell apart at a glance."""
        if name in self.registry.tasks or self.demands.is_group(name):
            raise RpcError(rpc.ALREADY_EXISTS, f"a task or elastic group named {name!r} is already registered")
        alike = look_alike(name, [*self.registry.tasks, *self.demands.groups])
        if alike is not None:
            raise RpcError(rpc.ALREADY_EXISTS, f"the name {name!r} looks like {alike!r}, a task or elastic group "
                                               f"already registered ({LOOK_ALIKE_RULE}); choose one that does not",
                           {"looks_like": alike})

    async def _plan(self, specs: list[TaskSpec], prefer: dict[str, tuple[int, ...]] | None = None) -> Plan:
        current = self.publisher.holdings()
        # Elastic groups are planned beside the tasks, placed where they are (or where they want to be).
        specs = [*specs, *self.demands.specs()]
        current.update(self.demands.placements())
        current.update(prefer or {})
        return await self.allocator_runner.run(specs, current, self.demands.other_demands())

    async def _adopt(self, plan: Plan, reason: str, join: str | None = None,
                     already_pinned: dict[str, tuple[int, ...]] | None = None) -> None:
        """Adopt ``plan`` on the epoch state as it is now and publish it (no await in between)."""
        pub, writes = self.demands.adopted(plan, self.publisher.adopt(plan, reason, join))
        await self.publisher.publish(pub, already_pinned=already_pinned, writes=writes)

    # ---- a task arrives --------------------------------------------------------------------------
    async def register(self, conn: Connection, name: str, pid: int, plain: dict[str, Any],
                       derived: dict[str, Derived], facts: list[str], procedures: list[str],
                       persistent: bool, enforced_by: str = "daemon") -> Task:
        """Admit a task with its application's facts and procedures, all or nothing."""
        app = app_of(conn)
        self.registry.arriving[pid] += 1
        try:
            return await self._register(conn, app, name, pid, plain, derived, facts, procedures, persistent,
                                        enforced_by)
        finally:
            self.registry.arriving[pid] -= 1
            if self.registry.arriving[pid] <= 0:
                del self.registry.arriving[pid]

    async def _register(self, conn: Connection, app: str, name: str, pid: int, plain: dict[str, Any],
                        derived: dict[str, Derived], facts: list[str], procedures: list[str],
                        persistent: bool, enforced_by: str) -> Task:
        async with self.knowledge.uid_lock(conn.peer.uid):
            limits = quotas.write_limits(self.cfg, self.registry, app, conn.peer.uid)
            owner = PERSISTENT if persistent else conn.id
            writes = [codec.add_procedure(app, text, persistent, limits) for text in procedures]
            if facts:
                writes.append(codec.add_facts(app, owner, facts, limits))
            # 1. derive the properties given as queries, as the namespace will be after the facts and
            #    procedures, without keeping them.  With none to derive, nothing is read: the write
            #    (step 4) checks the facts and procedures, and a refused write changes nothing.
            values: dict[str, int] = {}
            if derived:
                staged = Staged(tuple(facts), owner, tuple((t, persistent) for t in procedures), limits)
                values = await self.knowledge.evaluate(app, staged, derived, "register_task")
            spec = build_spec(name, plain, values, "register_task")
            self.task_refusal(conn, name, spec.to_dict())
            task = Task(name=name, pid=pid, app=app, conn_id=conn.id, owner_uid=conn.peer.uid, spec=spec,
                        properties={**plain, **{k: d.to_dict() for k, d in derived.items()}},
                        derived=dict(derived), derived_values=values, enforced_by=enforced_by)
            writes.append(codec.add_system_facts(task_facts(task)))
            async with self.lock:
                await self._admit(conn, task, writes)
        if facts:
            self.events.facts_changed(app, "add", facts)
        self.events.emit("task_arrived", {"task": task.name, "pid": task.pid, "app": task.app})
        return task

    async def _admit(self, conn: Connection, task: Task, writes: list[Any]) -> None:
        """Steps 2 to 5 of a registration, under the allocation lock."""
        self.refuse_taken(task.name)
        # 2. admission: the plan with the newcomer, not adopted yet
        plan = await self._plan([t.spec for t in self.registry.tasks.values()] + [task.spec])
        if plan.cores is None:
            raise self._refusal(task.spec, plan)
        reason = f"task {task.name} arrived"
        # 3. pin the newcomer (if it holds anything yet); 4. write the SKB in one transaction, with
        # the publication that admits it; 5. commit.  The publisher adopts the plan on the epoch
        # state as it is when the write is its turn, and undoes the pin if the write fails.
        grant = self.publisher.trial(plan, task.name, reason)
        self.pinning.pin_or_refuse(task, grant)

        def commit(results: list[Any]) -> None:
            for result in results:
                if isinstance(result, dict) and "usage" in result:
                    self.registry.usage[task.app] = Usage.from_reply(result["usage"])
            self.registry.tasks[task.name] = task
            conn.tasks.add(task.name)
            task.auto_subscription = self.registry.subscribe(conn, "allocation_changed", {"task": task.name}).id
            task.warning_subscription = self.registry.subscribe(conn, "task_warning", {"task": task.name}).id

        await skb_call(self.publisher.join(Joining(plan, task, reason, writes, grant, self.demands.adoption,
                                                   commit, lambda: self.pinning.release(task))))

    # ---- a task changes --------------------------------------------------------------------------
    async def update(self, task: Task, plain: dict[str, Any], derived: dict[str, Derived],
                     conn: Connection | None = None, reason: str | None = None) -> None:
        """New properties for ``task`` (derived ones evaluated now); refused, it keeps the old ones."""
        values: dict[str, int] = {}
        if derived:
            values = await self.knowledge.evaluate(task.app, Staged(), derived, "update_task")
        spec = build_spec(task.name, plain, values, "update_task")
        if conn is not None:
            self.task_refusal(conn, task.name, spec.to_dict())
        properties = {**plain, **{k: d.to_dict() for k, d in derived.items()}}
        await self.respec(task, spec, properties, derived, values, reason or f"task {task.name} changed")

    async def respec(self, task: Task, spec: TaskSpec, properties: dict[str, Any], derived: dict[str, Derived],
                     values: dict[str, int], reason: str) -> None:
        async with self.lock:
            specs = [t.spec if t.name != task.name else spec for t in self.registry.tasks.values()]
            plan = await self._plan(specs)
            if plan.cores is None:
                raise self._refusal(spec, plan)
            old = (task.spec, task.properties, task.derived, task.derived_values)
            task.spec, task.properties, task.derived, task.derived_values = spec, properties, dict(derived), values
            try:
                await skb_call(self.skb.replace_system_facts(task_property_fact(task.name, ANY, ANY),
                                                             task_facts(task)[1:]))
            except BaseException:
                task.spec, task.properties, task.derived, task.derived_values = old
                raise
            await self._adopt(plan, reason)

    # ---- a task leaves ---------------------------------------------------------------------------
    async def remove(self, task: Task, reason: str) -> int:
        """The task leaves; returns the generation of the recomputation that gives its cores away."""
        conn = self.registry.connections.get(task.conn_id)
        if conn is not None:
            conn.tasks.discard(task.name)
            if task.auto_subscription is not None:
                self.registry.unsubscribe(conn, task.auto_subscription)
        self.registry.tasks.pop(task.name, None)
        # Recompute first: the others get the cores while the SKB forgets the task.
        gen = self.schedule(f"task {task.name} left")
        await self.forget(task, reason)
        return gen

    async def exited(self, task: Task, event_ns: int) -> float | None:
        """The task's process exited (a process event): deregister it at once.

        Returns how long after the exit event the other tasks were told of the freed
        cores (ms), or None when nothing changed hands."""
        if self.registry.tasks.get(task.name) is not task:
            return None
        gen = await self.remove(task, "exited")
        await self.wait_for(gen)
        announced = self.publisher.last_announce_ns
        if announced < event_ns:
            return None
        ms = (announced - event_ns) / 1e6
        log.info("task %s (pid %d) exited: its cores were reassigned %.3f ms after the exit event",
                 task.name, task.pid, ms)
        return ms

    async def forget(self, task: Task, reason: str) -> None:
        """The task is gone from the registry: it holds nothing, is released, and the SKB forgets it."""
        self.publisher.forget(task.name)
        self.pinning.release(task)
        await skb_quietly(self.skb.batch([
            codec.remove_system_facts(task_fact(task.name, ANY, ANY)),
            codec.remove_system_facts(task_property_fact(task.name, ANY, ANY)),
            codec.remove_system_facts(allocated_fact(task.name, ANY)),
        ]), f"removing the facts of task {task.name}")
        self.events.emit("task_left", {"task": task.name, "pid": task.pid, "app": task.app, "reason": reason})
        log.info("task %s (pid %d) left: %s", task.name, task.pid, reason)

    # ---- elastic groups join and leave the allocation (cod.rm.elastic_groups drives them) -------
    async def admit_group(self, demand: Demand, facts: Facts) -> tuple[int, ...]:
        """Admit a group as a task is admitted, all or nothing: plan with it (refused: -32030),
        pin it to what it gets now, write its SKB facts (``facts(grant)``, one transaction),
        commit and publish.  Returns its CPUs now (() while others give them back)."""
        name = demand.name
        async with self.lock:
            self.refuse_taken(name)
            plan = await self._plan([t.spec for t in self.registry.tasks.values()] + [demand.spec],
                                    prefer={name: demand.preferred()})
            if plan.cores is None:
                raise self._refusal(demand.spec, plan, "elastic group")
            reason = f"elastic group {name} arrived"
            grant = self.publisher.trial(plan, name, reason)
            try:
                demand.pin(grant)
                await skb_call(self.skb.replace_many(facts(grant)))
            except BaseException:
                demand.release()
                raise
            self.demands.groups[name] = demand
            await self._adopt(plan, reason, join=name, already_pinned={name: grant} if grant else None)
        return grant

    async def forget_group(self, name: str, reason: str, patterns: Iterable[str] = ()) -> None:
        """The group leaves: it holds nothing, its processes get their affinity back, the others
        get its CPUs, and its SKB facts (``allocated/2`` and ``patterns``) go."""
        demand = self.demands.groups.pop(name, None)
        if demand is None:
            return
        self.publisher.forget(name)
        self.pinning.release_group(demand)
        self.schedule(f"elastic group {name} left")
        await skb_quietly(self.skb.replace_many({allocated_fact(name, ANY): [], **{p: [] for p in patterns}}),
                          f"removing the facts of elastic group {name}")
        log.info("elastic group %s left: %s", name, reason)

    # ---- recomputation ---------------------------------------------------------------------------
    def schedule(self, reason: str) -> int:
        """Ask for a recomputation soon; returns the generation to wait for with `wait_for`."""
        self._requested_gen += 1
        self._pending_reasons.append(reason)
        if self._recompute_task is None or self._recompute_task.done():
            self._recompute_task = asyncio.create_task(self._recompute_loop())
        return self._requested_gen

    async def wait_for(self, gen: int) -> None:
        async with self._gen_changed:
            await self._gen_changed.wait_for(lambda: self._done_gen >= gen or self.closing)

    async def _recompute_loop(self) -> None:
        while self._done_gen < self._requested_gen and not self.closing:
            async with self.lock:
                target = self._requested_gen
                reasons, self._pending_reasons = self._pending_reasons, []
                reason = "; ".join(dict.fromkeys(reasons)) or "recomputation"
                log.debug("recomputing the allocation: %s", reason)
                try:
                    plan = await self._plan([t.spec for t in self.registry.tasks.values()])
                except Exception:
                    log.exception("allocator failed; keeping the current allocation")
                    plan = None
                if plan is not None and plan.cores is None:
                    log.warning("allocation infeasible, keeping the current one: %s", plan.reason)
                elif plan is not None:
                    # Tasks that left while the allocator ran are not in the epoch state any more.
                    await self._adopt(plan, reason)
                await self._mark_done(target)

    async def _mark_done(self, gen: int) -> None:
        async with self._gen_changed:
            self._done_gen = max(self._done_gen, gen)
            self._gen_changed.notify_all()

    async def periodic(self) -> None:
        """The paper's RM also recomputes now and then (recompute_interval_s, off by default)."""
        while not self.closing:
            await asyncio.sleep(self.cfg.recompute_interval_s)
            self.schedule("periodic recomputation")

    async def stop(self) -> None:
        """No recomputation starts any more; waiters are woken."""
        self.closing = True
        async with self._gen_changed:
            self._gen_changed.notify_all()

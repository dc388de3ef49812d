"""The Resource Manager: owns the SKB, the tasks and the allocation, and tells clients what changed.

Everything here runs on the one asyncio event loop, so the state needs no locks;
the SKB is reached only through `AsyncSKB` (its engine is a child process, so a
slow query waits there, not here), and the allocator runs in a worker thread on
a snapshot (see cod.rm.allocation).  Allocator runs and the publication of their
results are serialised by `_alloc_lock`; requests that arrive meanwhile are
coalesced into the next run.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

from cod.facts.model import Machine

from . import jsonrpc as rpc
from .allocation import AllocatorRunner, Plan
from .allocator.model import TaskSpec
from .config import RMConfig
from .enforcement import EnforcementHook
from .jsonrpc import RpcError
from .prolog_text import atom, predicate_name, term
from .state import Connection, Peer, Revocation, RMState, Task

log = logging.getLogger("cod.rm")

CLOSE_WAIT_S = 3.0  # how long close() waits for a recomputation in flight


def skb_rpc_error(err: Exception) -> RpcError:
    code = getattr(err, "code", "engine")
    message = getattr(err, "message", str(err))
    data = dict(getattr(err, "data", None) or {})
    data["skb_code"] = code
    return RpcError(rpc.skb_error_code(code), message, data)


@dataclass
class OtherTask:
    """An unregistered process that keeps CPUs busy (SKB `other_task/3`), noticed by the busy detector."""

    pid: int
    comm: str
    cpu: float  # cores it used over the detection window
    cpus: tuple[int, ...]  # the CPUs kept free for it (its `Cpus` in the SKB)


class ResourceManager:
    def __init__(self, cfg: RMConfig, machine: Machine, skb: Any, enforcer: EnforcementHook) -> None:
        self.cfg = cfg
        self.machine = machine
        self.skb = skb  # cod.skb.AsyncSKB
        self.enforcer = enforcer
        self.enforce_mode = cfg.enforce_mode if cfg.enforce else "none"  # the backend in use (set by the daemon)
        self.state = RMState()
        self.allocator = AllocatorRunner(machine, cfg.solver, cfg.solver_time_limit_s)
        self.daemon_uid = os.geteuid()
        self.started = time.time()
        self.plan: dict[str, tuple[int, ...]] = {}
        self.last_solver = "none"
        self.last_plan: Plan | None = None
        self.others: dict[int, OtherTask] = {}  # pid -> unregistered busy process
        self.on_published: list[Callable[[], None]] = []  # run after each published epoch (confinement)
        self.last_announce_ns = 0
        self.published_holdings: dict[str, tuple[int, ...]] = {}  # CPUs each task held at the last epoch  # time.monotonic_ns() of the last published epoch's upcalls
        self._node_of = {pu.id: pu.numa_node for pu in machine.pus}
        self._allowed_mems = None if machine.allowed_mems is None else set(machine.allowed_mems)
        self._alloc_lock = asyncio.Lock()
        self._requested_gen = 0  # recomputations asked for
        self._done_gen = 0  # recomputations whose result is published
        self._gen_changed = asyncio.Condition()
        self._recompute_task: asyncio.Task[None] | None = None
        self._pending_reasons: list[str] = []
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self.closing = False

    # ---- connections -----------------------------------------------------------------------
    def new_connection(self, peer: Peer) -> Connection:
        return self.state.add_connection(peer)

    def privileged(self, conn: Connection) -> bool:
        return conn.peer.uid in (0, self.daemon_uid)

    async def connection_lost(self, conn: Connection) -> None:
        gone, _ = self.state.remove_connection(conn.id)
        if self.closing:  # close() has released every task and the SKB goes away next
            return
        for task in gone:
            await self._forget_task(task, reason="client disconnected")
        if conn.app is not None and not self.state.app_connections(conn.app):
            await self._release_app(conn.app)
        elif conn.app is not None:
            for fact in conn.facts:
                try:
                    await self.skb.remove_facts(conn.app, fact)
                except Exception as err:  # the fact may be gone already
                    log.debug("dropping fact %s of %s: %s", fact, conn.app, err)
        if gone:
            self.schedule(f"task {gone[0].name} left" if len(gone) == 1 else f"{len(gone)} tasks left")

    async def _release_app(self, app: str) -> None:
        """The last connection of `app` left: drop its namespace, keeping what was added as persistent."""
        keep = self.state.persistent.get(app)
        try:
            await self.skb.drop_app(app)
            if keep:
                for text in keep["procedures"]:
                    await self.skb.add_procedure(app, text)
                if keep["facts"]:
                    await self.skb.add_facts(app, keep["facts"])
        except Exception as err:
            log.warning("cleaning up application %s: %s", app, err)
        if (not keep or not (keep["facts"] or keep["procedures"])) and not self.state.app_connections(app):
            self.state.app_owner.pop(app, None)
            self.state.persistent.pop(app, None)

    def claim_app(self, conn: Connection, app: str) -> None:
        owner = self.state.app_owner.get(app)
        if owner is not None and owner != conn.peer.uid and not self.privileged(conn):
            raise RpcError(rpc.PERMISSION_DENIED, f"application namespace {app!r} belongs to uid {owner}")
        self.state.app_owner.setdefault(app, conn.peer.uid)
        conn.app = app

    # ---- events ----------------------------------------------------------------------------
    def emit(self, event: str, payload: dict[str, Any], *, app_scope: str | None = None) -> None:
        """Send `event` to every matching subscription (for app-scoped events: same app only)."""
        for sub in self.state.subscribers(event, payload):
            conn = self.state.connections.get(sub.conn_id)
            if conn is None or conn.send is None:
                continue
            if app_scope is not None and conn.app != app_scope:
                continue
            conn.send(rpc.notification(event, {"subscription": sub.id, "event": event, **payload}))

    def facts_changed(self, conn: Connection, scope: str, op: str, facts: list[str]) -> None:
        names = sorted({n for n in (predicate_name(f) for f in facts) if n})
        payload = {"scope": scope, "app": conn.app if scope == "app" else None, "op": op, "predicates": names}
        self.emit("facts_changed", payload, app_scope=conn.app if scope == "app" else None)

    # ---- tasks -----------------------------------------------------------------------------
    def task_facts(self, task: Task) -> list[str]:
        facts = [f"task({atom(task.name)}, {task.pid}, {atom(task.app)})"]
        for key, value in sorted(task.spec.to_dict().items()):
            if key != "name":
                facts.append(f"task_property({atom(task.name)}, {key}, {term(value)})")
        return facts

    async def admit(self, task: Task, *, replacing: Task | None = None) -> None:
        """Add (or update) `task` if the allocator can give every task its min_cores, else refuse."""
        async with self._alloc_lock:
            target = self._requested_gen  # changes asked for so far are in this snapshot
            others = [t.spec for n, t in self.state.tasks.items() if n != task.name]
            current = {n: t.announced for n, t in self.state.tasks.items()}
            specs = others + [task.spec]
            plan = await self.allocator.run(specs, current, self.unavailable(specs))
            if plan.cores is None:
                raise self._refusal(task.spec, others, plan)
            if replacing is None:
                self.state.tasks[task.name] = task
            else:
                replacing.spec = task.spec
                replacing.properties = task.properties
                task = replacing
            reason = f"task {task.name} {'arrived' if replacing is None else 'changed'}"
            # Upcalls first, then the SKB (as for allocated/2): the SKB serves calls in order, so the
            # registering client's next query, sent after its reply, sees task/3.
            await self._publish(plan, reason)
            facts = self.task_facts(task)
            if replacing is None:
                await self.skb.add_system_facts(facts)
            else:  # task/3 stays; the properties are swapped in one SKB operation
                await self.skb.replace_system_facts(f"task_property({atom(task.name)}, _, _)", facts[1:])
            await self._mark_done(target)
        if replacing is None:
            self.emit("task_arrived", {"task": task.name, "pid": task.pid, "app": task.app})

    def _refusal(self, spec: TaskSpec, others: list[TaskSpec], plan: Plan) -> RpcError:
        available = len(self.machine.cpu_ids())
        reserved = sum(t.min_cores for t in others)
        free = max(0, available - reserved)
        return RpcError(
            rpc.ADMISSION_REFUSED,
            f"cannot admit task {spec.name!r}: it asks for at least {spec.min_cores} cores, "
            f"{free} of {available} are free",
            {"requested": spec.min_cores, "free": free, "available": available, "reason": plan.reason},
        )

    async def remove_task(self, task: Task, reason: str) -> int:
        """The task leaves; returns the generation of the recomputation that gives its cores away."""
        conn = self.state.connections.get(task.conn_id)
        if conn is not None:
            conn.tasks.discard(task.name)
            if task.auto_subscription is not None:
                self.state.unsubscribe(conn, task.auto_subscription)
        self.state.tasks.pop(task.name, None)
        for core in [c for c, r in self.state.revocations.items() if r.task == task.name]:
            del self.state.revocations[core]
        # Recompute first: the others get the cores while the SKB forgets the task.
        gen = self.schedule(f"task {task.name} left")
        await self._forget_task(task, reason)
        return gen

    async def task_exited(self, task: Task, event_ns: int) -> float | None:
        """The task's process exited (a process event): deregister it at once.

        Returns how long after the exit event the other tasks were told of the freed
        cores (ms), or None when nothing changed hands."""
        if self.state.tasks.get(task.name) is not task:
            return None
        gen = await self.remove_task(task, "exited")
        await self.wait_for(gen)
        if self.last_announce_ns < event_ns:
            return None
        ms = (self.last_announce_ns - event_ns) / 1e6
        log.info("task %s (pid %d) exited: its cores were reassigned %.3f ms after the exit event",
                 task.name, task.pid, ms)
        return ms

    def task_pids(self) -> dict[int, Task]:
        """Registered pids and their tasks."""
        return {t.pid: t for t in self.state.tasks.values()}

    # ---- unregistered busy processes (other_task/3) ---------------------------------------
    def unavailable(self, specs: list[TaskSpec]) -> tuple[int, ...]:
        """CPUs kept free for busy unregistered processes, at most what the tasks' min_cores leave over.

        Hungriest process first, so when CPUs are short the biggest hogs get their own."""
        room = len(self.machine.cpu_ids()) - sum(s.min_cores for s in specs)
        out: list[int] = []
        for other in sorted(self.others.values(), key=lambda o: (-o.cpu, o.pid)):
            for cpu in other.cpus:
                if len(out) >= room:
                    return tuple(sorted(out))
                if cpu not in out:
                    out.append(cpu)
        return tuple(sorted(out))

    async def set_others(self, others: dict[int, OtherTask], why: str) -> int:
        """Record the unregistered busy processes in the SKB, tell subscribers, recompute."""
        added = sorted(set(others) - set(self.others))
        self.others = dict(others)
        facts = [f"other_task({o.pid}, {atom(o.comm)}, {term(list(o.cpus))})" for _, o in sorted(others.items())]
        gen = self.schedule(why)
        try:
            await self.skb.replace_system_facts("other_task(_, _, _)", facts)
        except Exception as err:
            log.warning("writing other_task facts: %s", err)
        self.emit("facts_changed", {"scope": "system", "app": None, "op": "add" if added else "remove",
                                    "predicates": ["other_task"]})
        return gen

    async def _forget_task(self, task: Task, reason: str) -> None:
        try:
            await self.skb.remove_system_facts(f"task({atom(task.name)}, _, _)")
            await self.skb.remove_system_facts(f"task_property({atom(task.name)}, _, _)")
            await self.skb.remove_system_facts(f"allocated({atom(task.name)}, _)")
        except Exception as err:
            log.warning("removing facts of task %s: %s", task.name, err)
        self._enforce_release(task)
        self.plan.pop(task.name, None)
        self.emit("task_left", {"task": task.name, "pid": task.pid, "app": task.app, "reason": reason})
        log.info("task %s (pid %d) left: %s", task.name, task.pid, reason)

    # ---- recomputation ---------------------------------------------------------------------
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
            async with self._alloc_lock:
                target = self._requested_gen
                reasons, self._pending_reasons = self._pending_reasons, []
                reason = "; ".join(dict.fromkeys(reasons)) or "recomputation"
                specs = [t.spec for t in self.state.tasks.values()]
                current = {n: t.announced for n, t in self.state.tasks.items()}
                try:
                    plan = await self.allocator.run(specs, current, self.unavailable(specs))
                except Exception:
                    log.exception("allocator failed; keeping the current allocation")
                    plan = None
                if plan is not None and plan.cores is None:
                    log.warning("allocation infeasible, keeping the current one: %s", plan.reason)
                elif plan is not None:
                    # Tasks that left while the allocator ran are simply not in the state any more.
                    await self._publish(plan, reason)
                await self._mark_done(target)

    async def _mark_done(self, gen: int) -> None:
        async with self._gen_changed:
            self._done_gen = max(self._done_gen, gen)
            self._gen_changed.notify_all()

    async def _publish(self, plan: Plan, reason: str) -> None:
        """Adopt a new plan: mark cores taken from tasks for revocation, then announce (under the lock)."""
        assert plan.cores is not None
        self.last_solver = plan.solver
        self.last_plan = plan
        self.plan = {n: c for n, c in plan.cores.items() if n in self.state.tasks}
        deadline = asyncio.get_running_loop().time() + self.cfg.revoke_deadline_s
        revs = self.state.revocations
        next_epoch = self.state.epoch + 1
        for name, task in self.state.tasks.items():
            planned = set(self.plan.get(name, ()))
            for core in set(task.announced) - planned:
                if core not in revs:
                    revs[core] = Revocation(core, name, next_epoch, deadline)
            for core in planned:
                if core in revs and revs[core].task == name:
                    del revs[core]  # taken back before it was given away
        for core in [c for c, r in revs.items() if r.task not in self.state.tasks]:
            del revs[core]
        await self._announce(reason)

    async def _announce(self, reason: str) -> None:
        """Tell every task whose usable cores changed, write the SKB, apply enforcement."""
        revs = self.state.revocations
        # Compared with what was last published, not with the state now: an ack or a deadline
        # has already dropped its revocations from the state when it calls us.
        before = self.published_holdings
        changes: list[tuple[Task, tuple[int, ...], tuple[int, ...]]] = []
        for name, task in self.state.tasks.items():
            grant = tuple(sorted(c for c in self.plan.get(name, ()) if c not in revs or revs[c].task == name))
            if grant != task.announced:
                changes.append((task, task.announced, grant))
        for task, _old, grant in changes:
            task.announced = grant
        after = self.state.holdings()
        self.published_holdings = after
        if not changes and before == after:
            self._run_published_hooks()  # the plan may differ (e.g. unavailable CPUs) without any change here
            return
        self.state.epoch += 1
        epoch = self.state.epoch
        for task, _old, _grant in changes:
            task.announced_epoch = epoch
        now = asyncio.get_running_loop().time()
        self.last_announce_ns = time.monotonic_ns()
        for task, old, grant in changes:
            removed = sorted(set(old) - set(grant))
            payload = self.allocation_of(task)
            payload.update(
                added=sorted(set(grant) - set(old)),
                removed=removed,
                reason=reason,
            )
            if removed:
                payload["deadline_s"] = round(
                    max(0.0, min((revs[c].deadline for c in removed if c in revs), default=now) - now), 3
                )
            self.emit("allocation_changed", payload)
        # Upcalls first (they are the latency clients wait for), then pinning and the SKB.  SKB
        # calls are served in order, so a query sent after an upcall sees the new allocated/2.
        for name, cores in after.items():
            if before.get(name) != cores:
                self._enforce_apply(self.state.tasks[name], cores)
        self._arm_deadline()
        self._run_published_hooks()
        await self._write_allocation(after, epoch)
        log.info(
            "epoch %d (%s): %s", epoch, reason,
            ", ".join(f"{t.name}={_ranges(g)}" for t, _o, g in changes) or "holdings changed",
        )

    def _run_published_hooks(self) -> None:
        for hook in self.on_published:
            try:
                hook()
            except Exception:
                log.exception("after publishing an allocation")

    def plan_summary(self) -> dict[str, Any]:
        """How the current plan was made: solver, status, time, and the CPUs kept for other work."""
        plan = self.last_plan
        return {
            "solver": self.last_solver,
            "status": plan.status if plan else None,
            "solve_ms": round(plan.solve_ms, 3) if plan else None,
            "unavailable": list(plan.unavailable) if plan else [],
        }

    def allocation_of(self, task: Task) -> dict[str, Any]:
        nodes = sorted({n for c in task.announced if (n := self._node_of.get(c)) is not None})
        mems = [n for n in nodes if self._allowed_mems is None or n in self._allowed_mems]
        giving_back = sorted(c for c, r in self.state.revocations.items() if r.task == task.name)
        return {
            "task": task.name,
            "app": task.app,
            "epoch": task.announced_epoch,
            "cores": list(task.announced),
            "numa_nodes": nodes,
            "memory_nodes": mems,
            "releasing": giving_back,
            "binding": list(self.last_plan.binding.get(task.name, ())) if self.last_plan else [],
        }

    async def _write_allocation(self, holdings: dict[str, tuple[int, ...]], epoch: int) -> None:
        facts = [f"allocated({atom(n)}, {c})" for n, cores in sorted(holdings.items()) for c in cores]
        try:
            # Each replacement is one SKB operation, so no query sees a half-written allocation.
            await self.skb.replace_system_facts("allocated(_, _)", facts)
            await self.skb.replace_system_facts("allocation_epoch(_)", [f"allocation_epoch({epoch})"])
        except Exception as err:
            log.error("writing allocation epoch %d into the SKB failed: %s", epoch, err)

    # ---- revocation deadlines --------------------------------------------------------------
    def _arm_deadline(self) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        if self.state.revocations and not self.closing:
            when = min(r.deadline for r in self.state.revocations.values())
            loop = asyncio.get_running_loop()
            self._deadline_timer = loop.call_at(when, self._on_deadline)

    def _on_deadline(self) -> None:
        task = asyncio.create_task(self._expire_revocations())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _expire_revocations(self) -> None:
        async with self._alloc_lock:
            now = asyncio.get_running_loop().time()
            expired = [c for c, r in self.state.revocations.items() if r.deadline <= now + 1e-3]
            for core in expired:
                rev = self.state.revocations.pop(core)
                log.info("task %s did not release CPU %d in time; reassigning it", rev.task, core)
            await self._announce("revocation deadline passed")
            self._arm_deadline()  # for revocations announced later, whatever _announce did

    async def acknowledge(self, task: Task, epoch: int) -> list[int]:
        async with self._alloc_lock:
            released = sorted(
                c for c, r in self.state.revocations.items() if r.task == task.name and r.epoch <= epoch
            )
            for core in released:
                del self.state.revocations[core]
            if released:
                await self._announce(f"task {task.name} released CPUs {_ranges(released)}")
            return released

    # ---- enforcement -----------------------------------------------------------------------
    def _enforce_apply(self, task: Task, cpus: tuple[int, ...]) -> None:
        if self.closing:  # close() releases every task; nothing may be pinned after it
            return
        if not cpus:  # admitted, but its cores are still being given back by others: wait for them
            log.debug("task %s holds no CPU yet; not pinning it", task.name)
            return
        mems = tuple(sorted({n for c in cpus if (n := self._node_of.get(c)) is not None}))
        try:
            self.enforcer.apply(task.name, task.pid, cpus, mems)
        except Exception as err:
            log.warning("enforcing the allocation of %s (pid %d) failed: %s", task.name, task.pid, err)

    def holdings_of(self, name: str) -> tuple[int, ...]:
        """CPUs task `name` may run on now (announced plus those it has yet to give back)."""
        task = self.state.tasks.get(name)
        if task is None:
            return ()
        held = set(task.announced) | {c for c, r in self.state.revocations.items() if r.task == name}
        return tuple(sorted(held))

    def reapply_all(self) -> None:
        """Pin every task again (after lost process events: threads may have been missed)."""
        for task in list(self.state.tasks.values()):
            self._enforce_apply(task, self.holdings_of(task.name))

    def _enforce_release(self, task: Task) -> None:
        try:
            self.enforcer.release(task.name, task.pid)
        except Exception as err:
            log.warning("releasing %s (pid %d) failed: %s", task.name, task.pid, err)

    async def close(self) -> None:
        self.closing = True
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
        async with self._gen_changed:
            self._gen_changed.notify_all()
        # A recomputation in flight publishes (and pins) before we release; but a stuck SKB
        # must not keep the processes pinned, so wait for it a bounded time only.
        try:
            await asyncio.wait_for(self._alloc_lock.acquire(), CLOSE_WAIT_S)
            locked = True
        except TimeoutError:
            log.warning("a recomputation is still running after %g s; releasing the tasks anyway", CLOSE_WAIT_S)
            locked = False
        try:
            for task in list(self.state.tasks.values()):
                self._enforce_release(task)
        finally:
            if locked:
                self._alloc_lock.release()
        self.allocator.close()


def _ranges(cpus: Any) -> str:
    cpus = sorted(cpus)
    if not cpus:
        return "none"
    out, start, prev = [], cpus[0], cpus[0]
    for c in cpus[1:] + [None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        out.append(f"{start}-{prev}" if prev != start else f"{start}")
        if c is not None:
            start = prev = c
    return ",".join(out)

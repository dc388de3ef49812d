"""The Resource Manager: carries out what the policies decide, in the right order, and rolls back together.

Policies are pure and live elsewhere: the allocator (:mod:`.allocator`, run
by :mod:`.planner`), the epochs and revocations (:mod:`.epochs`), quotas
(:mod:`.quotas`), the CPUs kept for busy processes (:mod:`.reservations`).
State is the :mod:`.registry`'s and the epoch state's.  This module runs them
and applies their results: SKB writes (:class:`cod.skb.AsyncSKB`), pinning
(the enforcement backend), upcalls.

Everything runs on the one asyncio event loop, so the state needs no locks.
Allocator runs and the adoption of their plans are serialised by
``_alloc_lock``; requests that arrive meanwhile are coalesced into the next
run.  Publications (the effects of a new epoch) are carried out by one
publisher task, in order, so an acknowledgement never waits for the SKB:
it changes the epoch state at once and queues its publication.

A call that changes several things (registering a task with facts and
procedures) checks everything first, then pins the new task, then writes the
SKB in one transaction, then adopts the plan; a failure at any step undoes
the steps before it, so the daemon's state, the SKB and the cgroups never
disagree.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import secrets
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Protocol

from cod.facts.model import Machine
from cod.protocol import jsonrpc as rpc
from cod.protocol.jsonrpc import RpcError
from cod.protocol.prolog_text import atom, predicate_name, term
from cod.skb import PERSISTENT, SKBError, Staged
from cod.skb import codec

from . import epochs, quotas, reasons
from .allocator.model import TaskSpec
from .conditions import Condition, ConditionWatch, step
from .deploy import DeployError, GraphError, deploy, parse_graph
from .deploy import Options as DeployOptions
from .deployment import Deployment, Matching, match_threads
from .enforce import procfs
from .taskprops import Derived, build_spec, derived_value, split_properties
from .config import RMConfig
from .enforce.backend import Enforcer
from .epochs import EpochState, Publication
from .planner import Plan, Planner
from .registry import Connection, Peer, Registry, Task, Usage, default_app_name
from .reservations import OtherTask, other_pid, other_task_name

log = logging.getLogger("cod.rm")

CLOSE_WAIT_S = 3.0  # how long close() waits for a recomputation in flight


def skb_rpc_error(err: SKBError) -> RpcError:
    data = dict(err.data or {})
    data["skb_code"] = err.code
    if err.code == "quota":
        return RpcError(rpc.QUOTA_EXCEEDED, err.message, data)
    return RpcError(rpc.skb_error_code(err.code), err.message, data)


def query_tag(conn: Connection) -> str:
    """Whom the SKB runs a query for, so that ``cancel`` stops exactly this connection's queries:
    its capability token (which its direct channel's queries carry too), or its id."""
    return conn.token if conn.token is not None else f"conn{conn.id}"


async def skb_call(awaitable: Any) -> Any:
    """Await an SKB call, turning its SKBError into the protocol's error reply."""
    try:
        return await awaitable
    except SKBError as err:
        raise skb_rpc_error(err) from None


class Demand(Protocol):
    """A process group the daemon drives itself (an elastic group, rm/unmanaged.py): one more
    task for the allocator, in the epochs and publications, but with no client to tell or wait for."""

    name: str

    @property
    def spec(self) -> TaskSpec: ...
    def preferred(self) -> tuple[int, ...]: ...  # the CPUs it holds or wants: its current placement
    def pin(self, cpus: tuple[int, ...]) -> None: ...  # the allocation gives it ``cpus``: confine it there
    def release(self) -> None: ...  # give its processes their affinity back
    def members(self) -> set[int]: ...  # its processes (never reported as busy)
    def on_events(self, events: list[Any]) -> None: ...  # process events (forks and exits of members)


@dataclass
class _Queued:
    pub: Publication
    done: asyncio.Future[None]


class ResourceManager:
    def __init__(self, cfg: RMConfig, machine: Machine, skb: Any, enforcer: Enforcer, *,
                 direct_socket: str | None = None) -> None:
        self.cfg = cfg
        self.machine = machine
        self.skb = skb  # cod.skb.AsyncSKB
        self.enforcer = enforcer
        self.direct_socket = direct_socket
        self.enforce_mode = enforcer.name if cfg.enforce else "none"
        self.registry = Registry()
        self.epochs = EpochState()
        self.planner = Planner(machine, cfg.solver, cfg.solver_time_limit_s)
        self.daemon_uid = os.geteuid()
        self.started = time.time()
        self.n_cpus = len(machine.cpu_ids())
        self.last_plan: Plan | None = None
        self.others: dict[int, OtherTask] = {}  # pid -> unregistered busy process
        self.on_published: list[Callable[[], None]] = []  # run after each published epoch (confinement)
        self.demands: dict[str, Demand] = {}  # elastic groups the daemon drives itself (rm/unmanaged.py)
        self.unmanaged: Any = None  # their orchestration (rm.unmanaged.UnmanagedGroups), None when not enforcing
        self.last_announce_ns = 0  # time.monotonic_ns() of the last published epoch's upcalls
        self._node_of = {pu.id: pu.numa_node for pu in machine.pus}
        self._allowed_mems = None if machine.allowed_mems is None else set(machine.allowed_mems)
        self._alloc_lock = asyncio.Lock()
        self._requested_gen = 0  # recomputations asked for
        self._done_gen = 0  # recomputations whose result is published
        self._gen_changed = asyncio.Condition()
        self._recompute_task: asyncio.Task[None] | None = None
        self._pending_reasons: list[str] = []
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._publications: asyncio.Queue[_Queued | None] = asyncio.Queue()
        self._publisher = asyncio.get_running_loop().create_task(self._publish_loop())
        self._background: set[asyncio.Task[Any]] = set()
        self._uid_locks: dict[int, asyncio.Lock] = {}
        self.conditions = ConditionWatch()
        self._dirty: set[str] | None = set()
        self._deriving: asyncio.Task[None] | None = None
        self._periodic_task = (asyncio.get_running_loop().create_task(self._periodic())
                               if cfg.recompute_interval_s > 0 else None)
        self.closing = False

    # ---- connections -----------------------------------------------------------------------
    def privileged_uid(self, uid: int) -> bool:
        return uid in (0, self.daemon_uid)

    def new_connection(self, peer: Peer) -> Connection:
        return self.registry.add_connection(peer, self.privileged_uid(peer.uid))

    def connection_refusal(self, peer: Peer, open_connections: int) -> str | None:
        """Why a new connection from ``peer`` is refused (None: accepted)."""
        if self.privileged_uid(peer.uid):
            return None if open_connections < self.cfg.max_connections else "too many connections"
        if open_connections >= self.cfg.max_connections - self.cfg.reserved_privileged_connections:
            return "too many connections (the rest are reserved for root)"
        if self.registry.uid_connections(peer.uid) >= self.cfg.max_connections_per_uid:
            return f"uid {peer.uid} already has {self.cfg.max_connections_per_uid} connections (max_connections_per_uid)"
        return None

    async def hello(self, conn: Connection, app: str | None) -> dict[str, Any]:
        if app is None:
            app = conn.app or default_app_name(conn.peer.uid, conn.peer.pid)
        refusal = self.registry.name_refusal(conn.peer.uid, app, conn.privileged)
        if refusal is not None:
            raise RpcError(rpc.PERMISSION_DENIED, refusal)
        if conn.app is not None and conn.app != app:
            raise RpcError(rpc.INVALID_PARAMS, f"hello: this connection already uses application {conn.app!r}")
        self.registry.claim_app(conn, app)
        conn.hello = True
        direct = None
        if self.direct_socket is not None:
            if conn.token is None:
                conn.token = secrets.token_hex(16)
                try:
                    await self.skb.grant(conn.token, app, (conn.peer.uid, conn.privileged))
                except SKBError as err:
                    log.warning("no direct channel for connection %d: %s", conn.id, err)
                    conn.token = None
            if conn.token is not None:
                direct = {"socket": self.direct_socket, "token": conn.token, "protocol": rpc.PROTOCOL_VERSION}
        return {"app": app, "skb": direct}

    async def connection_lost(self, conn: Connection) -> None:
        gone, _ = self.registry.remove_connection(conn.id)
        self.conditions.forget_connection(conn.id)
        if self.closing:  # close() has released every task and the SKB goes away next
            return
        if conn.token is not None:
            await self._skb_quietly(self.skb.revoke(conn.token), f"revoking the capability of connection {conn.id}")
        for task in gone:
            await self._forget_task(task, "client disconnected")
        app = conn.app
        if app is not None:
            reply = await self._skb_quietly(self.skb.drop_owner(app, conn.id), f"dropping the facts of connection {conn.id}")
            if reply is not None:
                self.registry.usage[app] = Usage.from_reply(reply.get("usage"))
            if not self.registry.app_connections(app):
                reply = await self._skb_quietly(self.skb.release_app(app), f"releasing application {app}")
                if reply is not None:
                    self.registry.usage[app] = Usage.from_reply(reply.get("usage"))
                self.registry.release_name(app)
        if gone:
            self.schedule(f"task {gone[0].name} left" if len(gone) == 1 else f"{len(gone)} tasks left")

    async def _skb_quietly(self, awaitable: Any, what: str) -> Any:
        try:
            return await awaitable
        except SKBError as err:
            log.warning("%s: %s", what, err)
            return None

    def _uid_lock(self, uid: int) -> asyncio.Lock:
        """Writes of one uid are serialised, so its quota cannot be passed by two at once."""
        lock = self._uid_locks.get(uid)
        if lock is None:
            lock = self._uid_locks[uid] = asyncio.Lock()
        return lock

    # ---- events ----------------------------------------------------------------------------
    def emit(self, event: str, payload: dict[str, Any], *, app_scope: str | None = None) -> None:
        """Send ``event`` to every matching subscription (for app-scoped events: same app only)."""
        for sub in self.registry.subscribers(event, payload):
            conn = self.registry.connections.get(sub.conn_id)
            if conn is None or conn.send is None:
                continue
            if app_scope is not None and conn.app != app_scope:
                continue
            conn.send(rpc.notification(event, {"subscription": sub.id, "event": event, **payload}))

    def facts_changed(self, app: str | None, op: str, facts: Iterable[str]) -> None:
        names = sorted({n for n in (predicate_name(f) for f in facts) if n})
        scope = "system" if app is None else "app"
        self.emit("facts_changed", {"scope": scope, "app": app, "op": op, "predicates": names}, app_scope=app)

    # ---- facts and procedures ------------------------------------------------------------
    async def add_facts(self, conn: Connection, facts: list[str], *, system: bool, persistent: bool) -> int:
        if system:
            n = await skb_call(self.skb.add_system_facts(facts))
            self.facts_changed(None, "add", facts)
            self.schedule("system facts changed")
            self.changed(None)
            return int(n)
        app = self._app(conn)
        async with self._uid_lock(conn.peer.uid):
            limits = quotas.write_limits(self.cfg, self.registry, app, conn.peer.uid)
            owner = PERSISTENT if persistent else conn.id
            reply = await skb_call(self.skb.add_facts(app, owner, facts, limits))
            self.registry.usage[app] = Usage.from_reply(reply.get("usage"))
        self.facts_changed(app, "add", facts)
        self._app_changed(app)
        return int(reply["added"])

    async def remove_facts(self, conn: Connection, patterns: list[str], *, system: bool) -> int:
        if system:
            removed = 0
            for pattern in patterns:
                removed += await skb_call(self.skb.remove_system_facts(pattern))
            if removed:
                self.facts_changed(None, "remove", patterns)
                self.schedule("system facts changed")
                self.changed(None)
            return removed
        app = self._app(conn)
        reply = await skb_call(self.skb.remove_facts(app, patterns))
        self.registry.usage[app] = Usage.from_reply(reply.get("usage"))
        removed = int(reply["removed"])
        if removed:
            self.facts_changed(app, "remove", patterns)
            self._app_changed(app)
        return removed

    async def add_procedure(self, conn: Connection, text: str, *, persistent: bool) -> list[str]:
        app = self._app(conn)
        async with self._uid_lock(conn.peer.uid):
            limits = quotas.write_limits(self.cfg, self.registry, app, conn.peer.uid)
            reply = await skb_call(self.skb.add_procedure(app, text, persistent, limits))
            self.registry.usage[app] = Usage.from_reply(reply.get("usage"))
        self._app_changed(app)
        return list(reply["predicates"])

    async def execute_query(self, conn: Connection, goal: str, *, all_solutions: bool, max_solutions: int,
                            timeout_s: float) -> list[dict[str, Any]]:
        answer = await skb_call(self.skb.query(self._app(conn), goal, all_solutions=all_solutions,
                                               max_solutions=max_solutions, timeout_s=timeout_s,
                                               tag=query_tag(conn), client=(conn.peer.uid, conn.privileged)))
        return list(answer["solutions"])

    async def cancel(self, conn: Connection) -> int:
        """Stop the connection's running queries, on both roads (this socket and its direct channel)."""
        return int(await skb_call(self.skb.cancel(query_tag(conn))))

    async def describe_app(self, app: str) -> dict[str, Any]:
        return await skb_call(self.skb.describe_app(app))

    async def predicates(self, conn: Connection, kind: str) -> list[dict[str, Any]]:
        return await skb_call(self.skb.predicates(self._app(conn), kind))

    def explain(self, task: Task) -> dict[str, Any]:
        """The allocator's reasons for the task's CPUs, with their evidence (cod.rm.reasons)."""
        plan = self.last_plan
        binding = list(plan.binding.get(task.name, ())) if plan else []
        specs = {t.name: t.spec for t in self.registry.tasks.values()}
        cores = {name: tuple(c) for name, c in self.epochs.announced.items() if name in specs}
        return {"task": task.name, "app": task.app, "cores": list(cores.get(task.name, ())), "binding": binding,
                "constraints": reasons.constraints(task.name, binding, specs, cores,
                                                   plan.unavailable if plan else (), self.machine,
                                                   plan.reservations if plan else {}),
                "plan": self.plan_summary()}

    def _app(self, conn: Connection) -> str:
        assert conn.app is not None, "handlers only call the service after hello"
        return conn.app

    def _app_changed(self, app: str) -> None:
        """An application's facts or procedures changed: what is derived from them is evaluated again."""
        self.changed({app})

    # ---- what is derived from the SKB: task properties and conditions ---------------------
    def changed(self, apps: set[str] | None) -> None:
        """What the SKB holds changed for ``apps`` (None: system facts or live state, so everyone's):
        derived task properties and condition subscriptions of those applications are evaluated
        again, soon, all of one application in one SKB call."""
        if self._dirty is None or apps is None:
            self._dirty = None
        else:
            self._dirty |= apps
        if self._deriving is None or self._deriving.done():
            self._deriving = asyncio.get_running_loop().create_task(self._derive_loop())

    async def _derive_loop(self) -> None:
        while not self.closing and (self._dirty is None or self._dirty):
            dirty, self._dirty = self._dirty, set()
            apps = {t.app for t in self.registry.tasks.values() if t.derived} | self.conditions.apps()
            if dirty is not None:
                apps &= dirty
            await asyncio.gather(*(self._derive_app(app) for app in sorted(apps)), return_exceptions=True)

    async def _derive_app(self, app: str) -> None:
        tasks = [t for t in self.registry.tasks.values() if t.app == app and t.derived]
        conds = self.conditions.of_app(app)
        queries: list[tuple[str, str | None]] = [(d.goal, d.var) for t in tasks for d in t.derived.values()]
        queries += [(c.goal, None) for c in conds]
        if not queries:
            return
        try:
            results = await self.skb.evaluate(app, Staged(), queries, timeout_s=self.cfg.condition_timeout_s)
        except SKBError as err:
            results = [{"error": err.to_dict()}] * len(queries)
        k = 0
        for task in tasks:
            n = len(task.derived)
            await self._rederived(task, results[k:k + n])
            k += n
        for cond, result in zip(conds, results[k:]):
            self._condition_result(cond, result)

    async def _rederived(self, task: Task, results: list[dict[str, Any]]) -> None:
        if self.registry.tasks.get(task.name) is not task:
            return
        values, errors = self._derived_results(task.derived, results)
        for key, (_code, message, _data) in errors.items():
            self._warn(task, key, f"derived {key} ({task.derived[key].goal}): {message}")
        new = {**task.derived_values, **values}
        if new == task.derived_values:
            return
        changes = ", ".join(f"{k} {task.derived_values.get(k)} -> {v}" for k, v in sorted(new.items())
                            if task.derived_values.get(k) != v)
        plain = {k: v for k, v in task.properties.items() if k not in task.derived}
        try:
            spec = build_spec(task.name, plain, new, "derived")
            await self._respec(task, spec, task.properties, task.derived, new,
                               f"derived properties of {task.name} changed: {changes}")
        except RpcError as err:
            self._warn(task, ",".join(sorted(values)), f"derived properties ({changes}) not applied: {err.message}")

    def _warn(self, task: Task, key: str, reason: str) -> None:
        log.warning("task %s: %s; it keeps its last values", task.name, reason)
        self.emit("task_warning", {"task": task.name, "app": task.app, "property": key, "reason": reason,
                                   "kept": dict(task.derived_values)})

    def _condition_result(self, cond: Condition, result: dict[str, Any]) -> None:
        if cond.sub_id not in self.conditions.conditions:
            return  # unsubscribed meanwhile
        outcome = step(cond, result)
        conn = self.registry.connections.get(cond.conn_id)
        if outcome.drop is not None:
            del self.conditions.conditions[cond.sub_id]
            if conn is not None:
                self.registry.unsubscribe(conn, cond.sub_id)
                if conn.send is not None:
                    conn.send(rpc.notification("subscription_dropped", {
                        "subscription": cond.sub_id, "event": "subscription_dropped", "goal": cond.goal,
                        "reason": outcome.drop}))
            log.info("condition %d (%s) dropped: %s", cond.sub_id, cond.goal, outcome.drop)
        elif outcome.notify is not None and conn is not None and conn.send is not None:
            conn.send(rpc.notification("condition", {"subscription": cond.sub_id, **outcome.notify}))

    async def add_condition(self, conn: Connection, goal: str) -> int:
        """Subscribe ``conn`` to ``goal`` turning true and false; a goal that cannot run is refused now."""
        app = self._app(conn)
        [result] = await skb_call(self.skb.evaluate(app, Staged(), [(goal, None)],
                                                    timeout_s=self.cfg.condition_timeout_s))
        if "error" in result:
            err = skb_rpc_error(SKBError(str(result["error"].get("code", "engine")),
                                         str(result["error"].get("message", "")), result["error"].get("data") or {}))
            raise RpcError(err.code, f"subscribe: condition {goal!r}: {err.message}", err.data)
        sub = self.registry.subscribe(conn, "condition", {"goal": goal})
        cond = Condition(sub.id, conn.id, app, goal)
        self.conditions.conditions[sub.id] = cond
        # Its first state is reported (after the reply, which carries the subscription's id).
        asyncio.get_running_loop().call_soon(self._condition_result, cond, result)
        return sub.id

    def remove_condition(self, conn: Connection, sub_id: int) -> None:
        self.conditions.conditions.pop(sub_id, None)

    def _conditions_only_soon(self) -> None:
        """The allocation changed: conditions may read it (derived properties do not follow it,
        which would feed the allocation back into itself)."""

        async def run() -> None:
            for app in sorted(self.conditions.apps()):
                conds = self.conditions.of_app(app)
                try:
                    results = await self.skb.evaluate(app, Staged(), [(c.goal, None) for c in conds],
                                                      timeout_s=self.cfg.condition_timeout_s)
                except SKBError as err:
                    results = [{"error": err.to_dict()}] * len(conds)
                for cond, result in zip(conds, results):
                    self._condition_result(cond, result)

        self._spawn(run())

    def _spawn(self, coro: Any) -> None:
        """Run ``coro`` in the background (kept referenced until done)."""
        job = asyncio.get_running_loop().create_task(coro)
        self._background.add(job)
        job.add_done_callback(self._background.discard)

    async def _periodic(self) -> None:
        """The paper's RM also recomputes now and then (recompute_interval_s, off by default)."""
        while not self.closing:
            await asyncio.sleep(self.cfg.recompute_interval_s)
            self.schedule("periodic recomputation")

    # ---- tasks -----------------------------------------------------------------------------
    def task_facts(self, task: Task) -> list[str]:
        facts = [f"task({atom(task.name)}, {task.pid}, {atom(task.app)})"]
        for key, value in sorted(task.spec.to_dict().items()):
            if key != "name":
                facts.append(f"task_property({atom(task.name)}, {key}, {term(value)})")
        return facts

    def task_refusal(self, conn: Connection, name: str, properties: dict[str, Any]) -> None:
        why = quotas.task_refusal(self.cfg, self.registry, conn.peer.uid, conn.privileged, name, properties,
                                  self.n_cpus)
        if why is not None:
            raise RpcError(rpc.PERMISSION_DENIED, f"task {name!r}: {why}")

    async def register_task(self, conn: Connection, name: str, pid: int, plain: dict[str, Any],
                            derived: dict[str, Derived], facts: list[str], procedures: list[str],
                            persistent: bool) -> Task:
        """Admit a task with its application's facts and procedures, all or nothing."""
        app = self._app(conn)
        async with self._uid_lock(conn.peer.uid):
            limits = quotas.write_limits(self.cfg, self.registry, app, conn.peer.uid)
            owner = PERSISTENT if persistent else conn.id
            writes = [codec.add_procedure(app, text, persistent, limits) for text in procedures]
            if facts:
                writes.append(codec.add_facts(app, owner, facts, limits))
            # 1. check the facts and procedures, and derive the properties given as queries, as the
            #    namespace will be after them, without keeping them
            values: dict[str, int] = {}
            if writes or derived:
                staged = Staged(tuple(facts), owner, tuple((t, persistent) for t in procedures), limits)
                results = await skb_call(self.skb.evaluate(app, staged, [(d.goal, d.var) for d in derived.values()]))
                values = self._derived_or_refuse(derived, results, "register_task")
            spec = build_spec(name, plain, values, "register_task")
            self.task_refusal(conn, name, spec.to_dict())
            task = Task(name=name, pid=pid, app=app, conn_id=conn.id, owner_uid=conn.peer.uid, spec=spec,
                        properties={**plain, **{k: d.to_dict() for k, d in derived.items()}},
                        derived=dict(derived), derived_values=values)
            writes.append(codec.add_system_facts(self.task_facts(task)))
            async with self._alloc_lock:
                if task.name in self.registry.tasks or task.name in self.demands:
                    raise RpcError(rpc.ALREADY_EXISTS, f"a task or elastic group named {task.name!r} is already registered")
                # 2. admission: the plan with the newcomer, not adopted yet
                plan = await self._plan([t.spec for t in self.registry.tasks.values()] + [task.spec])
                if plan.cores is None:
                    raise self._refusal(task.spec, plan)
                reason = f"task {task.name} arrived"
                _, trial = epochs.adopt(epochs.add_task(self.epochs, task.name), plan.cores, self._now(),
                                        self.cfg.revoke_deadline_s, reason)
                # 3. pin the newcomer (if it holds anything yet); 4. write the SKB in one transaction
                grant = trial.holdings.get(task.name, ())
                self._pin_or_refuse(task, grant)
                try:
                    results = await skb_call(self.skb.batch(writes))
                except BaseException:
                    self._release(task)
                    raise
                # 5. commit: from here on nothing is undone.  The plan is adopted on the epoch
                # state as it is now (an acknowledgement may have moved cores during the write).
                new_state, pub = epochs.adopt(epochs.add_task(self.epochs, task.name), plan.cores,
                                              self._now(), self.cfg.revoke_deadline_s, reason)
                for result in results:
                    if isinstance(result, dict) and "usage" in result:
                        self.registry.usage[app] = Usage.from_reply(result["usage"])
                self.registry.tasks[task.name] = task
                conn.tasks.add(task.name)
                sub = self.registry.subscribe(conn, "allocation_changed", {"task": task.name})
                task.auto_subscription = sub.id
                task.warning_subscription = self.registry.subscribe(conn, "task_warning", {"task": task.name}).id
                self.epochs = new_state
                await self._publish(self._adopted(plan, pub), already_pinned={task.name: grant} if grant else None)
        if facts:
            self.facts_changed(app, "add", facts)
        self.emit("task_arrived", {"task": task.name, "pid": task.pid, "app": task.app})
        return task

    def _derived_or_refuse(self, derived: dict[str, Derived], results: list[dict[str, Any]],
                           method: str) -> dict[str, int]:
        values, errors = self._derived_results(derived, results)
        if errors:
            key, (code, message, data) = next(iter(errors.items()))
            raise RpcError(code, f"{method}: derived {key} ({derived[key].goal}): {message}", data)
        return values

    @staticmethod
    def _derived_results(derived: dict[str, Derived], results: list[dict[str, Any]]
                         ) -> tuple[dict[str, int], dict[str, tuple[int, str, dict[str, Any] | None]]]:
        """Each derived property's value, or why it has none: (code, message, data)."""
        values: dict[str, int] = {}
        errors: dict[str, tuple[int, str, dict[str, Any] | None]] = {}
        for (key, d), result in zip(derived.items(), results):
            if "error" in result:
                err = SKBError(str(result["error"].get("code", "engine")), str(result["error"].get("message", "")),
                               result["error"].get("data") or {})
                rpc_err = skb_rpc_error(err)
                errors[key] = (rpc_err.code, rpc_err.message, rpc_err.data)
            elif "none" in result:
                errors[key] = (rpc.INVALID_PARAMS, "the query has no solution", None)
            else:
                try:
                    values[key] = derived_value(key, result.get("value"))
                except ValueError as err:
                    errors[key] = (rpc.INVALID_PARAMS, str(err), None)
        return values, errors

    async def update_task(self, task: Task, plain: dict[str, Any], derived: dict[str, Derived],
                          conn: Connection | None = None, reason: str | None = None) -> None:
        """New properties for ``task`` (derived ones evaluated now); refused, it keeps the old ones."""
        values: dict[str, int] = {}
        if derived:
            results = await skb_call(self.skb.evaluate(task.app, Staged(), [(d.goal, d.var) for d in derived.values()]))
            values = self._derived_or_refuse(derived, results, "update_task")
        spec = build_spec(task.name, plain, values, "update_task")
        if conn is not None:
            self.task_refusal(conn, task.name, spec.to_dict())
        properties = {**plain, **{k: d.to_dict() for k, d in derived.items()}}
        await self._respec(task, spec, properties, derived, values, reason or f"task {task.name} changed")

    async def _respec(self, task: Task, spec: TaskSpec, properties: dict[str, Any], derived: dict[str, Derived],
                      values: dict[str, int], reason: str) -> None:
        async with self._alloc_lock:
            specs = [t.spec if t.name != task.name else spec for t in self.registry.tasks.values()]
            plan = await self._plan(specs)
            if plan.cores is None:
                raise self._refusal(spec, plan)
            old = (task.spec, task.properties, task.derived, task.derived_values)
            task.spec, task.properties, task.derived, task.derived_values = spec, properties, dict(derived), values
            try:
                await skb_call(self.skb.replace_system_facts(f"task_property({atom(task.name)}, _, _)",
                                                             self.task_facts(task)[1:]))
            except BaseException:
                task.spec, task.properties, task.derived, task.derived_values = old
                raise
            # Adopted on the epoch state as it is now, with no await in between.
            self.epochs, pub = epochs.adopt(self.epochs, plan.cores, self._now(), self.cfg.revoke_deadline_s,
                                            reason)
            await self._publish(self._adopted(plan, pub))

    def _pin_or_refuse(self, task: Task, cpus: tuple[int, ...]) -> None:
        if not cpus:
            return  # its cores are still being given back by others: it is pinned when it gets them
        try:
            self.enforcer.apply(task.name, task.pids(), cpus, self._mems(cpus))
        except Exception as err:
            self._release(task)
            raise RpcError(rpc.INTERNAL_ERROR if not isinstance(err, OSError) else rpc.PERMISSION_DENIED,
                           f"cannot pin task {task.name!r} (pid {task.pid}): {err}") from None

    def _refusal(self, spec: TaskSpec, plan: Plan, what: str = "task") -> RpcError:
        reserved = sum(t.spec.min_cores for t in self.registry.tasks.values() if t.name != spec.name)
        reserved += sum(d.spec.min_cores for d in self.demands.values() if d.name != spec.name)
        free = max(0, self.n_cpus - reserved)
        return RpcError(
            rpc.ADMISSION_REFUSED,
            f"cannot admit {what} {spec.name!r}: it asks for at least {spec.min_cores} cores, {free} of "
            f"{self.n_cpus} are free" + (f"; the allocator says: {plan.reason}" if plan.reason else ""),
            {"requested": spec.min_cores, "free": free, "available": self.n_cpus, "reason": plan.reason},
        )

    async def remove_task(self, task: Task, reason: str) -> int:
        """The task leaves; returns the generation of the recomputation that gives its cores away."""
        conn = self.registry.connections.get(task.conn_id)
        if conn is not None:
            conn.tasks.discard(task.name)
            if task.auto_subscription is not None:
                self.registry.unsubscribe(conn, task.auto_subscription)
        self.registry.tasks.pop(task.name, None)
        # Recompute first: the others get the cores while the SKB forgets the task.
        gen = self.schedule(f"task {task.name} left")
        await self._forget_task(task, reason)
        return gen

    async def task_exited(self, task: Task, event_ns: int) -> float | None:
        """The task's process exited (a process event): deregister it at once.

        Returns how long after the exit event the other tasks were told of the freed
        cores (ms), or None when nothing changed hands."""
        if self.registry.tasks.get(task.name) is not task:
            return None
        gen = await self.remove_task(task, "exited")
        await self.wait_for(gen)
        if self.last_announce_ns < event_ns:
            return None
        ms = (self.last_announce_ns - event_ns) / 1e6
        log.info("task %s (pid %d) exited: its cores were reassigned %.3f ms after the exit event",
                 task.name, task.pid, ms)
        return ms

    async def _forget_task(self, task: Task, reason: str) -> None:
        self.epochs = epochs.forget(self.epochs, task.name)
        self._release(task)
        name = atom(task.name)
        await self._skb_quietly(self.skb.batch([
            codec.remove_system_facts(f"task({name}, _, _)"),
            codec.remove_system_facts(f"task_property({name}, _, _)"),
            codec.remove_system_facts(f"allocated({name}, _)"),
        ]), f"removing the facts of task {task.name}")
        self.emit("task_left", {"task": task.name, "pid": task.pid, "app": task.app, "reason": reason})
        log.info("task %s (pid %d) left: %s", task.name, task.pid, reason)

    # ---- unregistered busy processes (other_task/3) ---------------------------------------
    def _adopted(self, plan: Plan, pub: Publication) -> Publication:
        """``plan`` is now the current one: keep its reservations for the busy processes (where the
        monitor confines them), and give each task it displaced a reason naming the process."""
        self.last_plan = plan
        changed = False
        for pid, other in list(self.others.items()):
            cpus = plan.reservations.get(other_task_name(pid))
            if cpus is not None and cpus != other.cpus:
                self.others[pid] = dataclasses.replace(other, cpus=cpus)
                changed = True
        if changed:
            self._spawn(self._skb_quietly(self.skb.replace_system_facts("other_task(_, _, _)", self._other_facts()),
                                          "writing other_task facts"))
        reasons = {}
        for task, names in plan.displaced_by.items():
            who = []
            for name in names:
                pid = other_pid(name)
                other = self.others.get(pid) if pid is not None else None
                who.append(f"busy process {pid} ({other.comm})" if other else name)
            reasons[task] = f"{' and '.join(who)} took CPUs of task {task} (no free or less costly CPU was left)"
        return dataclasses.replace(pub, task_reasons=reasons) if reasons else pub

    def _other_facts(self) -> list[str]:
        return [f"other_task({o.pid}, {atom(o.comm)}, {term(list(o.cpus))})" for _, o in sorted(self.others.items())]

    async def set_others(self, others: dict[int, OtherTask], why: str) -> int:
        """Record the unregistered busy processes in the SKB, tell subscribers, recompute."""
        added = sorted(set(others) - set(self.others))
        self.others = dict(others)
        gen = self.schedule(why)
        await self._skb_quietly(self.skb.replace_system_facts("other_task(_, _, _)", self._other_facts()),
                                "writing other_task facts")
        self.changed(None)
        self.emit("facts_changed", {"scope": "system", "app": None, "op": "add" if added else "remove",
                                    "predicates": ["other_task"]})
        return gen

    # ---- recomputation ---------------------------------------------------------------------
    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    async def _plan(self, specs: list[TaskSpec], prefer: dict[str, tuple[int, ...]] | None = None) -> Plan:
        current = self.epochs.holdings()
        # Elastic groups are planned beside the tasks, placed where they are (or where they want to be).
        specs = [*specs, *(d.spec for d in self.demands.values())]
        current.update({name: d.preferred() for name, d in self.demands.items()})
        current.update(prefer or {})
        return await self.planner.run(specs, current, [o.demand() for _, o in sorted(self.others.items())])

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
                    self.epochs, pub = epochs.adopt(self.epochs, plan.cores, self._now(),
                                                    self.cfg.revoke_deadline_s, reason)
                    await self._publish(self._adopted(plan, pub))
                await self._mark_done(target)

    async def _mark_done(self, gen: int) -> None:
        async with self._gen_changed:
            self._done_gen = max(self._done_gen, gen)
            self._gen_changed.notify_all()

    # ---- acknowledgements and deadlines: never wait for anything --------------------------
    def acknowledge(self, task: Task, epoch: int) -> list[int]:
        return self._acknowledge(task.name, epoch)

    def _acknowledge(self, name: str, epoch: int) -> list[int]:
        self.epochs, released, pub = epochs.acknowledge(self.epochs, name, epoch, self._now())
        if not pub.empty:
            self._queue(pub)
        return list(released)

    def _arm_deadline(self, when: float | None) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        if when is not None and not self.closing:
            self._deadline_timer = asyncio.get_running_loop().call_at(when, self._on_deadline)

    def _on_deadline(self) -> None:
        self._deadline_timer = None
        self.epochs, pub = epochs.expire(self.epochs, self._now())
        if pub.empty:
            self._arm_deadline(self.epochs.next_deadline())
        else:
            log.info("a task did not release its CPUs in time; reassigning them")
            self._queue(pub)

    # ---- carrying out publications --------------------------------------------------------
    def _queue(self, pub: Publication, already_pinned: dict[str, tuple[int, ...]] | None = None) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._publications.put_nowait(_Queued(pub if not already_pinned else _without_pins(pub, already_pinned), done))
        return done

    async def _publish(self, pub: Publication, already_pinned: dict[str, tuple[int, ...]] | None = None) -> None:
        await self._queue(pub, already_pinned)

    async def _publish_loop(self) -> None:
        while True:
            item = await self._publications.get()
            if item is None:
                return
            try:
                await self._carry_out(item.pub)
            except Exception:
                log.exception("publishing epoch %s failed", item.pub.epoch)
            finally:
                if not item.done.done():
                    item.done.set_result(None)

    async def _carry_out(self, pub: Publication) -> None:
        """Pins first, then the SKB, then the upcalls: a query sent after an upcall sees its allocation."""
        for name, cores in pub.repin.items():
            task = self.registry.tasks.get(name)
            if task is not None:
                self._pin(task, cores)
            elif name in self.demands:
                self._pin_demand(self.demands[name], cores)
        self._arm_deadline(pub.next_deadline)
        if not pub.empty:
            facts = [f"allocated({atom(n)}, {c})" for n, cores in sorted(pub.holdings.items()) for c in cores]
            await self._skb_quietly(
                self.skb.replace_many({"allocated(_, _)": facts, "allocation_epoch(_)": [f"allocation_epoch({pub.epoch})"]}),
                f"writing allocation epoch {pub.epoch} into the SKB")
            self.last_announce_ns = time.monotonic_ns()
            for change in pub.changes:
                task = self.registry.tasks.get(change.task)
                if task is None:
                    continue
                payload = self.allocation_of(task)
                payload.update(added=list(change.added), removed=list(change.removed),
                               reason=pub.task_reasons.get(change.task, pub.reason))
                if change.deadline_s is not None:
                    payload["deadline_s"] = change.deadline_s
                self.emit("allocation_changed", payload)
            if self.conditions.conditions:
                self._conditions_only_soon()
            # A group the daemon drives has no client to ask: it gives back what the plan takes at once.
            for change in pub.changes:
                if change.removed and change.task in self.demands:
                    self._acknowledge(change.task, pub.epoch or self.epochs.epoch)
            log.info("epoch %d (%s): %s", pub.epoch, pub.reason,
                     ", ".join(f"{c.task}={epochs.ranges(c.cores)}" for c in pub.changes) or "holdings changed")
        for hook in self.on_published:
            try:
                hook()
            except Exception:
                log.exception("after publishing an allocation")

    # ---- enforcement -----------------------------------------------------------------------
    def _mems(self, cpus: Iterable[int]) -> tuple[int, ...]:
        return tuple(sorted({n for c in cpus if (n := self._node_of.get(c)) is not None}))

    def _pin(self, task: Task, cpus: tuple[int, ...]) -> None:
        if self.closing:  # close() releases every task; nothing may be pinned after it
            return
        if not cpus:
            log.debug("task %s holds no CPU yet; not pinning it", task.name)
            return
        try:
            live = self.enforcer.apply(task.name, task.pids(), cpus, self._mems(cpus))
            task.children.intersection_update(live)
        except Exception as err:
            log.warning("enforcing the allocation of %s (pid %d) failed: %s", task.name, task.pid, err)
            return
        if task.deployment is not None:
            self.deploy_threads(task)  # apply() gave every thread the whole set

    def deploy_threads(self, task: Task) -> Matching | None:
        """Narrow the task's named operator threads to their CPUs of its deployment (issue 17).

        Called after every pin of the task (which gives every thread the whole
        set again), on thread-name events, and on the live-state refresh (for
        threads named later, and when events are polled)."""
        dep = task.deployment
        if dep is None or self.closing:
            return None
        held = set(self.holdings_of(task.name))
        cpus = [c for c in self.epochs.announced.get(task.name, ()) if c in held]
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
            try:
                self.enforcer.pin_threads(task.name, todo)
            except Exception as err:
                log.warning("pinning the operator threads of %s: %s", task.name, err)
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
        await self.update_task(task, plain, derived, conn, reason=f"task {task.name} deployed a plan of {need} cores")
        task.deployment = Deployment(plan)
        matching = self.deploy_threads(task)
        return {"task": task.name, "min_cores": need, "cores": plan.cores, "cores_optimal": plan.cores_optimal,
                "numa_nodes": list(plan.numa.nodes), "placement": dict(task.deployment.placement),
                "threads": {str(t): c for t, c in sorted(matching.targets.items())} if matching else {},
                "unmatched": list(matching.unmatched) if matching else sorted(plan.placement),
                "problem": task.deployment.problem, "warnings": list(plan.warnings),
                "allocation": self.allocation_of(task)}

    def _release(self, task: Task) -> None:
        try:
            self.enforcer.release(task.name)
        except Exception as err:
            log.warning("releasing %s (pid %d) failed: %s", task.name, task.pid, err)

    def _pin_demand(self, demand: Demand, cpus: tuple[int, ...]) -> None:
        if self.closing:
            return
        try:
            demand.pin(cpus)
        except Exception as err:
            log.warning("enforcing the allocation of elastic group %s failed: %s", demand.name, err)

    # ---- elastic groups (rm/unmanaged.py drives them; here they join and leave the allocation) ---
    async def admit_demand(self, demand: Demand, facts: Callable[[tuple[int, ...]], dict[str, list[str]]]
                           ) -> tuple[int, ...]:
        """Admit a group as register_task admits a task, all or nothing: plan with it (refused:
        -32030), pin it to what it gets now, write its SKB facts (``facts(grant)``, one
        transaction), commit and publish.  Returns its CPUs now (() while others give them back)."""
        name = demand.name
        async with self._alloc_lock:
            if name in self.registry.tasks or name in self.demands:
                raise RpcError(rpc.ALREADY_EXISTS, f"a task or elastic group named {name!r} is already registered")
            plan = await self._plan([t.spec for t in self.registry.tasks.values()] + [demand.spec],
                                    prefer={name: demand.preferred()})
            if plan.cores is None:
                raise self._refusal(demand.spec, plan, "elastic group")
            reason = f"elastic group {name} arrived"
            _, trial = epochs.adopt(epochs.add_task(self.epochs, name), plan.cores, self._now(),
                                    self.cfg.revoke_deadline_s, reason)
            grant = trial.holdings.get(name, ())
            try:
                demand.pin(grant)
                await skb_call(self.skb.replace_many(facts(grant)))
            except BaseException:
                demand.release()
                raise
            new_state, pub = epochs.adopt(epochs.add_task(self.epochs, name), plan.cores, self._now(),
                                          self.cfg.revoke_deadline_s, reason)
            self.demands[name] = demand
            self.epochs = new_state
            await self._publish(self._adopted(plan, pub), already_pinned={name: grant} if grant else None)
        return grant

    async def forget_demand(self, name: str, reason: str, patterns: Iterable[str] = ()) -> None:
        """The group leaves: it holds nothing, its processes get their affinity back, the others
        get its CPUs, and its SKB facts (``allocated/2`` and ``patterns``) go."""
        demand = self.demands.pop(name, None)
        if demand is None:
            return
        self.epochs = epochs.forget(self.epochs, name)
        try:
            demand.release()
        except Exception as err:
            log.warning("releasing elastic group %s failed: %s", name, err)
        self.schedule(f"elastic group {name} left")
        await self._skb_quietly(self.skb.replace_many({f"allocated({atom(name)}, _)": [],
                                                       **{p: [] for p in patterns}}),
                                f"removing the facts of elastic group {name}")
        log.info("elastic group %s left: %s", name, reason)

    def holdings_of(self, name: str) -> tuple[int, ...]:
        """CPUs task ``name`` may run on now (announced plus those it has yet to give back)."""
        return self.epochs.holdings().get(name, ())

    def reapply_all(self) -> None:
        """Pin every task again (after lost process events: threads may have been missed)."""
        held = self.epochs.holdings()
        for task in list(self.registry.tasks.values()):
            self._pin(task, held.get(task.name, ()))

    # ---- reports ---------------------------------------------------------------------------
    def plan_summary(self) -> dict[str, Any]:
        """How the current plan was made: solver, status, time, and the CPUs kept for other work."""
        plan = self.last_plan
        return {
            "solver": plan.solver if plan else "none",
            "status": plan.status if plan else None,
            "solve_ms": round(plan.solve_ms, 3) if plan else None,
            "proof": plan.proof if plan else "",
            "unavailable": list(plan.unavailable) if plan else [],
        }

    def allocation_of(self, task: Task) -> dict[str, Any]:
        cores = tuple(self.epochs.announced.get(task.name, ()))
        nodes = sorted({n for c in cores if (n := self._node_of.get(c)) is not None})
        mems = [n for n in nodes if self._allowed_mems is None or n in self._allowed_mems]
        return {
            "task": task.name,
            "app": task.app,
            "epoch": self.epochs.announced_epoch.get(task.name, 0),
            "cores": list(cores),
            "numa_nodes": nodes,
            "memory_nodes": mems,
            "releasing": list(self.epochs.releasing(task.name)),
            "binding": list(self.last_plan.binding.get(task.name, ())) if self.last_plan else [],
        }

    # ---- shutdown --------------------------------------------------------------------------
    async def close(self) -> None:
        self.closing = True
        if self._periodic_task is not None:
            self._periodic_task.cancel()
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
            for task in list(self.registry.tasks.values()):
                self._release(task)
            for demand in list(self.demands.values()):
                try:
                    demand.release()
                except Exception as err:
                    log.warning("releasing elastic group %s failed: %s", demand.name, err)
        finally:
            if locked:
                self._alloc_lock.release()
        self._publications.put_nowait(None)
        try:
            await asyncio.wait_for(self._publisher, CLOSE_WAIT_S)
        except (TimeoutError, asyncio.CancelledError):
            self._publisher.cancel()
        self.planner.close()


def _mask(tid: int) -> set[int] | None:
    try:
        return os.sched_getaffinity(tid)
    except OSError:
        return None  # gone


def _without_pins(pub: Publication, pinned: dict[str, tuple[int, ...]]) -> Publication:
    """``pub`` without the pins already done (the newcomer was pinned before the SKB write)."""
    from dataclasses import replace

    return replace(pub, repin={n: c for n, c in pub.repin.items() if pinned.get(n) != c})

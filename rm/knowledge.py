"""The knowledge side: what applications write into the SKB and ask of it, and what is derived from it.

* **Facts and procedures** of an application (``add_facts``, ``add_procedure``,
  ``remove_facts``), within its quotas (:mod:`.quotas`); system facts for the
  privileged.  Writes of one uid are serialised, so two at once cannot pass its quota.
  Each is answered within its time: its outcome, or OUTCOME_UNKNOWN while the SKB has
  not answered, and it then goes on in the background to its true outcome, with the
  events and re-derivations it brings (a failure is never reported for a write that
  may still be applied; :mod:`.write_keys` lets a retry learn the outcome).
* **Queries** (``execute_query``, ``cancel``, the listings).
* **What is derived from the SKB**, evaluated again whenever what it reads
  changes (:meth:`Knowledge.changed`): derived task properties (a change
  becomes an update of the task, :mod:`.admission`) and condition
  subscriptions (:mod:`.conditions` decides when to notify).  Each application
  is evaluated in rounds of its own (one SKB call, for its owner's uid, under
  ``condition_round_s``): one application's slow conditions delay only its own
  upcalls, and the SKB's per-uid shares keep one uid's rounds from taking the
  threads of the others.

The allocation's own facts are not written here: the publisher writes them
(:mod:`.publisher`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Iterable

from cod.protocol import jsonrpc as rpc
from cod.protocol.jsonrpc import RpcError
from cod.skb import PERSISTENT, OutcomeUnknown, SKBError, Staged
from cod.skb.session import WATCHDOG_GRACE_S

from . import quotas
from .conditions import Condition, ConditionWatch, step
from .config import RMConfig
from .events import Events, Jobs
from .registry import Connection, Registry, Task, Usage
from .taskprops import Derived, build_spec, derived_value
from .write_keys import KeyLimits, WriteKeys, WriteUnsettled

log = logging.getLogger("cod.rm")


def skb_rpc_error(err: SKBError) -> RpcError:
    data = dict(err.data or {})
    data["skb_code"] = err.code
    if err.code == "quota":
        return RpcError(rpc.QUOTA_EXCEEDED, err.message, data)
    return RpcError(rpc.skb_error_code(err.code), err.message, data)


async def skb_call(awaitable: Any) -> Any:
    """Await an SKB call, turning its SKBError into the protocol's error reply."""
    try:
        return await awaitable
    except SKBError as err:
        raise skb_rpc_error(err) from None


async def skb_write(awaitable: Any, wait_s: float) -> Any:
    """Await an SKB write to its true outcome: its result, or the protocol's error of a write that
    will never be applied.  One the engine did not answer in time is waited for ``wait_s`` more
    (until it answers, or a restart of the engine settles it); after that its outcome is
    OUTCOME_UNKNOWN for good."""
    try:
        return await awaitable
    except OutcomeUnknown as err:
        try:
            return await asyncio.wait_for(asyncio.shield(err.outcome), wait_s)
        except TimeoutError:
            raise RpcError(rpc.OUTCOME_UNKNOWN, f"the SKB did not answer the write even {wait_s:g} s later; "
                                                "it may still be applied") from None
        except SKBError as late:  # it never will be: the engine was restarted without it
            err = skb_rpc_error(late)
            raise RpcError(err.code, f"the write was not applied: {err.message}", err.data) from None
    except SKBError as err:
        raise skb_rpc_error(err) from None


async def skb_quietly(awaitable: Any, what: str) -> Any:
    """Await an SKB call whose failure is only logged (None then)."""
    try:
        return await awaitable
    except SKBError as err:
        log.warning("%s: %s", what, err)
        return None


def query_tag(conn: Connection) -> str:
    """Whom the SKB runs a query for, so that ``cancel`` stops exactly this connection's queries:
    its capability token (which its direct channel's queries carry too), or its id."""
    return conn.token if conn.token is not None else f"conn{conn.id}"


def app_of(conn: Connection) -> str:
    assert conn.app is not None, "handlers only call the service after hello"
    return conn.app


Errors = dict[str, tuple[int, str, dict[str, Any] | None]]


def derived_results(derived: dict[str, Derived], results: list[dict[str, Any]]) -> tuple[dict[str, int], Errors]:
    """Each derived property's value, or why it has none: (code, message, data)."""
    values: dict[str, int] = {}
    errors: Errors = {}
    for (key, d), result in zip(derived.items(), results):
        if "skipped" in result:
            continue  # its round ran out of time before it: the last value stands until the next
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


def derived_or_refuse(derived: dict[str, Derived], results: list[dict[str, Any]], method: str) -> dict[str, int]:
    values, errors = derived_results(derived, results)
    if errors:
        key, (code, message, data) = next(iter(errors.items()))
        raise RpcError(code, f"{method}: derived {key} ({derived[key].goal}): {message}", data)
    return values


Respec = Callable[[Task, Any, dict[str, Any], dict[str, Derived], dict[str, int], str], Awaitable[None]]


class Knowledge:
    def __init__(self, cfg: RMConfig, skb: Any, registry: Registry, events: Events, jobs: Jobs) -> None:
        self.cfg = cfg
        self.skb = skb
        self.registry = registry
        self.events = events
        self.jobs = jobs
        self.conditions = ConditionWatch()
        self.schedule: Callable[[str], int] = lambda reason: 0  # a recomputation (cod.rm.admission)
        self.respec: Respec | None = None  # new properties for a task (cod.rm.admission)
        self.privileged_uid: Callable[[int], bool] = lambda uid: uid == 0  # (cod.rm.sessions)
        self.closing = False
        self._uid_locks: dict[int, asyncio.Lock] = {}
        self._pending: dict[str, bool] = {}  # application -> its next round (True: derived properties too)
        self._rounds: dict[str, asyncio.Task[None]] = {}  # application -> the task running its rounds
        # A write is answered within the time a request had before (the SKB's own time-out).
        self.answer_s = cfg.query_timeout_s + WATCHDOG_GRACE_S
        self.write_keys = WriteKeys(KeyLimits(cfg.write_keys_per_connection, cfg.write_key_bytes_per_connection,
                                              cfg.write_key_ttl_s))
        self._writes: set[asyncio.Task[Any]] = set()  # writes under way, kept referenced
        self._unsettled: dict[int, set[asyncio.Task[Any]]] = {}  # per uid: those answered OUTCOME_UNKNOWN

    def uid_lock(self, uid: int) -> asyncio.Lock:
        """Writes of one uid are serialised, so its quota cannot be passed by two at once."""
        lock = self._uid_locks.get(uid)
        if lock is None:
            lock = self._uid_locks[uid] = asyncio.Lock()
        return lock

    # ---- facts and procedures ------------------------------------------------------------------
    async def in_time(self, method: str, conn: Connection, write: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``write()`` to its true outcome, in the background when need be; answered within
        ``answer_s``: its outcome, or WriteUnsettled (OUTCOME_UNKNOWN) carrying the outcome to come.
        The uid's lock keeps the writes of a uid, and a connection's cleanup, in order meanwhile.
        A uid holds at most ``max_unsettled_writes_per_uid`` such writes: one more is refused, unsent."""
        uid = conn.peer.uid
        unsettled = self._unsettled.setdefault(uid, set())
        if len(unsettled) >= self.cfg.max_unsettled_writes_per_uid:
            raise RpcError(rpc.QUOTA_EXCEEDED, f"{method}: uid {uid} has {len(unsettled)} writes whose outcome is not "
                                               "known yet (the SKB is not answering); this one was not sent "
                                               "(max_unsettled_writes_per_uid)",
                           {"quota": "max_unsettled_writes_per_uid", "limit": self.cfg.max_unsettled_writes_per_uid})
        task = asyncio.ensure_future(write())
        self._writes.add(task)
        task.add_done_callback(self._write_done)
        await asyncio.wait({task}, timeout=self.answer_s)
        if task.done():
            return task.result()
        unsettled.add(task)
        task.add_done_callback(unsettled.discard)
        raise WriteUnsettled(f"{method}: the SKB did not answer within {self.answer_s:g} s; the write may still "
                             "be applied", task)

    def _write_done(self, task: "asyncio.Task[Any]") -> None:
        self._writes.discard(task)
        if not task.cancelled() and task.exception() is not None and not isinstance(task.exception(), RpcError):
            log.error("a write failed inside the daemon: %r", task.exception())

    def _wait_s(self) -> float:
        return self.cfg.write_outcome_wait_s

    async def add_facts(self, conn: Connection, facts: list[str], *, system: bool, persistent: bool) -> int:
        """Its whole course, however long the SKB takes (a handler answers in time with :meth:`in_time`)."""
        async with self.uid_lock(conn.peer.uid):
            if system:
                n = await skb_write(self.skb.add_system_facts(facts), self._wait_s())
            else:
                app = app_of(conn)
                limits = quotas.write_limits(self.cfg, self.registry, app, conn.peer.uid)
                owner = PERSISTENT if persistent else conn.id
                reply = await skb_write(self.skb.add_facts(app, owner, facts, limits), self._wait_s())
                self.registry.usage[app] = Usage.from_reply(reply.get("usage"))
        if system:
            self._system_changed("add", facts)
            return int(n)
        self.events.facts_changed(app, "add", facts)
        self.changed({app})
        return int(reply["added"])

    def _system_changed(self, op: str, facts: Iterable[str]) -> None:
        self.events.facts_changed(None, op, facts)
        self.schedule("system facts changed")
        self.changed(None)

    async def remove_facts(self, conn: Connection, patterns: list[str], *, system: bool) -> int:
        # Under the uid's lock too: behind a write of the same uid still going on, in the order sent.
        async with self.uid_lock(conn.peer.uid):
            if system:
                removed = 0
                for pattern in patterns:
                    removed += await skb_write(self.skb.remove_system_facts(pattern), self._wait_s())
            else:
                app = app_of(conn)
                reply = await skb_write(self.skb.remove_facts(app, patterns), self._wait_s())
                self.registry.usage[app] = Usage.from_reply(reply.get("usage"))
                removed = int(reply["removed"])
        if removed and system:
            self._system_changed("remove", patterns)
        elif removed:
            self.events.facts_changed(app, "remove", patterns)
            self.changed({app})
        return removed

    async def add_procedure(self, conn: Connection, text: str, *, persistent: bool) -> list[str]:
        app = app_of(conn)
        async with self.uid_lock(conn.peer.uid):
            limits = quotas.write_limits(self.cfg, self.registry, app, conn.peer.uid)
            reply = await skb_write(self.skb.add_procedure(app, text, persistent, limits), self._wait_s())
            self.registry.usage[app] = Usage.from_reply(reply.get("usage"))
        self.changed({app})
        return list(reply["predicates"])

    async def write_live_state(self, changed: dict[str, list[str]]) -> None:
        """The monitor's measurements (loads, free memory, pages): one change, then re-derive."""
        await self.skb.replace_many(changed)
        self.changed(None)  # conditions and derived properties may read the live state

    # ---- queries -------------------------------------------------------------------------------
    async def execute_query(self, conn: Connection, goal: str, *, all_solutions: bool, max_solutions: int,
                            timeout_s: float) -> list[dict[str, Any]]:
        answer = await skb_call(self.skb.query(app_of(conn), goal, all_solutions=all_solutions,
                                               max_solutions=max_solutions, timeout_s=timeout_s,
                                               tag=query_tag(conn), client=(conn.peer.uid, conn.privileged)))
        return list(answer["solutions"])

    async def cancel(self, conn: Connection) -> int:
        """Stop the connection's running queries, on both roads (this socket and its direct channel)."""
        return int(await skb_call(self.skb.cancel(query_tag(conn))))

    async def describe_app(self, app: str) -> dict[str, Any]:
        return await skb_call(self.skb.describe_app(app))

    async def predicates(self, conn: Connection, kind: str) -> list[dict[str, Any]]:
        return await skb_call(self.skb.predicates(app_of(conn), kind))

    async def evaluate(self, app: str, staged: Staged, derived: dict[str, Derived], method: str) -> dict[str, int]:
        """The values of ``derived`` as the namespace would be after ``staged``; refused with the first error."""
        results = await skb_call(self.skb.evaluate(app, staged, [(d.goal, d.var) for d in derived.values()]))
        return derived_or_refuse(derived, results, method)

    # ---- what is derived from the SKB: task properties and conditions ---------------------------
    def changed(self, apps: set[str] | None) -> None:
        """What the SKB holds changed for ``apps`` (None: system facts or live state, so everyone's):
        derived task properties and condition subscriptions of those applications are evaluated
        again, soon, all of one application in one SKB call."""
        watched = {t.app for t in self.registry.tasks.values() if t.derived} | self.conditions.apps()
        self._evaluate_again(watched if apps is None else watched & apps, derived=True)

    def _evaluate_again(self, apps: set[str], *, derived: bool) -> None:
        """A round for each of ``apps``: now, or after the round it is in (never two at once)."""
        if self.closing:
            return
        loop = asyncio.get_running_loop()
        for app in sorted(apps):
            self._pending[app] = derived or self._pending.get(app, False)
            if app not in self._rounds:
                self._rounds[app] = loop.create_task(self._rounds_of(app))

    async def _rounds_of(self, app: str) -> None:
        """The rounds of one application, one after another, until none is pending."""
        try:
            while not self.closing and app in self._pending:
                derived = self._pending.pop(app)
                try:
                    await self._derive_app(app, derived)
                except Exception:
                    log.exception("evaluating the conditions and derived properties of %s", app)
        finally:
            self._rounds.pop(app, None)

    def _client_of(self, app: str) -> tuple[int, bool] | None:
        """Whom an application's rounds run for in the SKB: its owner (None: nobody owns it)."""
        owner = self.registry.app_owner.get(app)
        return None if owner is None else (owner, self.privileged_uid(owner))

    async def _derive_app(self, app: str, derived: bool) -> None:
        tasks = [t for t in self.registry.tasks.values() if t.app == app and t.derived] if derived else []
        conds = self.conditions.of_app(app)
        queries: list[tuple[str, str | None]] = [(d.goal, d.var) for t in tasks for d in t.derived.values()]
        queries += [(c.goal, None) for c in conds]
        if not queries:
            return
        try:
            results = await self.skb.evaluate(app, Staged(), queries, timeout_s=self.cfg.condition_timeout_s,
                                              round_limit_s=self.cfg.condition_round_s, client=self._client_of(app))
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
        if self.registry.tasks.get(task.name) is not task or self.respec is None:
            return
        values, errors = derived_results(task.derived, results)
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
            await self.respec(task, spec, task.properties, task.derived, new,
                              f"derived properties of {task.name} changed: {changes}")
        except RpcError as err:
            self._warn(task, ",".join(sorted(values)), f"derived properties ({changes}) not applied: {err.message}")

    def _warn(self, task: Task, key: str, reason: str) -> None:
        log.warning("task %s: %s; it keeps its last values", task.name, reason)
        self.events.emit("task_warning", {"task": task.name, "app": task.app, "property": key, "reason": reason,
                                          "kept": dict(task.derived_values)})

    # ---- conditions ------------------------------------------------------------------------------
    def _condition_result(self, cond: Condition, result: dict[str, Any]) -> None:
        if cond.sub_id not in self.conditions.conditions:
            return  # unsubscribed meanwhile
        outcome = step(cond, result)
        if outcome.drop is not None:
            del self.conditions.conditions[cond.sub_id]
            conn = self.registry.connections.get(cond.conn_id)
            if conn is not None:
                self.registry.unsubscribe(conn, cond.sub_id)
                self.events.send(conn.id, "subscription_dropped", {
                    "subscription": cond.sub_id, "event": "subscription_dropped", "goal": cond.goal,
                    "reason": outcome.drop})
            log.info("condition %d (%s) dropped: %s", cond.sub_id, cond.goal, outcome.drop)
        elif outcome.notify is not None:
            self.events.send(cond.conn_id, "condition", {"subscription": cond.sub_id, **outcome.notify})

    async def add_condition(self, conn: Connection, goal: str) -> int:
        """Subscribe ``conn`` to ``goal`` turning true and false; a goal that cannot run is refused now."""
        app = app_of(conn)
        [result] = await skb_call(self.skb.evaluate(app, Staged(), [(goal, None)],
                                                    timeout_s=self.cfg.condition_timeout_s,
                                                    client=(conn.peer.uid, conn.privileged)))
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

    def forget_connection(self, conn_id: int) -> None:
        self.conditions.forget_connection(conn_id)
        self.write_keys.forget(conn_id)

    def allocation_changed(self) -> None:
        """The allocation changed: conditions may read it (derived properties do not follow it,
        which would feed the allocation back into itself)."""
        self._evaluate_again(self.conditions.apps(), derived=False)

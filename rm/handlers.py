"""The protocol's methods: check params and permissions, then ask the ResourceManager.

Each handler takes (rm, conn, params) and returns the JSON ``result``, or
raises RpcError.  Handlers never change state themselves: every change goes
through the part of :class:`cod.rm.service.ResourceManager` that owns it
(``rm.sessions``, ``rm.knowledge``, ``rm.admission``, ``rm.publisher``,
``rm.query_plans``, ``rm.demands``).  The table
:data:`METHODS` is the protocol (docs/protocol.md); its names are
:data:`cod.protocol.jsonrpc.METHODS`.
"""

from __future__ import annotations

import math
from typing import Any, Awaitable, Callable

from cod.facts import procfs
from cod.protocol import jsonrpc as rpc
from cod.protocol.jsonrpc import (
    ALREADY_EXISTS,
    EVENTS,
    FILTER_KEYS,
    HELLO_REQUIRED,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    NOT_FOUND,
    PERMISSION_DENIED,
    PROTOCOL_VERSION,
    SHUTTING_DOWN,
    UNSUPPORTED_VERSION,
    Params,
    Request,
    RpcError,
)
from cod.rm.elastic.group import CgroupGroup
from cod.skb.codec import PREDICATE_KINDS

from .registry import Connection, Task
from .names import looks_like_other, name_problem
from .elastic_groups import SETTING_KEYS, owner_of
from .service import ResourceManager
from .taskprops import split_properties

SERVER_NAME = "cod-rm/0.2"
MAX_QUERY_SOLUTIONS = 10_000

Handler = Callable[[ResourceManager, Connection, Params], Awaitable[Any]]


def _name(method: str, what: str, value: Any) -> str:
    problem = name_problem(value)
    if problem is not None:
        raise RpcError(INVALID_PARAMS, f"{method}: {what} {value!r} {problem}")
    return value


def _proc_owner(pid: int) -> int:
    """Real uid of process `pid`, from /proc."""
    uid = procfs.real_uid(pid)
    if uid is None:
        raise RpcError(NOT_FOUND, f"no process with pid {pid}")
    return uid


def _task_for(rm: ResourceManager, conn: Connection, p: Params, *, required: bool = True) -> Task | None:
    """The task a request names, or the connection's only task when it names none."""
    name = p.str("task", None)
    if name is None:
        mine = sorted(conn.tasks)
        if len(mine) == 1:
            return rm.find_task(mine[0])
        if not required:
            return None
        raise RpcError(
            INVALID_PARAMS,
            f"{p.method}: give 'task': this connection has {len(mine)} registered tasks"
            + (f" ({', '.join(mine)})" if mine else ""),
        )
    task = rm.find_task(name)
    if task is None:
        if rm.demands.is_group(name):
            raise RpcError(INVALID_PARAMS, f"{p.method}: {name!r} is an elastic group, not a task "
                                           "(list_tasks shows it under elastic_groups; deregister_unmanaged removes it)")
        raise RpcError(NOT_FOUND, f"no task named {name!r}")
    if task.owner_uid != conn.peer.uid and not conn.privileged:
        raise RpcError(PERMISSION_DENIED, f"task {name!r} belongs to uid {task.owner_uid}")
    return task


def _scope_is_system(rm: ResourceManager, conn: Connection, p: Params) -> bool:
    scope = p.str("scope", "app")
    if scope not in ("app", "system"):
        raise RpcError(INVALID_PARAMS, f"{p.method}: scope must be 'app' or 'system', not {scope!r}")
    if scope == "system" and not conn.privileged:
        raise RpcError(PERMISSION_DENIED, "only root or the daemon's user may change system-level facts")
    return scope == "system"


# ---- session ------------------------------------------------------------------------------------
async def hello(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    version = p.int("version")
    app = p.str("app", None)
    p.str("client", None)
    p.done()
    if version != PROTOCOL_VERSION:
        raise RpcError(UNSUPPORTED_VERSION, f"protocol version {version} is not supported; this daemon speaks {PROTOCOL_VERSION}",
                       {"supported": [PROTOCOL_VERSION]})
    if app is not None:
        _name("hello", "app name", app)
    session = await rm.sessions.hello(conn, app)
    return {
        "protocol": PROTOCOL_VERSION,
        "server": SERVER_NAME,
        "app": session["app"],
        "machine": rm.machine.name,
        "enforce": rm.cfg.enforce,
        "enforce_mode": rm.enforce_mode,
        "peer": {"pid": conn.peer.pid, "uid": conn.peer.uid, "gid": conn.peer.gid},
        "privileged": conn.privileged,
        "epoch": rm.publisher.epoch,
        "methods": sorted(METHODS),
        "events": list(EVENTS),
        "max_frame_bytes": rm.cfg.max_frame_bytes,
        "skb": session["skb"],
    }


# ---- facts and procedures -------------------------------------------------------------------
# Each write is answered in time (Knowledge.in_time): its result, or OUTCOME_UNKNOWN while it goes on.
async def _named(key: str, write: Awaitable[Any]) -> dict[str, Any]:  # the handler's result, when it comes
    return {key: await write}


async def add_facts(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    facts = p.str_list("facts")
    system = _scope_is_system(rm, conn, p)
    persistent = p.bool("persistent", False)
    p.done()
    if not facts:
        return {"added": 0}
    return await rm.knowledge.in_time("add_facts", conn, lambda: _named("added", rm.knowledge.add_facts(
        conn, facts, system=system, persistent=persistent)))


async def remove_facts(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    patterns = p.str_list("patterns")
    system = _scope_is_system(rm, conn, p)
    p.done()
    if not patterns:
        return {"removed": 0}
    return await rm.knowledge.in_time("remove_facts", conn, lambda: _named("removed", rm.knowledge.remove_facts(
        conn, patterns, system=system)))


async def add_procedure(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    text = p.str("text")
    persistent = p.bool("persistent", False)
    p.done()
    return await rm.knowledge.in_time("add_procedure", conn, lambda: _named("predicates", rm.knowledge.add_procedure(
        conn, text, persistent=persistent)))


def query_params(p: Params, ceiling_s: float) -> tuple[str, bool, int, float]:
    goal = p.str("goal")
    all_solutions = p.bool("all_solutions", True)
    max_solutions = p.int("max_solutions", MAX_QUERY_SOLUTIONS)
    timeout_s = p.number("timeout_s", ceiling_s)
    p.done()
    if not 1 <= max_solutions <= MAX_QUERY_SOLUTIONS:
        raise RpcError(INVALID_PARAMS, f"{p.method}: max_solutions must be 1..{MAX_QUERY_SOLUTIONS}")
    if not (isinstance(timeout_s, (int, float)) and math.isfinite(timeout_s) and timeout_s > 0):
        raise RpcError(INVALID_PARAMS, f"{p.method}: timeout_s must be a finite positive number of seconds")
    return goal, all_solutions, max_solutions, min(float(timeout_s), ceiling_s)


async def execute_query(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    goal, all_solutions, max_solutions, timeout_s = query_params(p, rm.cfg.query_timeout_s)
    return {"solutions": await rm.knowledge.execute_query(conn, goal, all_solutions=all_solutions,
                                                 max_solutions=max_solutions, timeout_s=timeout_s)}


async def cancel(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    """Stop this connection's running queries (answered at once, ahead of its earlier requests)."""
    p.done()
    return {"cancelled": await rm.knowledge.cancel(conn)}


# ---- what the SKB holds -----------------------------------------------------------------------
async def list_procedures(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    app = p.str("app", conn.app)
    p.done()
    _name("list_procedures", "application name", app)
    refusal = rm.sessions.name_refusal(conn, app)
    if refusal is not None:
        raise RpcError(PERMISSION_DENIED, f"list_procedures: {refusal}")
    return {"app": app, **await rm.knowledge.describe_app(app)}


async def list_predicates(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    kind = p.str("kind", "all")
    p.done()
    if kind not in PREDICATE_KINDS:
        raise RpcError(INVALID_PARAMS, f"list_predicates: kind must be one of {', '.join(PREDICATE_KINDS)}, "
                                       f"not {kind!r}")
    return {"predicates": await rm.knowledge.predicates(conn, kind)}


async def get_topology(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    p.done()
    enforcement = {"mode": rm.enforce_mode, "in_force": rm.enforcer.describe() if rm.cfg.enforce else "none"}
    warning = rm.enforcer.degraded() if rm.cfg.enforce else None
    if warning is not None:
        enforcement["warning"] = warning
    return {"machine": rm.machine.to_dict(), "enforcement": enforcement}


# ---- tasks ------------------------------------------------------------------------------------
async def register_task(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    name = _name("register_task", "task name", p.str("name"))
    given_pid = p.int("pid", None)
    props = p.dict("properties", {})
    facts = p.str_list("facts", [])
    procedures = p.str_list("procedures", [])
    persistent = p.bool("persistent", False)
    enforced_by = p.str("enforced_by", "daemon")
    p.done()
    pid = _client_enforced_pid(conn, given_pid) if enforced_by == "client" else \
        given_pid if given_pid is not None else conn.peer.pid
    if enforced_by not in ("daemon", "client"):
        raise RpcError(INVALID_PARAMS, f"register_task: enforced_by must be 'daemon' or 'client', not {enforced_by!r}")
    rm.admission.refuse_taken(name)  # again under the allocation lock, where it counts
    if looks_like_other(name):
        raise RpcError(INVALID_PARAMS, f"register_task: task names other.PID (and names that look like them) are the "
                                       f"daemon's names of unregistered busy processes; choose another than {name!r}")
    plain, derived = split_properties(props, "register_task")
    if enforced_by == "daemon":
        owner = _proc_owner(pid)
        if owner != conn.peer.uid and not conn.privileged:
            raise RpcError(PERMISSION_DENIED, f"process {pid} belongs to uid {owner}, not to you (uid {conn.peer.uid})")
        clash = rm.demands.member_clash(pid)
        if clash is not None:  # two pinnings of one process would fight (deregister_unmanaged first)
            raise RpcError(ALREADY_EXISTS, f"register_task: {clash}")
    task = await rm.admission.register(conn, name, pid, plain, derived, facts, procedures, persistent,
                                       enforced_by=enforced_by)
    return {"task": name, "pid": pid, "app": task.app, "subscription": task.auto_subscription,
            "properties": task.spec.to_dict(), "derived": {k: d.to_dict() for k, d in task.derived.items()},
            "allocation": rm.publisher.allocation_of(task)}


def _client_enforced_pid(conn: Connection, given_pid: int | None) -> int:
    """A task a client enforces (a container the NRI plugin creates) has no process: pid 0."""
    if not conn.privileged:
        raise RpcError(PERMISSION_DENIED, "register_task: enforced_by 'client' is for privileged clients "
                                          "(such as the NRI plugin), which carry the allocation out themselves")
    if given_pid is not None:
        raise RpcError(INVALID_PARAMS, "register_task: a task enforced by its client has no process: leave out 'pid'")
    return 0


async def update_task(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    task = _task_for(rm, conn, p)
    assert task is not None
    props = p.dict("properties")
    p.done()
    merged = dict(task.properties)
    merged.update(props)
    plain, derived = split_properties(merged, "update_task")
    await rm.admission.update(task, plain, derived, conn)
    return {"task": task.name, "properties": task.spec.to_dict(),
            "derived": {k: d.to_dict() for k, d in task.derived.items()}, "allocation": rm.publisher.allocation_of(task)}


async def deregister_task(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    task = _task_for(rm, conn, p)
    assert task is not None
    p.done()
    await rm.admission.remove(task, "deregistered")
    return {"task": task.name}


async def deploy_plan(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    task = _task_for(rm, conn, p)
    assert task is not None
    graph = p.dict("graph")
    p.done()
    return await rm.query_plans.deploy_plan(task, graph, conn)


async def request_allocation(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    task = _task_for(rm, conn, p)
    assert task is not None
    p.done()
    await rm.admission.wait_for(rm.admission.schedule(f"requested by {task.name}"))
    if rm.closing:
        raise RpcError(SHUTTING_DOWN, "the RM is shutting down")
    if rm.find_task(task.name) is None:
        raise RpcError(NOT_FOUND, f"task {task.name!r} left")
    return rm.publisher.allocation_of(task)


async def ack_allocation(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    task = _task_for(rm, conn, p)
    assert task is not None
    epoch = p.int("epoch")
    p.done()
    released = rm.publisher.acknowledge(task.name, epoch)
    return {"task": task.name, "epoch": rm.publisher.epoch, "released": released}


async def get_allocation(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    task = _task_for(rm, conn, p, required=False)
    p.done()
    if task is not None:
        return rm.publisher.allocation_of(task)
    return rm.allocations()


async def explain_task(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    name = p.str("task")
    p.done()
    task = rm.find_task(name)
    if task is None:
        raise RpcError(NOT_FOUND, f"no task named {name!r}")
    return rm.explain(task)


async def list_tasks(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    p.done()
    return rm.list_tasks()


# ---- elastic groups (processes that do not speak COD; rm/elastic_groups.py) ---------------------------
def _unmanaged(rm: ResourceManager, method: str) -> Any:
    if rm.demands.elastic is None:
        raise RpcError(INVALID_PARAMS, f"{method}: this daemon does not enforce allocations (planning only), "
                                       "so it cannot give elastic groups their cores")
    return rm.demands.elastic


def _group_source(p: Params) -> tuple[list[int] | None, str | None]:
    """The pids or the cgroup a request names (exactly one of pid, pids, cgroup)."""
    pid = p.int("pid", None)
    pids = p._get("pids", (list,), None, "a list of process ids")
    cgroup = p.str("cgroup", None)
    if sum(x is not None for x in (pid, pids, cgroup)) != 1:
        raise RpcError(INVALID_PARAMS, f"{p.method}: give exactly one of 'pid', 'pids' or 'cgroup'")
    if pids is not None:
        if not pids or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in pids):
            raise RpcError(INVALID_PARAMS, f"{p.method}: 'pids' must be a non-empty list of process ids")
    elif pid is not None:
        if pid <= 0:
            raise RpcError(INVALID_PARAMS, f"{p.method}: {pid} is not a process id")
        pids = [pid]
    if cgroup is not None and not cgroup.startswith("/"):
        raise RpcError(INVALID_PARAMS, f"{p.method}: 'cgroup' must be an absolute path, not {cgroup!r}")
    return pids, cgroup


def _check_cgroup_owner(conn: Connection, group: Any) -> None:
    """An unprivileged peer registers only a cgroup delegated to it: the directory the group holds
    open is owned by its uid (`owner_of` reads the same descriptor, never the path again)."""
    if conn.privileged or not isinstance(group, CgroupGroup):
        return
    owner = owner_of(group)
    if owner is None:
        raise RpcError(NOT_FOUND, f"register_unmanaged: cgroup {group.path} is gone")
    if owner != conn.peer.uid:
        raise RpcError(PERMISSION_DENIED, f"cgroup {group.path} belongs to uid {owner}: an unprivileged uid may "
                                          f"register only a cgroup delegated to it (owned by uid {conn.peer.uid})")


async def register_unmanaged(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    groups = _unmanaged(rm, "register_unmanaged")
    name = p.str("name", None)
    if name is not None:
        _name("register_unmanaged", "group name", name)
    pids, cgroup = _group_source(p)
    typed = {"mode": p.str, "metric": p.str, "min_cores": p.int, "max_cores": p.int, "th_min": p.number,
             "th_max": p.number, "period_s": p.number}
    assert set(typed) == set(SETTING_KEYS)
    raw = {k: v for k, get in typed.items() if (v := get(k, None)) is not None}
    p.done()
    settings = groups.settings_from(raw)
    # A uid manages its own processes; a cgroup only if privileged or the cgroup is delegated to it.
    for pid in pids or ():
        owner = _proc_owner(pid)  # NOT_FOUND for a process that does not exist
        if owner != conn.peer.uid and not conn.privileged:
            raise RpcError(PERMISSION_DENIED, f"process {pid} belongs to uid {owner}, not to you (uid {conn.peer.uid})")
    group = groups.open(pids, cgroup)  # a cgroup's directory is opened once, here, and held
    try:
        _check_cgroup_owner(conn, group)
    except BaseException:
        group.close()
        raise
    return await groups.register(conn, name, group, settings)


async def deregister_unmanaged(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    groups = _unmanaged(rm, "deregister_unmanaged")
    name = p.str("name", None)
    pid = p.int("pid", None)
    cgroup = p.str("cgroup", None)
    p.done()
    if sum(x is not None for x in (name, pid, cgroup)) != 1:
        raise RpcError(INVALID_PARAMS, "deregister_unmanaged: give exactly one of 'name', 'pid' or 'cgroup'")
    group = groups.find(name=name, pid=pid, cgroup=cgroup)
    if group.owner_uid != conn.peer.uid and not conn.privileged:
        raise RpcError(PERMISSION_DENIED, f"elastic group {group.name!r} belongs to uid {group.owner_uid}")
    return await groups.remove(group, "deregistered")


# ---- subscriptions ----------------------------------------------------------------------------
async def subscribe(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    event = p.str("event")
    filt = p.dict("filter", {})
    p.done()
    if event not in FILTER_KEYS:
        raise RpcError(INVALID_PARAMS, f"subscribe: unknown event {event!r}; known: {', '.join(FILTER_KEYS)}")
    bad = sorted(set(filt) - FILTER_KEYS[event])
    if bad:
        raise RpcError(INVALID_PARAMS, f"subscribe: event {event} has no filter key {bad[0]!r}; "
                                       f"known: {', '.join(sorted(FILTER_KEYS[event]))}")
    for key, value in filt.items():
        ok = isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value))
        if not ok:
            raise RpcError(INVALID_PARAMS, f"subscribe: filter {key!r} must be a string or a list of strings")
    too_many = rm.sessions.subscription_refusal(conn)
    if too_many is not None:
        raise RpcError(rpc.QUOTA_EXCEEDED, f"subscribe: {too_many}")
    if event == "condition":
        goal = filt.get("goal")
        if not isinstance(goal, str):
            raise RpcError(INVALID_PARAMS, 'subscribe: a condition needs its goal: {"goal": "cpu_load(0, L), L > 90"}')
        return {"subscription": await rm.knowledge.add_condition(conn, goal), "event": event, "filter": filt}
    sub = rm.events.subscribe(conn, event, filt)
    return {"subscription": sub.id, "event": event, "filter": filt}


async def unsubscribe(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    sid = p.int("subscription")
    p.done()
    if not rm.events.unsubscribe(conn, sid):
        raise RpcError(NOT_FOUND, f"no subscription {sid} on this connection")
    rm.knowledge.remove_condition(conn, sid)
    for name in conn.tasks:
        task = rm.find_task(name)
        if task is not None and task.auto_subscription == sid:
            task.auto_subscription = None
    return {"subscription": sid}


# ---- batch ------------------------------------------------------------------------------------
async def batch(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    """Run several calls in order in one round trip; stops at the first error unless told not to."""
    calls = p._get("calls", (list,), None, "a list of {method, params} objects")
    stop = p.bool("stop_on_error", True)
    p.done()
    if calls is None:
        raise RpcError(INVALID_PARAMS, "batch: missing parameter 'calls'")
    # Checked before anything runs: a batch whose reply could not be sent must not have acted.
    if len(calls) > rm.cfg.max_batch_calls:
        raise RpcError(INVALID_PARAMS, f"batch: {len(calls)} calls; at most {rm.cfg.max_batch_calls} per batch")
    results: list[dict[str, Any]] = []
    for i, call in enumerate(calls):
        if not isinstance(call, dict) or not isinstance(call.get("method"), str):
            raise RpcError(INVALID_PARAMS, f"batch: call {i} must be an object with a 'method' string")
        method = call["method"]
        params = call.get("params") or {}
        if method in ("batch", "hello") or not isinstance(params, dict):
            err = RpcError(INVALID_PARAMS, f"batch: call {i}: {method!r} cannot be batched" if isinstance(params, dict)
                           else f"batch: call {i}: params must be an object")
            results.append({"error": err.to_error()})
        else:
            try:
                results.append({"result": await dispatch(rm, conn, Request(method, params, i))})
                continue
            except RpcError as err:
                results.append({"error": err.to_error()})
        if stop:
            break
    return {"results": results}


METHODS: dict[str, Handler] = {
    "hello": hello,
    "register_task": register_task,
    "update_task": update_task,
    "deregister_task": deregister_task,
    "deploy_plan": deploy_plan,
    "add_facts": add_facts,
    "remove_facts": remove_facts,
    "add_procedure": add_procedure,
    "execute_query": execute_query,
    "subscribe": subscribe,
    "unsubscribe": unsubscribe,
    "request_allocation": request_allocation,
    "ack_allocation": ack_allocation,
    "get_allocation": get_allocation,
    "list_tasks": list_tasks,
    "register_unmanaged": register_unmanaged,
    "deregister_unmanaged": deregister_unmanaged,
    "batch": batch,
    "cancel": cancel,
    "list_procedures": list_procedures,
    "list_predicates": list_predicates,
    "explain_task": explain_task,
    "get_topology": get_topology,
}
assert set(METHODS) == set(rpc.METHODS), "the protocol's method names and the handlers must agree"
# Answered as soon as they are read, not behind the connection's earlier requests:
# an acknowledgement must not wait behind a slow query of the same client.
# A cancel must overtake the very query it stops.
IMMEDIATE = frozenset({"ack_allocation", "cancel"})


async def dispatch(rm: ResourceManager, conn: Connection, req: Request) -> Any:
    handler = METHODS.get(req.method)
    if handler is None:
        raise RpcError(METHOD_NOT_FOUND, f"unknown method {req.method!r}; known: {', '.join(sorted(METHODS))}")
    if rm.closing:
        raise RpcError(SHUTTING_DOWN, "the RM is shutting down")
    if not conn.hello and req.method != "hello":
        raise RpcError(HELLO_REQUIRED, "send 'hello' first")
    if rpc.REQUEST_KEY in req.params and req.method in rpc.WRITE_METHODS:
        # A keyed write runs once per key on this connection; a retry gets its first outcome.
        return await rm.knowledge.write_keys.run(conn.id, req.method, req.params,
                                                 lambda params: handler(rm, conn, Params(req.method, params)),
                                                 rm.knowledge.answer_s)
    return await handler(rm, conn, Params(req.method, req.params))

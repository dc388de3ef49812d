"""Protocol dispatch: one function per method, checking params and permissions, then asking the RM.

Each handler takes (rm, conn, params) and returns the JSON `result`, or raises
RpcError.  The table `METHODS` is the protocol (docs/protocol.md).
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from cod.skb import SKBError

from .allocator.model import TaskSpec, TaskSpecError
from .jsonrpc import (
    ALREADY_EXISTS,
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
from .service import ResourceManager, skb_rpc_error
from .state import EVENTS, FILTER_KEYS, NAME_RE, Connection, Task

SERVER_NAME = "cod-rm/0.1"
# Task properties a client may set (TaskSpec's fields other than the name).
PROPERTY_KEYS = ("min_cores", "max_cores", "working_set_bytes", "bound", "sensitive", "exclusive",
                 "priority", "pollutes_cache", "allow_smt_sharing")
MAX_QUERY_SOLUTIONS = 10_000

Handler = Callable[[ResourceManager, Connection, Params], Awaitable[Any]]


async def _skb(coro: Awaitable[Any]) -> Any:
    """Await an SKB call, turning its SKBError into the protocol's error reply."""
    try:
        return await coro
    except SKBError as err:
        raise skb_rpc_error(err) from None


def _proc_owner(pid: int) -> int:
    """Real uid of process `pid`, from /proc."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    raise RpcError(NOT_FOUND, f"no process with pid {pid}")


def _task_for(rm: ResourceManager, conn: Connection, p: Params, *, required: bool = True) -> Task | None:
    """The task a request names, or the connection's only task when it names none."""
    name = p.str("task", None)
    if name is None:
        mine = sorted(conn.tasks)
        if len(mine) == 1:
            return rm.state.tasks[mine[0]]
        if not required:
            return None
        raise RpcError(
            INVALID_PARAMS,
            f"{p.method}: give 'task': this connection has {len(mine)} registered tasks"
            + (f" ({', '.join(mine)})" if mine else ""),
        )
    task = rm.state.tasks.get(name)
    if task is None:
        raise RpcError(NOT_FOUND, f"no task named {name!r}")
    if task.owner_uid != conn.peer.uid and not rm.privileged(conn):
        raise RpcError(PERMISSION_DENIED, f"task {name!r} belongs to uid {task.owner_uid}")
    return task


def _spec(name: str, props: dict[str, Any], method: str) -> TaskSpec:
    unknown = sorted(set(props) - set(PROPERTY_KEYS))
    if unknown:
        raise RpcError(INVALID_PARAMS, f"{method}: unknown task property {unknown[0]!r}; known: {', '.join(PROPERTY_KEYS)}")
    try:
        return TaskSpec.from_dict({"name": name, **props})
    except (TaskSpecError, TypeError) as err:
        raise RpcError(INVALID_PARAMS, f"{method}: {err}") from None


# ---- session ------------------------------------------------------------------------------------
async def hello(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    version = p.int("version")
    app = p.str("app", None)
    p.str("client", None)
    p.done()
    if version != PROTOCOL_VERSION:
        raise RpcError(UNSUPPORTED_VERSION, f"protocol version {version} is not supported; this daemon speaks {PROTOCOL_VERSION}",
                       {"supported": [PROTOCOL_VERSION]})
    if app is None:
        app = conn.app or f"pid{conn.peer.pid}"
    if not NAME_RE.match(app):
        raise RpcError(INVALID_PARAMS, f"hello: app name {app!r} must match [a-z][a-z0-9_]{{0,63}}")
    if conn.app is not None and conn.app != app:
        raise RpcError(INVALID_PARAMS, f"hello: this connection already uses application {conn.app!r}")
    rm.claim_app(conn, app)
    conn.hello = True
    return {
        "protocol": PROTOCOL_VERSION,
        "server": SERVER_NAME,
        "app": app,
        "machine": rm.machine.name,
        "enforce": rm.cfg.enforce,
        "enforce_mode": rm.enforce_mode,
        "peer": {"pid": conn.peer.pid, "uid": conn.peer.uid, "gid": conn.peer.gid},
        "privileged": rm.privileged(conn),
        "epoch": rm.state.epoch,
        "methods": sorted(METHODS),
        "events": [e for e in EVENTS if e != "shutdown"],
        "max_frame_bytes": rm.cfg.max_frame_bytes,
    }


# ---- facts and procedures -------------------------------------------------------------------
async def _add_facts(rm: ResourceManager, conn: Connection, facts: list[str], scope: str, persistent: bool) -> int:
    if scope == "system":
        if not rm.privileged(conn):
            raise RpcError(PERMISSION_DENIED, "only root or the daemon's user may change system-level facts")
        n = await _skb(rm.skb.add_system_facts(facts))
        rm.facts_changed(conn, "system", "add", facts)
        rm.schedule("system facts changed")
        return n
    assert conn.app is not None
    n = await _skb(rm.skb.add_facts(conn.app, facts))
    if persistent:
        rm.state.persistent.setdefault(conn.app, {"facts": [], "procedures": []})["facts"].extend(facts)
    else:
        conn.facts.extend(facts)
    rm.facts_changed(conn, "app", "add", facts)
    if conn.tasks:
        rm.schedule(f"facts of {conn.app} changed")
    return n


def _scope(p: Params) -> str:
    scope = p.str("scope", "app")
    if scope not in ("app", "system"):
        raise RpcError(INVALID_PARAMS, f"{p.method}: scope must be 'app' or 'system', not {scope!r}")
    return scope


async def add_facts(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    facts = p.str_list("facts")
    scope = _scope(p)
    persistent = p.bool("persistent", False)
    p.done()
    if not facts:
        return {"added": 0}
    return {"added": await _add_facts(rm, conn, facts, scope, persistent)}


async def remove_facts(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    patterns = p.str_list("patterns")
    scope = _scope(p)
    p.done()
    removed = 0
    if scope == "system" and not rm.privileged(conn):
        raise RpcError(PERMISSION_DENIED, "only root or the daemon's user may change system-level facts")
    for pattern in patterns:
        if scope == "system":
            removed += await _skb(rm.skb.remove_system_facts(pattern))
        else:
            assert conn.app is not None
            removed += await _skb(rm.skb.remove_facts(conn.app, pattern))
            keep = rm.state.persistent.get(conn.app)
            if keep and pattern in keep["facts"]:
                keep["facts"] = [f for f in keep["facts"] if f != pattern]
    if removed:
        rm.facts_changed(conn, scope, "remove", patterns)
        if scope == "system" or conn.tasks:
            rm.schedule("facts removed")
    return {"removed": removed}


async def add_procedure(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    text = p.str("text")
    persistent = p.bool("persistent", False)
    p.done()
    assert conn.app is not None
    preds = await _skb(rm.skb.add_procedure(conn.app, text))
    if persistent:
        rm.state.persistent.setdefault(conn.app, {"facts": [], "procedures": []})["procedures"].append(text)
    return {"predicates": preds}


async def execute_query(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    goal = p.str("goal")
    all_solutions = p.bool("all_solutions", True)
    max_solutions = p.int("max_solutions", MAX_QUERY_SOLUTIONS)
    timeout_s = p.number("timeout_s", rm.cfg.query_timeout_s)
    p.done()
    if max_solutions < 1 or max_solutions > MAX_QUERY_SOLUTIONS:
        raise RpcError(INVALID_PARAMS, f"execute_query: max_solutions must be 1..{MAX_QUERY_SOLUTIONS}")
    if timeout_s <= 0:
        raise RpcError(INVALID_PARAMS, "execute_query: timeout_s must be positive")
    timeout_s = min(float(timeout_s), rm.cfg.query_timeout_s)
    assert conn.app is not None
    solutions = await _skb(rm.skb.execute_query(conn.app, goal, all_solutions=all_solutions,
                                                timeout_s=timeout_s, max_solutions=max_solutions))
    return {"solutions": solutions}


# ---- tasks ------------------------------------------------------------------------------------
async def register_task(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    name = p.str("name")
    pid = p.int("pid", conn.peer.pid)
    props = p.dict("properties", {})
    facts = p.str_list("facts", [])
    procedures = p.str_list("procedures", [])
    persistent = p.bool("persistent", False)
    p.done()
    if not NAME_RE.match(name):
        raise RpcError(INVALID_PARAMS, f"register_task: task name {name!r} must match [a-z][a-z0-9_]{{0,63}}")
    if name in rm.state.tasks:
        raise RpcError(ALREADY_EXISTS, f"a task named {name!r} is already registered")
    spec = _spec(name, props, "register_task")
    owner = _proc_owner(pid)
    if owner != conn.peer.uid and not rm.privileged(conn):
        raise RpcError(PERMISSION_DENIED, f"process {pid} belongs to uid {owner}, not to you (uid {conn.peer.uid})")
    # The application's facts and procedures first, so the task's first allocation can use them.
    assert conn.app is not None
    for text in procedures:
        await add_procedure(rm, conn, Params("add_procedure", {"text": text, "persistent": persistent}))
    if facts:
        await _add_facts(rm, conn, facts, "app", persistent)
    task = Task(name=name, pid=pid, app=conn.app, conn_id=conn.id, owner_uid=conn.peer.uid,
                properties=spec.to_dict(), spec=spec)
    sub = rm.state.subscribe(conn, "allocation_changed", {"task": name})
    task.auto_subscription = sub.id
    if name in rm.state.tasks:  # registered by someone else while we were adding facts
        rm.state.unsubscribe(conn, sub.id)
        raise RpcError(ALREADY_EXISTS, f"a task named {name!r} is already registered")
    conn.tasks.add(name)
    try:
        await rm.admit(task)
    except BaseException:
        conn.tasks.discard(name)
        rm.state.unsubscribe(conn, sub.id)
        rm.state.tasks.pop(name, None)
        raise
    return {"task": name, "pid": pid, "app": conn.app, "subscription": sub.id, "properties": spec.to_dict(),
            "allocation": rm.allocation_of(task)}


async def update_task(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    task = _task_for(rm, conn, p)
    assert task is not None
    props = p.dict("properties")
    p.done()
    merged = {k: v for k, v in task.spec.to_dict().items() if k != "name"}
    merged.update(props)
    spec = _spec(task.name, merged, "update_task")
    candidate = Task(name=task.name, pid=task.pid, app=task.app, conn_id=task.conn_id,
                     owner_uid=task.owner_uid, properties=spec.to_dict(), spec=spec)
    await rm.admit(candidate, replacing=task)
    return {"task": task.name, "properties": spec.to_dict(), "allocation": rm.allocation_of(task)}


async def deregister_task(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    task = _task_for(rm, conn, p)
    assert task is not None
    p.done()
    await rm.remove_task(task, "deregistered")
    return {"task": task.name}


async def request_allocation(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    task = _task_for(rm, conn, p)
    assert task is not None
    p.done()
    await rm.wait_for(rm.schedule(f"requested by {task.name}"))
    if rm.closing:
        raise RpcError(SHUTTING_DOWN, "the RM is shutting down")
    if task.name not in rm.state.tasks:
        raise RpcError(NOT_FOUND, f"task {task.name!r} left")
    return rm.allocation_of(task)


async def ack_allocation(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    task = _task_for(rm, conn, p)
    assert task is not None
    epoch = p.int("epoch")
    p.done()
    released = await rm.acknowledge(task, epoch)
    return {"task": task.name, "epoch": rm.state.epoch, "released": released}


async def get_allocation(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    task = _task_for(rm, conn, p, required=False)
    p.done()
    if task is not None:
        return rm.allocation_of(task)
    return {"epoch": rm.state.epoch, **rm.plan_summary(),
            "tasks": [rm.allocation_of(t) for _, t in sorted(rm.state.tasks.items())]}


async def list_tasks(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    p.done()
    binding = rm.last_plan.binding if rm.last_plan else {}
    return {"epoch": rm.state.epoch, "plan": rm.plan_summary(), "tasks": [
        {"task": t.name, "pid": t.pid, "app": t.app, "properties": t.properties,
         "cores": list(t.announced), "epoch": t.announced_epoch, "binding": list(binding.get(t.name, ()))}
        for _, t in sorted(rm.state.tasks.items())],
        "other_tasks": [{"pid": o.pid, "comm": o.comm, "cpu": round(o.cpu, 3), "cpus": list(o.cpus)}
                        for _, o in sorted(rm.others.items())]}


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
    sub = rm.state.subscribe(conn, event, filt)
    return {"subscription": sub.id, "event": event, "filter": filt}


async def unsubscribe(rm: ResourceManager, conn: Connection, p: Params) -> Any:
    sid = p.int("subscription")
    p.done()
    if not rm.state.unsubscribe(conn, sid):
        raise RpcError(NOT_FOUND, f"no subscription {sid} on this connection")
    for name in conn.tasks:
        task = rm.state.tasks.get(name)
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
    "batch": batch,
}
# Answered as soon as they are read, not behind the connection's earlier requests:
# an acknowledgement must not wait behind a slow query of the same client.
IMMEDIATE = frozenset({"ack_allocation"})


async def dispatch(rm: ResourceManager, conn: Connection, req: Request) -> Any:
    handler = METHODS.get(req.method)
    if handler is None:
        raise RpcError(METHOD_NOT_FOUND, f"unknown method {req.method!r}; known: {', '.join(sorted(METHODS))}")
    if rm.closing:
        raise RpcError(SHUTTING_DOWN, "the RM is shutting down")
    if not conn.hello and req.method != "hello":
        raise RpcError(HELLO_REQUIRED, "send 'hello' first")
    return await handler(rm, conn, Params(req.method, req.params))

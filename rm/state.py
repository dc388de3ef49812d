"""What the RM knows about its clients: connections, tasks, subscriptions and the allocation epochs.

Plain data owned by the event loop; no I/O and no SKB calls here, so every rule
(who owns what, which subscriber wants which event) can be tested directly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,63}\Z")

EVENTS = ("allocation_changed", "task_arrived", "task_left", "facts_changed", "shutdown")


@dataclass
class Peer:
    """Who is on the other end of a connection (from SO_PEERCRED)."""

    pid: int
    uid: int
    gid: int


@dataclass
class Subscription:
    id: int
    conn_id: int
    event: str
    filter: dict[str, Any]

    def matches(self, event: str, payload: dict[str, Any]) -> bool:
        if event != self.event:
            return False
        for key, wanted in self.filter.items():
            if key == "predicate":
                names = payload.get("predicates", [])
                wanted_set = {wanted} if isinstance(wanted, str) else set(wanted)
                if not wanted_set.intersection(names):
                    return False
            else:
                have = payload.get(key)
                if isinstance(wanted, list):
                    if have not in wanted:
                        return False
                elif have != wanted:
                    return False
        return True


# Filter keys each event understands; anything else is refused at subscribe time.
FILTER_KEYS: dict[str, frozenset[str]] = {
    "allocation_changed": frozenset({"task", "app"}),
    "task_arrived": frozenset({"task", "app"}),
    "task_left": frozenset({"task", "app"}),
    "facts_changed": frozenset({"predicate", "app", "scope"}),
}


@dataclass
class Task:
    name: str
    pid: int
    app: str
    conn_id: int
    owner_uid: int
    properties: dict[str, Any]  # validated, as TaskSpec.from_dict accepted them
    spec: Any  # the allocator's TaskSpec
    auto_subscription: int | None = None
    # What the task has been told it holds, and the epoch of that announcement.
    announced: tuple[int, ...] = ()
    announced_epoch: int = 0


@dataclass
class Revocation:
    """A core planned away from `task`; the task still holds it until it acks or the deadline passes."""

    core: int
    task: str
    epoch: int
    deadline: float  # loop.time() value


@dataclass
class Connection:
    id: int
    peer: Peer
    app: str | None = None
    hello: bool = False
    tasks: set[str] = field(default_factory=set)
    subscriptions: set[int] = field(default_factory=set)
    # Non-persistent application facts this connection added (dropped when it leaves).
    facts: list[str] = field(default_factory=list)
    send: Callable[[dict[str, Any]], None] | None = None  # queues one message to the peer


class RMState:
    """Tasks, connections and subscriptions, with the ownership rules between them."""

    def __init__(self) -> None:
        self.connections: dict[int, Connection] = {}
        self.tasks: dict[str, Task] = {}
        self.subscriptions: dict[int, Subscription] = {}
        self.app_owner: dict[str, int] = {}  # app namespace -> uid that claimed it
        self.persistent: dict[str, dict[str, list[str]]] = {}  # app -> {"facts": [...], "procedures": [...]}
        self.revocations: dict[int, Revocation] = {}  # core -> pending revocation
        self.epoch = 0
        self._next_conn = 1
        self._next_sub = 1

    # ---- connections -----------------------------------------------------------------------
    def add_connection(self, peer: Peer) -> Connection:
        conn = Connection(self._next_conn, peer)
        self._next_conn += 1
        self.connections[conn.id] = conn
        return conn

    def app_connections(self, app: str) -> list[Connection]:
        return [c for c in self.connections.values() if c.app == app]

    def remove_connection(self, conn_id: int) -> tuple[list[Task], Connection | None]:
        """Forget a connection and everything it owned; returns its tasks (now gone) and itself."""
        conn = self.connections.pop(conn_id, None)
        if conn is None:
            return [], None
        gone = [self.tasks.pop(name) for name in sorted(conn.tasks) if name in self.tasks]
        for sid in conn.subscriptions:
            self.subscriptions.pop(sid, None)
        for core in [c for c, r in self.revocations.items() if r.task in conn.tasks]:
            del self.revocations[core]
        return gone, conn

    # ---- subscriptions ---------------------------------------------------------------------
    def subscribe(self, conn: Connection, event: str, filt: dict[str, Any]) -> Subscription:
        sub = Subscription(self._next_sub, conn.id, event, dict(filt))
        self._next_sub += 1
        self.subscriptions[sub.id] = sub
        conn.subscriptions.add(sub.id)
        return sub

    def unsubscribe(self, conn: Connection, sub_id: int) -> bool:
        sub = self.subscriptions.get(sub_id)
        if sub is None or sub.conn_id != conn.id:
            return False
        del self.subscriptions[sub_id]
        conn.subscriptions.discard(sub_id)
        return True

    def subscribers(self, event: str, payload: dict[str, Any]) -> list[Subscription]:
        return [s for s in self.subscriptions.values() if s.event == event and s.matches(event, payload)]

    # ---- tasks -----------------------------------------------------------------------------
    def holdings(self) -> dict[str, tuple[int, ...]]:
        """Cores each task may run on right now: what it was told plus cores it has yet to give back."""
        held = {name: set(t.announced) for name, t in self.tasks.items()}
        for core, rev in self.revocations.items():
            if rev.task in held:
                held[rev.task].add(core)
        return {name: tuple(sorted(cores)) for name, cores in held.items()}

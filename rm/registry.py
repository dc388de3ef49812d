"""Who is connected, which applications and tasks exist, who may do what, and who listens.

Plain data owned by the event loop; no I/O and no SKB calls here, so every
rule (who owns a name, which subscriber wants which event, how many
connections a uid may hold) can be tested directly.  The allocation's
epochs live in :mod:`cod.rm.epochs`; the handlers never change this state
themselves, the ResourceManager does (:mod:`cod.rm.service`).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from .confusables import look_alike, looks_numbered

# Names of the form uid<N>.* are reserved for uid N: the daemon gives a client
# that names no application the name uid<UID>.pid<PID>, and nobody else may
# take it first, nor a name that looks like it (which would then keep uid N's own out).
_RESERVED = re.compile(r"uid(\d+)\.")


def default_app_name(uid: int, pid: int) -> str:
    return f"uid{uid}.pid{pid}"


def reserved_for(name: str) -> int | None:
    """The uid a name is reserved for (uid<N>.*, or what looks like it: UID1000.*, uidl000.*), or None."""
    m = _RESERVED.match(name)
    return int(m.group(1)) if m else looks_numbered(name, "uid", ".")


@dataclass(frozen=True)
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

    def index_entries(self) -> list[tuple[str, str | None, str | None]]:
        """Where :class:`SubscriptionIndex` files it: (event, key, value) for each value its filter
        wants of its most selective key, or (event, None, None) when it filters nothing."""
        for key in INDEX_KEYS:
            if key in self.filter:
                wanted = self.filter[key]
                values = [wanted] if isinstance(wanted, str) else wanted
                return list(dict.fromkeys((self.event, key, v) for v in values))
        return [(self.event, None, None)]


# The filter keys subscriptions are indexed by, the most selective first (one per subscription).
INDEX_KEYS = ("task", "goal", "app", "predicate", "scope")


class SubscriptionIndex:
    """Subscriptions by event and by a value of their filter, so that an event is tested against
    the few subscriptions that may want it, not against every one (16,384 subscriptions of one
    uid that matched nothing made each of root's registrations scan them all, several times)."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str | None, str | None], dict[int, Subscription]] = {}
        self._keys: dict[str, Counter[str | None]] = {}  # event -> its index keys in use

    def add(self, sub: Subscription) -> None:
        for entry in sub.index_entries():
            self._entries.setdefault(entry, {})[sub.id] = sub
            self._keys.setdefault(sub.event, Counter())[entry[1]] += 1

    def remove(self, sub: Subscription) -> None:
        for entry in sub.index_entries():
            subs = self._entries.get(entry)
            if subs is None or subs.pop(sub.id, None) is None:
                continue
            if not subs:
                del self._entries[entry]
            keys = self._keys[sub.event]
            keys[entry[1]] -= 1
            if keys[entry[1]] <= 0:
                del keys[entry[1]]

    def candidates(self, event: str, payload: dict[str, Any]) -> list[Subscription]:
        """The subscriptions to ``event`` that could match ``payload``, in the order they were made."""
        found: dict[int, Subscription] = {}
        for key in self._keys.get(event, ()):
            if key is None:
                values: list[Any] = [None]
            elif key == "predicate":
                values = [n for n in payload.get("predicates", ()) if isinstance(n, str)]
            else:
                have = payload.get(key)
                values = [have] if isinstance(have, str) else []
            for value in values:
                found.update(self._entries.get((event, key, value), {}))
        return [found[i] for i in sorted(found)]


@dataclass
class Task:
    name: str
    pid: int
    app: str
    conn_id: int
    owner_uid: int
    spec: Any  # the allocator's TaskSpec
    properties: dict[str, Any]  # as the client gave them (derived ones as their query)
    auto_subscription: int | None = None
    children: set[int] = field(default_factory=set)  # processes it forked, pinned with it
    derived: dict[str, Any] = field(default_factory=dict)  # key -> taskprops.Derived
    derived_values: dict[str, int] = field(default_factory=dict)  # their last good values
    warning_subscription: int | None = None
    deployment: Any = None  # cod.rm.deployment.Deployment: its threads' CPUs inside its own
    # "client": a privileged client (the NRI plugin) enforces its allocation; it has no process here (pid 0)
    enforced_by: str = "daemon"

    def pids(self) -> list[int]:
        """The processes the daemon pins and watches for this task (none when a client enforces it)."""
        if self.enforced_by == "client":
            return []
        return [self.pid, *sorted(self.children)]


@dataclass
class Connection:
    id: int
    peer: Peer
    app: str | None = None
    hello: bool = False
    privileged: bool = False
    tasks: set[str] = field(default_factory=set)
    subscriptions: set[int] = field(default_factory=set)
    token: str | None = None  # the capability of its direct query channel
    send: Callable[[dict[str, Any]], None] | None = None  # queues one message to the peer
    write: Callable[[bytes], None] | None = None  # queues encoded frames to the peer


@dataclass
class Usage:
    """What an application holds in the SKB, as the SKB last reported it."""

    facts: int = 0
    fact_chars: int = 0
    clauses: int = 0
    clause_chars: int = 0

    @classmethod
    def from_reply(cls, data: dict[str, Any] | None) -> "Usage":
        data = data or {}
        return cls(int(data.get("facts", 0)), int(data.get("fact_chars", 0)),
                   int(data.get("clauses", 0)), int(data.get("clause_chars", 0)))

    def empty(self) -> bool:
        return self.facts == 0 and self.clauses == 0


class Registry:
    """Connections, applications, tasks and subscriptions, with the ownership rules between them."""

    def __init__(self) -> None:
        self.connections: dict[int, Connection] = {}
        self.tasks: dict[str, Task] = {}
        self.subscriptions: dict[int, Subscription] = {}
        self._subscription_index = SubscriptionIndex()
        self.app_owner: dict[str, int] = {}  # application name -> the uid that owns it
        self.usage: dict[str, Usage] = {}  # application -> what it holds in the SKB
        # Processes whose registration is under way: pinned before the task is in ``tasks``, and
        # from then on no busy stranger (the monitor would otherwise confine them away).
        self.arriving: Counter[int] = Counter()
        self._next_conn = 1
        self._next_sub = 1

    # ---- connections -----------------------------------------------------------------------
    def add_connection(self, peer: Peer, privileged: bool) -> Connection:
        conn = Connection(self._next_conn, peer, privileged=privileged)
        self._next_conn += 1
        self.connections[conn.id] = conn
        return conn

    def app_connections(self, app: str) -> list[Connection]:
        return [c for c in self.connections.values() if c.app == app]

    def uid_connections(self, uid: int) -> int:
        return sum(1 for c in self.connections.values() if c.peer.uid == uid)

    def uid_subscriptions(self, uid: int) -> int:
        """Subscriptions held by the connections of ``uid`` (conditions and tasks' own included)."""
        return sum(len(c.subscriptions) for c in self.connections.values() if c.peer.uid == uid)

    def remove_connection(self, conn_id: int) -> tuple[list[Task], Connection | None]:
        """Forget a connection and everything it owned; returns its tasks (now gone) and itself."""
        conn = self.connections.pop(conn_id, None)
        if conn is None:
            return [], None
        gone = [self.tasks.pop(name) for name in sorted(conn.tasks) if name in self.tasks]
        for sid in conn.subscriptions:
            sub = self.subscriptions.pop(sid, None)
            if sub is not None:
                self._subscription_index.remove(sub)
        return gone, conn

    # ---- application names -----------------------------------------------------------------
    def name_refusal(self, uid: int, app: str, privileged: bool) -> str | None:
        """Why uid may not use application ``app`` (None: it may)."""
        if privileged:
            return None
        reserved = reserved_for(app)
        if reserved is not None and reserved != uid:
            return f"application names uid{reserved}.* are reserved for uid {reserved}"
        owner = self.app_owner.get(app)
        if owner is not None and owner != uid:
            return f"application namespace {app!r} belongs to uid {owner}"
        return None

    def app_look_alike(self, app: str) -> str | None:
        """The application name in use that ``app``, a new name, looks like (cod.rm.confusables), or None."""
        return None if app in self.app_owner else look_alike(app, self.app_owner)

    def claim_app(self, conn: Connection, app: str) -> None:
        self.app_owner.setdefault(app, conn.peer.uid)
        conn.app = app

    def release_name(self, app: str) -> None:
        """The application holds nothing and nobody is connected to it: its name is free again."""
        if not self.app_connections(app) and self.usage.get(app, Usage()).empty():
            self.app_owner.pop(app, None)
            self.usage.pop(app, None)

    def uid_apps(self, uid: int) -> list[str]:
        """Application names ``uid`` holds (connected, or keeping persistent facts)."""
        return sorted(app for app, owner in self.app_owner.items() if owner == uid)

    def uid_usage(self, uid: int) -> Usage:
        total = Usage()
        for app, owner in self.app_owner.items():
            if owner == uid:
                u = self.usage.get(app)
                if u is not None:
                    total.facts += u.facts
                    total.fact_chars += u.fact_chars
                    total.clauses += u.clauses
                    total.clause_chars += u.clause_chars
        return total

    # ---- tasks -----------------------------------------------------------------------------
    def uid_tasks(self, uid: int) -> list[Task]:
        return [t for t in self.tasks.values() if t.owner_uid == uid]

    def managed_pids(self) -> set[int]:
        """Processes of registered tasks (and their children) and of registrations under way."""
        return {pid for t in self.tasks.values() for pid in t.pids()} | set(self.arriving)

    def task_pids(self) -> dict[int, Task]:
        return {t.pid: t for t in self.tasks.values()}

    def task_of_pid(self, pid: int) -> Task | None:
        """The task a process belongs to: its own pid or one of its children."""
        for t in self.tasks.values():
            if t.pid == pid or pid in t.children:
                return t
        return None

    # ---- subscriptions ---------------------------------------------------------------------
    def subscribe(self, conn: Connection, event: str, filt: dict[str, Any]) -> Subscription:
        sub = Subscription(self._next_sub, conn.id, event, dict(filt))
        self._next_sub += 1
        self.subscriptions[sub.id] = sub
        self._subscription_index.add(sub)
        conn.subscriptions.add(sub.id)
        return sub

    def unsubscribe(self, conn: Connection, sub_id: int) -> bool:
        sub = self.subscriptions.get(sub_id)
        if sub is None or sub.conn_id != conn.id:
            return False
        del self.subscriptions[sub_id]
        self._subscription_index.remove(sub)
        conn.subscriptions.discard(sub_id)
        return True

    def subscribers(self, event: str, payload: dict[str, Any]) -> list[Subscription]:
        """The subscriptions ``event`` with ``payload`` matches, in the order they were made."""
        return [s for s in self._subscription_index.candidates(event, payload) if s.matches(event, payload)]

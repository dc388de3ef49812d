"""Where the shell's answers come from: a running daemon, or an SKB of its own.

:class:`DaemonBackend` speaks the wire protocol through :class:`cod.client.Client`;
:class:`EmbeddedBackend` runs a :class:`cod.skb.SKB` loaded with a machine
(``--machine`` / ``--hwloc``), for exploring without a daemon.  Both answer the
same questions (queries, tasks, the plan, changes); what only a daemon knows
(events, another application's procedures) raises :class:`ShellError` in the
embedded one.  Transport only: what to show is decided by the commands.
"""

from __future__ import annotations

import os
import signal
from abc import ABC, abstractmethod
from typing import Any, Callable

from cod.client import Client
from cod.client import errors as client_errors
from cod.facts.model import Machine
from cod.skb import SKB, library_dir

from . import skbviews
from .errors import ConnectionProblem, ShellError
from .predicates import Predicate, clause_indicator, library_predicates

EVENTS = ("allocation_changed", "task_arrived", "task_left", "facts_changed")

# Daemon methods the shell uses when the daemon's `hello` lists them (docs/shell.md, "Daemon methods").
OPTIONAL_METHODS = ("cancel", "explain_task", "list_procedures", "list_predicates", "get_topology")


class Backend(ABC):
    mode: str  # "daemon" | "embedded"
    app: str  # the application namespace queries run in

    @abstractmethod
    def info(self) -> dict[str, Any]:
        """What the shell is connected to (for the banner, the prompt and `:help`)."""

    @abstractmethod
    def query(self, goal: str, *, max_solutions: int, timeout_s: float | None) -> list[dict[str, Any]]:
        ...

    @abstractmethod
    def interrupted(self) -> str:
        """Called after Ctrl-C stopped a request: make the backend usable again; says what happened."""

    def offers(self, method: str) -> bool:
        return False

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        raise ShellError(f"{method}: there is no daemon (this shell runs its own SKB)", kind="unsupported")

    @abstractmethod
    def tasks(self) -> dict[str, Any]:
        """The shape of the protocol's list_tasks result, plus live state per task."""

    @abstractmethod
    def add_facts(self, facts: list[str], scope: str) -> int:
        ...

    @abstractmethod
    def remove_facts(self, patterns: list[str], scope: str) -> int:
        ...

    @abstractmethod
    def add_procedure(self, text: str) -> list[str]:
        ...

    def update_task(self, task: str, properties: dict[str, Any]) -> dict[str, Any]:
        raise ShellError("tasks are registered with a daemon; this shell runs its own SKB (use --socket)",
                         kind="unsupported")

    def deregister_task(self, task: str) -> None:
        raise ShellError("tasks are registered with a daemon; this shell runs its own SKB (use --socket)",
                         kind="unsupported")

    @abstractmethod
    def procedures(self, app: str | None) -> dict[str, Any]:
        ...

    def library(self) -> list[Predicate]:
        return library_predicates()

    def watch(self, put: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
        """Subscribe to every event, calling `put(event)` for each; returns the function that stops."""
        raise ShellError(":watch needs a daemon: an embedded SKB has no events (use --socket)", kind="unsupported")

    def alive(self) -> bool:
        return True

    def reconnect(self) -> bool:
        return True

    def take_notes(self) -> list[str]:
        """Things that happened since the last statement (e.g. a reconnection), to tell the user."""
        return []

    def close(self) -> None:
        pass


def _group_clauses(clauses: list[str]) -> list[dict[str, Any]]:
    groups: dict[str, list[str]] = {}
    for text in clauses:
        groups.setdefault(clause_indicator(text) or "?", []).append(text)
    return [{"predicate": k, "clauses": v} for k, v in sorted(groups.items())]


# ---- a running daemon ---------------------------------------------------------------------------
class DaemonBackend(Backend):
    mode = "daemon"

    def __init__(self, path: str, app: str | None = None) -> None:
        self.path = path
        self._requested_app = app
        self._client: Client | None = None
        self._notes: list[str] = []
        # What this shell added in its own namespace, to add again after a reconnection.
        self._app_changes: list[tuple[str, Any]] = []
        self._watch_put: Callable[[dict[str, Any]], None] | None = None
        self._watch_subs: list[int] = []
        self._connect()
        self.app = self._client_or_raise().app or ""

    # -- connection --
    def _connect(self) -> Client:
        try:
            client = Client(self.path, app=self._requested_app, reconnect=False, call_timeout_s=120.0)
        except client_errors.NotConnected as err:  # the clients' one sentence, and what to do
            raise ConnectionProblem(f"{err}; start one with `cod rm` or give its socket with --socket",
                                    lost=False) from None
        except OSError as err:
            raise ConnectionProblem(f"cannot reach the daemon on {self.path}: {err.strerror or err}",
                                    lost=False) from None
        self._client = client
        return client

    def _client_or_raise(self) -> Client:
        if self._client is None:
            client = self._connect()
            self._notes.append(f"Reconnected to the daemon on {self.path} (epoch {client.server_info.get('epoch')}).")
            for kind, value in self._app_changes:
                try:
                    if kind == "facts":
                        client.add_facts(value)
                    else:
                        client.add_procedure(value)
                except client_errors.RMError as err:
                    self._notes.append(f"Could not add back this shell's {kind} after reconnecting: {err.message}.")
            if self._watch_put is not None:
                self._watch_subs = self._subscribe(client, self._watch_put)
        return self._client  # type: ignore[return-value]

    def _lost(self, err: Exception) -> ConnectionProblem:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:
                pass
        return ConnectionProblem(f"lost the connection to the daemon on {self.path}; "
                                 f"the shell reconnects when it is back", lost=True)

    def _do(self, fn: Callable[[Client], Any]) -> Any:
        client = self._client_or_raise()
        try:
            return fn(client)
        except client_errors.RMError as err:
            if isinstance(err, client_errors.ShuttingDown):
                raise self._lost(err) from None
            raise
        except client_errors.CodError as err:
            raise self._lost(err) from None

    def alive(self) -> bool:
        if self._client is None:
            return False
        try:
            self._client.call("get_allocation", {}, timeout_s=5.0)
            return True
        except client_errors.RMError:
            return True
        except client_errors.CodError:
            self._lost(client_errors.ConnectionLost("gone"))
            return False

    def take_notes(self) -> list[str]:
        notes, self._notes = self._notes, []
        return notes

    def info(self) -> dict[str, Any]:
        server = self._client.server_info if self._client else {}
        return {"mode": "daemon", "socket": self.path, "app": self.app, "machine": server.get("machine"),
                "server": server.get("server"), "privileged": server.get("privileged"),
                "enforce_mode": server.get("enforce_mode"), "connected": self._client is not None,
                "methods": server.get("methods", [])}

    def offers(self, method: str) -> bool:
        return self._client is not None and method in self._client.server_info.get("methods", ())

    # -- requests --
    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        return self._do(lambda c: c.call(method, params or {}))

    def query(self, goal: str, *, max_solutions: int, timeout_s: float | None) -> list[dict[str, Any]]:
        return self._do(lambda c: c.execute_query(goal, max_solutions=max_solutions, timeout_s=timeout_s))

    def interrupted(self) -> str:
        if self.offers("cancel"):
            try:
                self.call("cancel", {})
                return "Query cancelled."
            except Exception:
                pass
        return ("Stopped waiting for the query. This daemon cannot cancel it (it has no `cancel` method), "
                "so it runs on until its time limit, and the next request waits for it.")

    def tasks(self) -> dict[str, Any]:
        listing = self.call("list_tasks")
        live = skbviews.live_state(self.query)
        for t in listing.get("tasks", []):
            t.update(live.get(t["task"], {"cpu_use": None, "numa_pages": {}}))
        return listing

    def add_facts(self, facts: list[str], scope: str) -> int:
        n = self._do(lambda c: c.call("add_facts", {"facts": facts, "scope": scope}))["added"]
        if scope == "app":
            self._app_changes.append(("facts", list(facts)))
        return n

    def remove_facts(self, patterns: list[str], scope: str) -> int:
        return self._do(lambda c: c.call("remove_facts", {"patterns": patterns, "scope": scope}))["removed"]

    def add_procedure(self, text: str) -> list[str]:
        preds = self._do(lambda c: c.call("add_procedure", {"text": text}))["predicates"]
        self._app_changes.append(("procedure", text))
        return preds

    def update_task(self, task: str, properties: dict[str, Any]) -> dict[str, Any]:
        return self.call("update_task", {"task": task, "properties": properties})

    def deregister_task(self, task: str) -> None:
        self.call("deregister_task", {"task": task})

    def procedures(self, app: str | None) -> dict[str, Any]:
        if self.offers("list_procedures"):
            return self.call("list_procedures", {} if app is None else {"app": app})
        target = app or self.app
        out: dict[str, Any] = {"app": target, "procedures": [], "complete": False}
        if target == self.app:
            mine = [v for k, v in self._app_changes if k == "procedure"]
            clauses = [c.strip() for text in mine for c in _split_clauses(text)]
            out["procedures"] = _group_clauses(clauses)
            out["note"] = ("This daemon cannot list an application's procedures (it offers no list_procedures "
                           "method): shown are those this shell added.")
        else:
            out["note"] = (f"This daemon cannot list the procedures of application {target} (it offers no "
                           f"list_procedures method).")
        return out

    def library(self) -> list[Predicate]:
        if self.offers("list_predicates"):
            try:
                rows = self.call("list_predicates", {"kind": "library"})["predicates"]
                return [Predicate(r["name"], r["arity"], "library") for r in rows]
            except Exception:
                pass
        return library_predicates()

    # -- events --
    def _subscribe(self, client: Client, put: Callable[[dict[str, Any]], None]) -> list[int]:
        subs = []
        for event in EVENTS:
            subs.append(client.subscribe(event, {}, lambda payload, e=event: put({"event": e, **payload})))
        return subs

    def watch(self, put: Callable[[dict[str, Any]], None]) -> Callable[[], None]:
        self._watch_put = put
        self._watch_subs = self._do(lambda c: self._subscribe(c, put))

        def stop() -> None:
            self._watch_put = None
            subs, self._watch_subs = self._watch_subs, []
            if self._client is not None:
                for sid in subs:
                    try:
                        self._client.unsubscribe(sid)
                    except Exception:
                        pass

        return stop

    def reconnect(self) -> bool:
        """Dial the daemon again if the connection was lost; whether it answers now."""
        try:
            self._client_or_raise()
            return True
        except ConnectionProblem:
            return False

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _split_clauses(text: str) -> list[str]:
    from .statements import full_stops

    try:
        stops = full_stops(text)
    except ValueError:
        return [text]
    out, start = [], 0
    for s in stops:
        out.append(text[start:s])
        start = s + 1
    return [c for c in out if c.strip()]


# ---- an SKB of its own ------------------------------------------------------------------------
class EmbeddedBackend(Backend):
    mode = "embedded"

    def __init__(self, machine: Machine, app: str | None = None, *, source: str = "") -> None:
        self.machine = machine
        self.app = app or "shell"
        self.source = source
        self._changes: list[tuple[str, Any]] = []  # replayed when Ctrl-C restarts the engine
        self._library: list[Predicate] = []
        self._skb = self._start()

    def _start(self) -> SKB:
        skb = SKB(load_library=False)
        try:
            self._library = []
            for path in sorted(library_dir().glob("*.pl")) if library_dir().is_dir() else []:
                exports = skb.load_library(path)
                for pi in exports:
                    name, _, arity = pi.rpartition("/")
                    self._library.append(Predicate(name.strip("'"), int(arity), "library"))
            skb.load_machine(self.machine)
            for kind, value in self._changes:
                if kind == "system":
                    skb.add_system_facts(value)
                elif kind == "system-":
                    for pattern in value:
                        skb.remove_system_facts(pattern)
                elif kind == "facts":
                    skb.add_facts(self.app, value)
                elif kind == "facts-":
                    for pattern in value:
                        skb.remove_facts(self.app, pattern)
                else:
                    skb.add_procedure(self.app, value)
        except BaseException:
            skb.close()
            raise
        return skb

    def info(self) -> dict[str, Any]:
        return {"mode": "embedded", "source": self.source, "app": self.app, "machine": self.machine.name,
                "privileged": True, "connected": True, "methods": []}

    def query(self, goal: str, *, max_solutions: int, timeout_s: float | None) -> list[dict[str, Any]]:
        return self._skb.execute_query(self.app, goal, max_solutions=max_solutions, timeout_s=timeout_s)

    def interrupted(self) -> str:
        # The engine is still busy with the query: end it (it is this shell's own child) and start afresh.
        pid = self._skb.pid
        if pid is not None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._skb.close()
        self._skb = self._start()
        return "Query cancelled."

    def tasks(self) -> dict[str, Any]:
        return skbviews.tasks_from_skb(self.query)

    def add_facts(self, facts: list[str], scope: str) -> int:
        if scope == "system":
            n = self._skb.add_system_facts(facts)
            self._changes.append(("system", list(facts)))
        else:
            n = self._skb.add_facts(self.app, facts)
            self._changes.append(("facts", list(facts)))
        return n

    def remove_facts(self, patterns: list[str], scope: str) -> int:
        if scope == "system":
            n = sum(self._skb.remove_system_facts(p) for p in patterns)
            self._changes.append(("system-", list(patterns)))
        else:
            n = sum(self._skb.remove_facts(self.app, p) for p in patterns)
            self._changes.append(("facts-", list(patterns)))
        return n

    def add_procedure(self, text: str) -> list[str]:
        preds = self._skb.add_procedure(self.app, text)
        self._changes.append(("procedure", text))
        return preds

    def procedures(self, app: str | None) -> dict[str, Any]:
        target = app or self.app
        if target != self.app:
            return {"app": target, "procedures": [], "complete": True,
                    "note": f"This SKB has no application {target}: it holds only this shell's ({self.app})."}
        texts = self._skb.list_procedures(target)  # one text per predicate, a clause per line
        clauses = self._skb.list_facts(target) + [line for text in texts for line in text.splitlines() if line.strip()]
        return {"app": target, "procedures": _group_clauses(clauses), "complete": True}

    def library(self) -> list[Predicate]:
        return list(self._library)

    def close(self) -> None:
        self._skb.close()


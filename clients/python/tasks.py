"""Tasks and allocations: a `Client`'s tasks, the allocations it heard of, and elastic groups."""

from __future__ import annotations

import warnings
from typing import Any

from .errors import CodError
from .memory import MemoryRanges
from .parts import ClientParts, Handler


class Tasks(ClientParts):
    """The task part of `Client`: registering tasks, their allocations, acknowledgements."""

    def register_task(self, name: str, *, pid: int | None = None, min_cores: int = 1,
                      max_cores: int | None = None, facts: list[str] | None = None,
                      procedures: list[str] | None = None, on_allocation: Handler | None = None,
                      memory: MemoryRanges | None = None, **properties: Any) -> dict[str, Any]:
        """Register a task (this process unless `pid`); `facts` and `procedures` go in the same call.

        Returns the daemon's reply, whose "allocation" is the task's first allocation.
        `on_allocation(event)` is called for each allocation_changed upcall of the task.
        `memory`: ranges bound to the task's memory nodes from its first allocation on, and again
        on each upcall before `on_allocation` runs (cod.client.memory).
        """
        if memory is not None:
            on_allocation = _following(memory, on_allocation)
        props = {"min_cores": min_cores, **properties}
        if max_cores is not None:
            props["max_cores"] = max_cores
        params: dict[str, Any] = {"name": name, "properties": props}
        if pid is not None:
            params["pid"] = pid
        if facts:
            params["facts"] = list(facts)
        if procedures:
            params["procedures"] = list(procedures)
        with self._state_lock:
            self._task_handlers[name] = on_allocation
        if on_allocation is not None:
            self._ensure_handler_thread()
        result = self.call("register_task", params)
        with self._state_lock:
            replay = {"name": name, "properties": props}
            if pid is not None:
                replay["pid"] = pid
            self._held.tasks[name] = replay
            if facts:
                self._held.added(list(facts), "app", False)
            for text in procedures or ():
                # Each text's predicates are not echoed by register_task: key it by its own text.
                self._held.procedure(text, False, [f"text:{text}"])
        self._remember_allocation(result["allocation"])
        if memory is not None:
            memory.follow(result["allocation"])
        return result

    def update_task(self, name: str | None = None, **properties: Any) -> dict[str, Any]:
        params: dict[str, Any] = {"properties": properties}
        if name is not None:
            params["task"] = name
        result = self.call("update_task", params)
        with self._state_lock:
            task = self._held.tasks.get(result["task"])
            if task is not None:
                task["properties"].update(properties)
        return result

    def deregister_task(self, name: str | None = None) -> None:
        result = self.call("deregister_task", {} if name is None else {"task": name})
        with self._state_lock:
            self._held.tasks.pop(result["task"], None)
            self._task_handlers.pop(result["task"], None)
            self._allocations.pop(result["task"], None)

    def request_allocation(self, task: str | None = None) -> dict[str, Any]:
        """Recompute the global allocation now; returns this task's: epoch, cores, numa_nodes, memory_nodes."""
        result = self.call("request_allocation", {} if task is None else {"task": task})
        self._remember_allocation(result)
        return result

    def ack_allocation(self, *args: Any, task: str | None = None, epoch: int | None = None) -> list[int]:
        """Tell the RM `task` (None: this connection's only task) has moved off the cores taken from
        it up to `epoch`; returns the CPUs released.  The order is C's, ``cod_ack_allocation(c, task,
        epoch)``: ``ack_allocation("scan", 7)``, ``ack_allocation(epoch=7)``.  The old order, epoch
        first (``ack_allocation(7)``, ``ack_allocation(7, task="scan")``), still works, with a
        DeprecationWarning: an int first is an epoch, since a task name is a string."""
        task, epoch = _ack_arguments(args, task, epoch)
        params: dict[str, Any] = {"epoch": epoch}
        if task is not None:
            params["task"] = task
        return self.call("ack_allocation", params)["released"]

    def allocation(self, task: str | None = None) -> dict[str, Any] | None:
        """The latest allocation this client heard of for `task` (its only task by default)."""
        with self._allocation_changed:
            if task is None:
                if len(self._allocations) != 1:
                    return None if not self._allocations else self._allocations[sorted(self._allocations)[0]]
                return next(iter(self._allocations.values()))
            return self._allocations.get(task)

    def wait_allocation(self, task: str, min_epoch: int, timeout_s: float = 5.0) -> dict[str, Any]:
        """Block until an allocation of `task` with epoch >= `min_epoch` has arrived."""
        with self._allocation_changed:
            ok = self._allocation_changed.wait_for(
                lambda: self._allocations.get(task, {}).get("epoch", -1) >= min_epoch, timeout_s)
            if not ok:
                raise CodError(f"no allocation of {task} with epoch >= {min_epoch} within {timeout_s} s")
            return dict(self._allocations[task])

    def get_allocation(self, task: str | None = None) -> dict[str, Any]:
        return self.call("get_allocation", {} if task is None else {"task": task})

    def list_tasks(self) -> list[dict[str, Any]]:
        return self.call("list_tasks")["tasks"]

    def _remember_allocation(self, alloc: dict[str, Any]) -> None:
        with self._allocation_changed:
            old = self._allocations.get(alloc["task"])
            if old is None or alloc.get("epoch", 0) >= old.get("epoch", 0):
                self._allocations[alloc["task"]] = dict(alloc)
            self._allocation_changed.notify_all()


    # ---- elastic groups: processes that do not speak COD (docs/elastic.md) ----------------
    def register_unmanaged(self, *, pid: int | list[int] | None = None, cgroup: str | None = None,
                           name: str | None = None, mode: str | None = None, min_cores: int | None = None,
                           max_cores: int | None = None, **settings: Any) -> dict[str, Any]:
        """Let the daemon give a process group (pids and their children, or a cgroup) cores as its
        load asks (the elastic Petri net).  The group outlives this connection: it stays until its
        processes are gone or `deregister_unmanaged` removes it.  Returns the group's description."""
        params: dict[str, Any] = {k: v for k, v in (("name", name), ("cgroup", cgroup), ("mode", mode),
                                                     ("min_cores", min_cores), ("max_cores", max_cores)) if v is not None}
        if isinstance(pid, list):
            params["pids"] = pid
        elif pid is not None:
            params["pid"] = pid
        params.update(settings)
        return self.call("register_unmanaged", params)

    def deregister_unmanaged(self, *, name: str | None = None, pid: int | None = None,
                             cgroup: str | None = None) -> dict[str, Any]:
        """Stop managing a group (by name, by one of its pids, or by its cgroup); its processes get
        their CPU affinity back.  Returns its last description and the periods the daemon kept."""
        params = {k: v for k, v in (("name", name), ("pid", pid), ("cgroup", cgroup)) if v is not None}
        return self.call("deregister_unmanaged", params)


def _ack_arguments(args: tuple[Any, ...], task: Any, epoch: Any) -> tuple[str | None, int]:
    """(task, epoch) of ack_allocation(*args, task=, epoch=): (task, epoch) positionally as C's, or the
    deprecated order, epoch first (an int first: a task name is a string)."""
    if len(args) > 2:
        raise TypeError(f"ack_allocation() takes a task and an epoch, {len(args)} arguments given")
    named = {"task": task, "epoch": epoch}
    if args and isinstance(args[0], int) and not isinstance(args[0], bool):
        warnings.warn("ack_allocation(epoch, task): the order is now (task, epoch), as C's cod_ack_allocation; "
                      "write ack_allocation(task, epoch) or ack_allocation(epoch=N)", DeprecationWarning, stacklevel=3)
        args = (args[1], args[0]) if len(args) == 2 else (None, args[0])
        names = ("task", "epoch")
    else:
        names = ("task", "epoch")[:len(args)]
    for name, value in zip(names, args):
        if named[name] is not None and value is not None:
            raise TypeError(f"ack_allocation() got two values for {name}")
        named[name] = value if value is not None else named[name]
    task, epoch = named["task"], named["epoch"]
    if epoch is None:
        raise TypeError("ack_allocation() needs the epoch: ack_allocation(task, epoch) or ack_allocation(epoch=N)")
    if task is not None and not isinstance(task, str):
        raise TypeError(f"ack_allocation(): task must be a task name (str) or None, not {type(task).__name__}")
    if not isinstance(epoch, int) or isinstance(epoch, bool):
        raise TypeError(f"ack_allocation(): epoch must be an int, not {type(epoch).__name__}")
    return task, epoch


def _following(memory: MemoryRanges, handler: Handler | None) -> Handler:
    """A handler that binds ``memory`` to the upcall's memory nodes, then runs ``handler``."""
    def on_allocation(event: dict[str, Any]) -> None:
        memory.follow(event)
        if handler is not None:
            handler(event)
    return on_allocation

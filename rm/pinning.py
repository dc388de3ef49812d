"""Carrying out CPU sets on processes: the one place the service side calls the enforcement backend.

Which CPUs a task gets is decided elsewhere (the allocator, the epochs); this
module chooses its memory nodes on them (:mod:`.memory_nodes`: the nodes of its CPUs, or more
when its working set does not fit there, with the reason), confines its processes there
(:class:`cod.rm.enforce.Enforcer`), gives
them back their affinity, and turns an enforcement failure into a log line (for
a task already admitted) or a refusal (for a newcomer, whose registration then
changes nothing).
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Mapping
from typing import Iterable, Protocol

from cod.facts.model import Machine
from cod.protocol import jsonrpc as rpc
from cod.protocol.jsonrpc import RpcError

from .enforce import livestate
from .enforce.backend import Enforcer
from .memory_nodes import MemoryChoice, choose_memory_nodes
from .registry import Task

log = logging.getLogger("cod.rm")

FULL = (errno.ENOSPC, errno.EDQUOT)
MEMORY_CHOICES_KEPT = 4  # memory-node choices kept per task (one per CPU set)


class Pinnable(Protocol):
    """What an elastic group offers to be pinned (cod.rm.demands.Demand)."""

    name: str

    def pin(self, cpus: tuple[int, ...]) -> None: ...
    def release(self) -> None: ...


class Pinning:
    def __init__(self, machine: Machine, enforcer: Enforcer, state_dir: str | None = None,
                 free_memory: Callable[[], Mapping[int, int]] = livestate.node_free_bytes) -> None:
        self.enforcer = enforcer
        self.state_dir = state_dir
        self.node_of = {pu.id: pu.numa_node for pu in machine.pus}
        self.distances = {n.id: dict(n.distances) for n in machine.numa_nodes}
        self.free_memory = free_memory  # free bytes per node now (the live state's reader)
        self.closed = False  # after close() nothing is pinned any more
        # task -> {its CPUs: their choice}: the CPUs pinned and those announced may differ for a
        # while (CPUs being given back), so the last few sets are kept, not only one.
        self._memory: dict[str, dict[tuple[int, ...], MemoryChoice]] = {}

    def memory(self, task: Task, cpus: Iterable[int]) -> MemoryChoice:
        """The task's memory nodes on ``cpus`` (:func:`.memory_nodes.choose_memory_nodes`).  Chosen
        once per CPU set of the task, so that what is enforced and what the task is told (its
        allocation's ``memory_nodes``) are the same nodes; a choice that is not its CPUs' nodes is logged."""
        cpus = tuple(sorted(cpus))
        known = self._memory.setdefault(task.name, {})
        if cpus in known:
            return known[cpus]
        choice = self._choose(task, cpus)
        if choice.reason:
            log.info("task %s: memory nodes %s: %s", task.name, ",".join(map(str, choice.nodes)), choice.reason)
        if len(known) >= MEMORY_CHOICES_KEPT:
            known.pop(next(iter(known)))  # the oldest
        known[cpus] = choice
        return choice

    def _choose(self, task: Task, cpus: tuple[int, ...]) -> MemoryChoice:
        per_node: dict[int, int] = {}
        for c in cpus:
            if (n := self.node_of.get(c)) is not None:
                per_node[n] = per_node.get(n, 0) + 1
        ws = getattr(task.spec, "working_set_bytes", 0) or 0
        if not ws or not per_node:
            return MemoryChoice(tuple(sorted(per_node)))
        try:
            free: Mapping[int, int | None] = self.free_memory()
        except OSError as err:
            log.debug("free memory per node not readable (%s): task %s's memory nodes are its CPUs'", err, task.name)
            free = {}
        own: dict[int, int] = {}
        for pid in task.pids():
            for n, b in (livestate.numa_bytes(pid) or {}).items():
                own[n] = own.get(n, 0) + b
        return choose_memory_nodes(per_node, ws, free, own, self.distances)

    def pin(self, task: Task, cpus: tuple[int, ...]) -> bool:
        """Confine an admitted task to ``cpus`` (a failure is logged); True when it was pinned."""
        if self.closed or not task.pids():  # closed, or a client enforces it
            return False
        if not cpus:
            log.debug("task %s holds no CPU yet; not pinning it", task.name)
            return False
        try:
            live = self.enforcer.apply(task.name, task.pids(), cpus, self.memory(task, cpus).nodes)
            task.children.intersection_update(live)
        except Exception as err:
            log.warning("enforcing the allocation of %s (pid %d) failed: %s", task.name, task.pid, err)
            return False
        return True

    def pin_or_refuse(self, task: Task, cpus: tuple[int, ...]) -> None:
        """Confine a newcomer, or refuse it (and undo what was done) with an RpcError saying why."""
        if not cpus or not task.pids():
            return  # its cores are still being given back by others (pinned when it gets them), or a client pins it
        try:
            self.enforcer.apply(task.name, task.pids(), cpus, self.memory(task, cpus).nodes)
        except Exception as err:
            self.release(task)
            raise self.refusal(task, err) from None

    def refusal(self, task: Task, err: Exception) -> RpcError:
        full = _os_error(err)
        if full is not None and full.errno in FULL:
            where = self.state_dir or getattr(getattr(self.enforcer, "state", None), "dir", None) or "?"
            return RpcError(rpc.ADMISSION_REFUSED,
                            f"cannot pin task {task.name!r}: the daemon's state directory {where} is full "
                            f"({full.strerror}); nothing was changed. Free space there and register again",
                            {"state_dir": where, "errno": full.errno})
        return RpcError(rpc.INTERNAL_ERROR if not isinstance(err, OSError) else rpc.PERMISSION_DENIED,
                        f"cannot pin task {task.name!r} (pid {task.pid}): {err}")

    def release(self, task: Task) -> None:
        self._memory.pop(task.name, None)
        try:
            self.enforcer.release(task.name)
        except Exception as err:
            log.warning("releasing %s (pid %d) failed: %s", task.name, task.pid, err)

    def pin_group(self, group: Pinnable, cpus: tuple[int, ...]) -> None:
        if self.closed:
            return
        try:
            group.pin(cpus)
        except Exception as err:
            log.warning("enforcing the allocation of elastic group %s failed: %s", group.name, err)

    def release_group(self, group: Pinnable) -> None:
        try:
            group.release()
        except Exception as err:
            log.warning("releasing elastic group %s failed: %s", group.name, err)

    def pin_threads(self, name: str, targets: dict[int, tuple[int, ...]]) -> None:
        try:
            self.enforcer.pin_threads(name, targets)
        except Exception as err:
            log.warning("pinning the operator threads of %s: %s", name, err)


def _os_error(err: BaseException | None) -> OSError | None:
    """The OSError behind ``err`` (itself, or its cause or context), if any."""
    seen = 0
    while err is not None and seen < 8:
        if isinstance(err, OSError):
            return err
        err = err.__cause__ or err.__context__
        seen += 1
    return None

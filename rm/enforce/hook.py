"""Adapter from the RM's per-pid hook (`cod.rm.enforcement.EnforcementHook`:
``apply(task, pid, cpus, mems)``, ``release(task, pid)``) to an `Enforcer`,
which works on a task's whole set of pids.  Structural: nothing imported from
the RM, so either side can change its module layout freely."""

from __future__ import annotations

from .backend import Enforcer


class EnforcerHook:
    def __init__(self, enforcer: Enforcer) -> None:
        self.enforcer = enforcer
        self._pids: dict[str, set[int]] = {}
        self._where: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}

    def apply(self, task: str, pid: int, cpus: tuple[int, ...], mems: tuple[int, ...]) -> None:
        pids = self._pids.setdefault(task, set())
        pids.add(pid)
        self._where[task] = (tuple(cpus), tuple(mems))
        live = self.enforcer.apply(task, sorted(pids), cpus, mems)
        pids.intersection_update(live)

    def release(self, task: str, pid: int) -> None:
        pids = self._pids.get(task, set())
        pids.discard(pid)
        if pids:
            cpus, mems = self._where[task]
            self.enforcer.apply(task, sorted(pids), cpus, mems)  # gives `pid` its own mask back
        else:
            self._pids.pop(task, None)
            self._where.pop(task, None)
            self.enforcer.release(task)

"""Affinity enforcement: ``sched_setaffinity`` on every thread of a task.

`AffinityEnforcer` is the backend that does nothing more than pin threads
(:mod:`.pinning`); the record of original affinity it shares with the cpuset
backends is `RecordingEnforcer` (:mod:`.recording`).
"""

from __future__ import annotations

from collections.abc import Mapping

from cod.facts import procfs

from .cgroupfs import MOUNTS, find_cpuset_mount
from .cpuset import cpuset_scope
from .pinning import pin_process
from .recording import RecordingEnforcer


class AffinityEnforcer(RecordingEnforcer):
    """Pins threads with sched_setaffinity.  With ``memory_migrate`` the pages a task holds are
    moved to its nodes (by pid, in bounded batches, in the background); where new pages go is the kernel's first
    touch on the pinned CPUs, or the policy the process sets (docs/design-enforce.md)."""

    name = "affinity"

    def __init__(self, state_dir: str, proc: str = procfs.PROC, memory_migrate: bool = False,
                 cgroup_parent: str = "cod", mounts: str = MOUNTS) -> None:
        # It makes no cgroup, but cleans up those of a crashed cpuset run under the same parent.
        mount = find_cpuset_mount(mounts)
        super().__init__(state_dir, proc, memory_migrate=memory_migrate,
                         cgroups=cpuset_scope(mount, cgroup_parent) if mount is not None else None)

    def describe(self) -> str:
        extra = "; pages follow in batches" if self.memory_migrate else ""
        return f"affinity (sched_setaffinity on every thread; no cgroups{extra})"

    def _enforce(self, task: str, pids: list[int], cpus: tuple[int, ...], mems: tuple[int, ...],
                 placements: Mapping[int, Mapping[int, tuple[int, ...]]]) -> list[int]:
        pinned = [p for p in pids if pin_process(p, cpus, self.proc, placements.get(p))]
        self._move_memory(task, pinned, mems)  # in the background
        return pinned

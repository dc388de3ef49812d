"""The enforcement interface the RM's policy calls, and the choice of backend.

Policy (the allocator, the RM) never calls the kernel: it hands an `Enforcer`
a task name, its pids and the CPUs/memory nodes it should have.  Backends:

* ``affinity`` -- `AffinityEnforcer`: sched_setaffinity on every thread;
* ``cpuset``   -- `CpusetV1Enforcer` / `CpusetV2Enforcer`: a cgroup per task;
* ``sched_ext`` -- `ScxEnforcer`: the maps of the BPF scheduler scx_cod, with cpuset (else
  affinity) as its fallback whenever the scheduler is not running;
* ``none``     -- `NullEnforcer`: records nothing, changes nothing.

`detect()` picks one from the ``--enforce`` mode and what this process may do,
and returns a one-line description for the log.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from cod.facts import procfs

from .affinity import AffinityEnforcer
from .cgroupfs import MOUNTS, find_cpuset_mount
from .cpuset import CpusetV1Enforcer, CpusetV2Enforcer
from .errors import EnforceError
from .modes import MODES, split_mode
from .recording import SteadyMechanism, check_task_name

log = logging.getLogger("cod.rm.enforce")



@runtime_checkable
class Enforcer(Protocol):
    name: str

    def describe(self) -> str: ...

    def check(self) -> bool:
        """Follow a mechanism that can go away (sched_ext's scheduler): True when the one in
        force changed.  The monitor calls it every live-state period."""

    def degraded(self) -> str | None:
        """A warning while the mechanism in force is not the one asked for; else None."""

    def apply(self, task: str, pids: Sequence[int], cpus: Sequence[int], mems: Sequence[int]) -> list[int]:
        """Confine the task's pids (all threads) to cpus/mems; returns the live pids."""

    def add_thread(self, task: str, tid: int) -> bool:
        """Confine a thread/child born after apply(); False when it is already gone."""

    def follow_thread(self, task: str, tid: int) -> bool:
        """Give a thread born inside an applied task (it inherited the task's CPUs) the task's
        CPUs now, without recording it for the restore (a short-lived child costs no state-file
        write; add_thread records it once it lives on); False when it is already gone."""

    def pin_threads(self, task: str, targets: Mapping[int, Sequence[int]]) -> list[int]:
        """Narrow single threads of an applied task to subsets of its CPUs (a plan deployment);
        returns the tids pinned.  The next apply() gives them the task's whole set again."""

    def forget_pid(self, task: str, pid: int) -> None:
        """The pid exited: drop its record."""

    def release(self, task: str) -> None:
        """Restore original affinity/cgroup of the task's processes; idempotent."""

    def moving(self, task: str) -> bool:
        """The task's pages are being moved to its nodes (in the background, after apply())."""

    def cleanup_stale(self) -> list[str]:
        """Undo what a crashed previous run left behind; one line per action."""

    def close(self) -> None:
        """Release every task and free the state directory."""


class NullEnforcer(SteadyMechanism):
    """``--enforce none``: the RM computes plans and notifies, the kernel is untouched."""

    name = "none"

    def __init__(self) -> None:
        self._tasks: dict[str, list[int]] = {}

    def describe(self) -> str:
        return "none (plans are computed and notified, nothing is pinned)"

    def apply(self, task: str, pids: Sequence[int], cpus: Sequence[int], mems: Sequence[int]) -> list[int]:
        check_task_name(task)
        self._tasks[task] = list(pids)
        return [p for p in pids if procfs.alive(p)]

    def add_thread(self, task: str, tid: int) -> bool:
        return procfs.alive(tid)

    def follow_thread(self, task: str, tid: int) -> bool:
        return procfs.alive(tid)

    def pin_threads(self, task: str, targets: Mapping[int, Sequence[int]]) -> list[int]:
        return []

    def forget_pid(self, task: str, pid: int) -> None:
        if pid in self._tasks.get(task, []):
            self._tasks[task].remove(pid)

    def release(self, task: str) -> None:
        self._tasks.pop(task, None)

    def moving(self, task: str) -> bool:
        return False

    def cleanup_stale(self) -> list[str]:
        return []

    def close(self) -> None:
        self._tasks.clear()


def is_root() -> bool:
    return os.geteuid() == 0


def default_state_dir() -> str:
    """``/run/cod`` as root; else ``$XDG_RUNTIME_DIR/cod`` (or ``/tmp/cod-UID``)."""
    if is_root():
        return "/run/cod"
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return os.path.join(runtime, "cod") if runtime else f"/tmp/cod-{os.getuid()}"


def detect(mode: str, state_dir: str, *, root: bool | None = None, cgroup_parent: str = "cod",
           memory_migrate: bool = False, exclusive: bool = False, mounts: str = MOUNTS,
           supervisor=None) -> Enforcer:
    """The backend for ``mode`` (one of modes.MODES), falling back when not allowed.

    ``cpuset`` without root or without a cpuset controller falls back to
    ``affinity`` (logged once, with the reason).  ``sched_ext`` modes hold a fallback
    (the one named, else cpuset) for while scx_cod is not running; ``supervisor`` is the
    loader the daemon started (cod.rm.enforce.scxsupervisor).  The returned enforcer's
    ``describe()`` names the backend and cgroup version for the start-up log.
    """
    if mode not in MODES:
        raise EnforceError(f"unknown enforcement mode {mode!r}; choose one of {', '.join(MODES)}")
    root = is_root() if root is None else root
    primary, asked = split_mode(mode)
    if mode == "none":
        enforcer: Enforcer = NullEnforcer()
    elif primary == "sched_ext":
        from .scx import ScxEnforcer
        fallback = detect(asked or "cpuset", state_dir, root=root, cgroup_parent=cgroup_parent,
                          memory_migrate=memory_migrate, exclusive=exclusive, mounts=mounts)
        enforcer = ScxEnforcer(fallback, supervisor=supervisor, fallback_asked=asked is not None)
    elif mode == "cpuset":
        mount = find_cpuset_mount(mounts) if root else None
        if not root:
            log.warning("enforce=cpuset needs root to write cgroups; falling back to affinity")
            enforcer = AffinityEnforcer(state_dir, memory_migrate=memory_migrate, cgroup_parent=cgroup_parent,
                                        mounts=mounts)
        elif mount is None:
            log.warning("enforce=cpuset: no cpuset controller mounted (v1 or v2); falling back to affinity")
            enforcer = AffinityEnforcer(state_dir, memory_migrate=memory_migrate, cgroup_parent=cgroup_parent,
                                        mounts=mounts)
        else:
            cls = CpusetV1Enforcer if mount.version == 1 else CpusetV2Enforcer
            enforcer = cls(mount, state_dir, parent=cgroup_parent,
                           memory_migrate=memory_migrate, exclusive=exclusive)
    else:
        enforcer = AffinityEnforcer(state_dir, memory_migrate=memory_migrate, cgroup_parent=cgroup_parent,
                                    mounts=mounts)
    log.info("enforcement: %s", enforcer.describe())
    return enforcer

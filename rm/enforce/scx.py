"""``--enforce sched_ext``: the allocation carried out by the BPF scheduler ``scx_cod``.

`ScxEnforcer` speaks the `Enforcer` protocol.  While scx_cod runs (`scxmaps.scheduler_state`),
a task is a group in the scheduler's maps: ``apply`` writes the group's CPUs and its
processes' tgids, and the CPUs nobody reserved as group 0 (every other task), then kicks
the CPUs; no thread's mask is rewritten, and a newcomer is never scheduled on a reserved CPU.
A child process joins its parent's group in the scheduler itself, at fork.

Memory nodes are not the scheduler's business: while it runs, ``mems`` are recorded, not
enforced (cpuset mode binds memory).

When the scheduler is absent at the start, or goes away (its loader killed or stopped, the
kernel's watchdog or SysRq-S ejecting it), `check()` (the RM calls it every live-state
period) hands every task to the fallback enforcer (cpuset, else affinity) and logs it; when
it comes back, the tasks return to it.  `describe()` says which is in force, `degraded()` says
so as a warning while the fallback holds the tasks.  Where the daemon started the loader
(`supervisor`, cod.rm.enforce.scxsupervisor), `check()` has it restarted.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence

from cod.facts import procfs

from ..names import other_pid
from .errors import EnforceError
from .recording import check_task_name
from .scxmaps import MAX_GROUPS, PIN_DIR, ScxMaps, scheduler_state
from .scxsupervisor import ScxSupervisor

log = logging.getLogger("cod.rm.enforce")


def others_cpus(all_cpus: Sequence[int], tasks: Mapping[str, Sequence[int]]) -> list[int]:
    """Group 0's CPUs (every task nobody registered): those no registered task reserved; all of
    them when registered tasks reserved every CPU (nothing else could run otherwise).  A busy
    process the RM confined (``other.PID``, cod.rm.busy) reserves nothing: its CPUs are the ones
    kept for unregistered work, so a newcomer goes there too, never onto a registered task's."""
    reserved = {c for task, cpus in tasks.items() if other_pid(task) is None for c in cpus}
    return [c for c in all_cpus if c not in reserved] or list(all_cpus)


class ScxEnforcer:
    name = "sched_ext"

    def __init__(self, fallback, pin_dir: str = PIN_DIR, sched_ext: str | None = None, *,
                 supervisor: ScxSupervisor | None = None, fallback_asked: bool = True) -> None:
        self.fallback = fallback
        self.supervisor = supervisor
        self.fallback_asked = fallback_asked  # --enforce sched_ext,cpuset: the fallback is no surprise
        self.pin_dir = pin_dir
        self._state_args = () if sched_ext is None else (sched_ext,)
        self.maps: ScxMaps | None = None
        self.why_not: str | None = "not checked yet"
        self.tasks: dict[str, tuple[list[int], tuple[int, ...], tuple[int, ...]]] = {}
        self.groups: dict[str, int] = {}
        self.all_cpus = sorted(os.sched_getaffinity(0))
        self.check()

    # ---- which mechanism is in force ----------------------------------------------------
    @property
    def active(self) -> bool:
        return self.maps is not None

    def describe(self) -> str:
        if self.active:
            return f"sched_ext (scheduler scx_cod, maps in {self.pin_dir}; memory nodes not bound)"
        return f"sched_ext unavailable ({self.why_not}): fallback {self.fallback.describe()}"

    def degraded(self) -> str | None:
        """While the fallback holds the tasks: the warning for get_topology, :status and the log."""
        if self.active:
            return None
        gave_up = self.supervisor.gave_up if self.supervisor is not None else None
        restarting = "; the daemon is restarting scx_cod" if self.supervisor is not None and not gave_up else ""
        return (f"sched_ext is not in force ({gave_up or self.why_not}): the tasks are enforced by "
                f"{self.fallback.describe()}{restarting}")

    def moving(self, task: str) -> bool:
        # Pages move only under the fallback (the scheduler does not bind memory).
        return False if self.active else self.fallback.moving(task)

    def check(self) -> bool:
        """Follow the scheduler: hand the tasks to the fallback when it went away (and have the
        daemon's loader restarted), take them back when it came.  True when the mechanism in
        force changed."""
        changed = self._follow()
        if not self.active and self.supervisor is not None:
            self.supervisor.restart()
        return changed

    def _follow(self) -> bool:
        why = scheduler_state(*self._state_args)
        if why is None and not self.active:
            try:
                maps = ScxMaps(self.pin_dir)
            except EnforceError as err:
                why = str(err)
            else:
                self._to_scheduler(maps)
                return True
        if why is not None and (self.active or self.why_not != why):
            was_active = self.active
            self.why_not = why
            if was_active:
                if self.supervisor is not None:
                    self.why_not = f"{why}; {self.supervisor.exited()}"
                self._to_fallback()
                return True
        return False

    def _to_scheduler(self, maps: ScxMaps) -> None:
        self.maps, self.why_not = maps, None
        for task in list(self.tasks):
            self.fallback.release(task)
        self._clear_maps()
        for task, (pids, cpus, _mems) in self.tasks.items():
            self._write(task, pids, cpus)
        self._write_others()
        log.warning("enforcement: the sched_ext scheduler scx_cod runs: %d task(s) now enforced by it", len(self.tasks))

    def _to_fallback(self) -> None:
        if self.maps is not None:
            self.maps.close()
        self.maps = None
        (log.warning if self.fallback_asked else log.error)(
            "enforcement: %s; falling back to %s for %d task(s)", self.why_not, self.fallback.describe(),
            len(self.tasks))
        for task, (pids, cpus, mems) in self.tasks.items():
            try:
                self.fallback.apply(task, pids, cpus, mems)
            except EnforceError as err:
                log.error("fallback for %s: %s", task, err)

    # ---- the maps -------------------------------------------------------------------------
    def _clear_maps(self) -> None:
        assert self.maps is not None
        for tgid in self.maps.tgids():
            self.maps.delete_tgid(tgid)
        for cgid in self.maps.cgroups():
            self.maps.delete_cgroup(cgid)
        for g in range(1, MAX_GROUPS):
            self.maps.set_group_cpus(g, [])
        self.maps.set_group_cpus(0, self.all_cpus)

    def _group(self, task: str) -> int:
        if task in self.groups:
            return self.groups[task]
        free = sorted(set(range(1, MAX_GROUPS)) - set(self.groups.values()))
        if not free:
            raise EnforceError(f"scx_cod has room for {MAX_GROUPS - 1} tasks; {task!r} is one too many")
        self.groups[task] = free[0]
        return free[0]

    def _write(self, task: str, pids: Sequence[int], cpus: Sequence[int]) -> None:
        assert self.maps is not None
        g = self._group(task)
        self.maps.set_group_cpus(g, cpus)
        for pid in pids:
            self.maps.set_tgid(pid, g)

    def _write_others(self) -> None:
        assert self.maps is not None
        self.maps.set_group_cpus(0, others_cpus(self.all_cpus, {t: cpus for t, (_p, cpus, _m) in self.tasks.items()}))
        self.maps.kick()

    def _guard(self, what: str, fn):
        """Run a map operation; a failure means the scheduler went away: fall back, then False."""
        try:
            fn()
            return True
        except EnforceError as err:
            log.warning("sched_ext: %s failed (%s)", what, err)
            self.check()
            if self.active:
                raise
            return False

    # ---- the Enforcer protocol ------------------------------------------------------------
    def apply(self, task: str, pids: Sequence[int], cpus: Sequence[int], mems: Sequence[int]) -> list[int]:
        check_task_name(task)
        if not cpus:
            raise EnforceError(f"task {task!r}: no CPUs to run on")
        live = [p for p in pids if procfs.alive(p)]
        self.tasks[task] = (list(live), tuple(cpus), tuple(mems))
        if self.active and self._guard(f"applying {task}", lambda: (self._write(task, live, cpus), self._write_others())):
            return live
        return self.fallback.apply(task, live, cpus, mems)

    def add_thread(self, task: str, tid: int) -> bool:
        if task not in self.tasks:
            return False
        if not procfs.alive(tid):
            return False
        if not self.active:
            return self.fallback.add_thread(task, tid)
        # A thread shares its process's tgid; a child process got its parent's group at fork.
        # Recording it as the task's is what lets a fallback confine it too.
        pids = self.tasks[task][0]
        if procfs.is_process(tid) and tid not in pids:
            pids.append(tid)
            self._guard(f"adding {tid} to {task}", lambda: self.maps and self.maps.set_tgid(tid, self._group(task)))
        return True

    def follow_thread(self, task: str, tid: int) -> bool:
        return self.add_thread(task, tid) if self.active else self.fallback.follow_thread(task, tid)

    def pin_threads(self, task: str, targets: Mapping[int, Sequence[int]]) -> list[int]:
        if not self.active:
            return self.fallback.pin_threads(task, targets)
        pinned = []
        for tid, cpus in targets.items():  # a thread's own affinity narrows its group's CPUs
            try:
                os.sched_setaffinity(tid, cpus)
                pinned.append(tid)
            except OSError:
                pass
        return pinned

    def forget_pid(self, task: str, pid: int) -> None:
        entry = self.tasks.get(task)
        if entry is not None and pid in entry[0]:
            entry[0].remove(pid)
        if self.active and self.maps is not None:
            self.maps.delete_tgid(pid)
        else:
            self.fallback.forget_pid(task, pid)

    def release(self, task: str) -> None:
        entry = self.tasks.pop(task, None)
        group = self.groups.pop(task, None)
        if self.active and self.maps is not None and group is not None:
            def drop() -> None:
                assert self.maps is not None
                for tgid, g in self.maps.tgids().items():
                    if g == group:
                        self.maps.delete_tgid(tgid)
                self.maps.set_group_cpus(group, [])
                self._write_others()
            self._guard(f"releasing {task}", drop)
        if entry is not None:
            self.fallback.release(task)

    def cleanup_stale(self) -> list[str]:
        done = self.fallback.cleanup_stale()
        if self.active and self.maps is not None and (self.maps.tgids() or self.maps.cgroups()):
            self._clear_maps()
            done.append("sched_ext: cleared the previous run's groups in scx_cod's maps")
        return done

    def close(self) -> None:
        for task in list(self.tasks):
            self.release(task)
        if self.maps is not None:
            self.maps.set_group_cpus(0, self.all_cpus)
            self.maps.close()
            self.maps = None
        if self.supervisor is not None:
            self.supervisor.stop()  # after the maps: the kernel then reports sched_ext disabled
        self.fallback.close()

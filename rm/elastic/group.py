"""Who is in an elastic group: a cgroup, or a list of pids with their future children.

* `CgroupGroup` -- every process in a cgroup (v1 or v2), read from its
  ``cgroup.procs`` each period; the kernel keeps children in it.  It also
  offers the cgroup's own CPU counter (v2 ``cpu.stat`` usage_usec, v1
  ``cpuacct.usage``) when there is one, which counts processes too short-lived
  to be seen.  A removed cgroup ends the group (`GroupGone`).
* `PidTreeGroup` -- the given processes and every process they fork, found
  from process events (the proc connector or the /proc poller of
  `cod.rm.enforce.procevents`) and, at start or after lost events, by walking
  /proc's parent links.  When its last process exits the group ends.

Processes are identified by (pid, start time), so a recycled pid is not taken
for a member.  Neither class changes anything: they only look.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cod.facts import procfs
from cod.rm.enforce.cgroupfs import MOUNTS, cgroup_mounts
from cod.rm.enforce.helddir import HeldDir, PathRefused
from cod.rm.enforce.procevents import ProcEvent

from .errors import ElasticError, GroupGone


@dataclass(frozen=True)
class Member:
    pid: int
    start: int  # clock ticks after boot: with the pid, the identity
    ppid: int


def _member(pid: int, proc: str) -> Member | None:
    try:
        st = procfs.read_stat(pid, proc=proc)
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return None
    if st.is_kernel_thread:
        return None
    return Member(pid, st.start_time, st.ppid)


def cgroup_mount_of(path: str, mounts: str = MOUNTS) -> str | None:
    """The cgroup (v1 or v2) mount point that holds ``path`` (a resolved path), or None.

    A directory that merely holds a file named ``cgroup.procs`` is not a cgroup: its "members"
    would be whatever pids its author wrote there."""
    held = [point for point, _, _ in cgroup_mounts(mounts) if os.path.commonpath([point, path]) == point]
    return max(held, key=len, default=None)


class CgroupGroup:
    """Every process of one cgroup, read through the cgroup's directory held open (`HeldDir`):
    the cgroup whose owner the daemon checked is the one it reads, whatever the path names later."""

    kind = "cgroup"

    def __init__(self, path: str, proc: str = procfs.PROC) -> None:
        try:
            held = HeldDir.open(path if os.path.isabs(path) else os.path.abspath(path))
        except PathRefused as err:
            raise ElasticError(str(err)) from None
        try:
            if not held.has_file("cgroup.procs"):
                raise ElasticError(f"{held.path} is not a cgroup directory (no cgroup.procs)")
            if cgroup_mount_of(held.path) is None:
                raise ElasticError(f"{held.path} is not in a cgroup filesystem (see /proc/self/mounts)")
        except BaseException:
            held.close()
            raise
        self.dir = held
        self.path = held.path
        self.identity = held.identity
        self.proc = proc
        self.version = 2 if held.has_file("cgroup.controllers") else 1
        counter = "cpu.stat" if self.version == 2 else "cpuacct.usage"
        self._counter = counter if held.has_file(counter) else None
        self._members: dict[int, Member] = {}

    def owner_uid(self) -> int:
        """Whose cgroup it is (the uid it is delegated to): the owner of the directory held."""
        return self.dir.owner_uid()

    def close(self) -> None:
        self.dir.close()

    def describe(self) -> str:
        source = "its CPU counter" if self._counter else "its processes' /proc counters"
        return f"cgroup v{self.version} {self.path} (CPU time from {source})"

    def fact_source(self) -> tuple[str, object]:
        return ("cgroup", self.path)

    def _read(self, name: str) -> str:
        try:  # os.read through the held directory: cheap enough for every period
            return self.dir.read(name).decode()
        except FileNotFoundError as err:
            raise GroupGone(f"cgroup {self.path} disappeared") from err
        except OSError as err:
            if err.errno in (errno.ENODEV, errno.ENOENT, errno.EBADF):
                raise GroupGone(f"cgroup {self.path} disappeared") from err
            raise ElasticError(f"cannot read {self.path}/{name}: {err.strerror}") from err

    def members(self) -> list[Member]:
        """The processes of the cgroup now (an empty cgroup is a group with no members).

        A pid seen before is not read again: the kernel removes a process from the cgroup when
        it exits, and the meter compares start times where it reads /proc anyway."""
        pids = sorted({int(x) for x in self._read("cgroup.procs").split()})
        known: dict[int, Member] = {}
        for pid in pids:
            m = self._members.get(pid)
            if m is None:
                m = _member(pid, self.proc)
            if m is not None:
                known[pid] = m
        self._members = known
        return list(known.values())

    def pids(self) -> set[int]:
        """Its processes now, cheaply (``cgroup.procs`` only; empty once the cgroup is gone)."""
        try:
            return {int(x) for x in self._read("cgroup.procs").split()}
        except ElasticError:
            return set(self._members)

    def cpu_usage_s(self) -> float | None:
        """The cgroup's cumulative CPU time in seconds; None without a counter."""
        if self._counter is None:
            return None
        text = self._read(self._counter)
        if self.version == 1:
            return int(text.strip()) / 1e9
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
        return None

    def on_events(self, events: Iterable[ProcEvent]) -> None:
        """The kernel keeps the cgroup's membership; events change nothing here."""

    def forget(self, pid: int) -> None:
        self._members.pop(pid, None)


class PidTreeGroup:
    kind = "pids"

    def __init__(self, roots: Sequence[int], proc: str = procfs.PROC) -> None:
        if not roots:
            raise ElasticError("a pid group needs at least one pid")
        self.proc = proc
        self.roots = tuple(sorted(set(roots)))
        self._members: dict[int, Member] = {}
        for pid in self.roots:
            if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
                raise ElasticError(f"{pid!r} is not a process id")
            m = _member(pid, proc)
            if m is None:
                raise ElasticError(f"process {pid} does not exist (or is a kernel thread)")
            self._members[pid] = m
        self.rescan()

    def describe(self) -> str:
        return f"pids {','.join(map(str, self.roots))} and their children"

    def fact_source(self) -> tuple[str, object]:
        return ("pids", list(self.roots))

    def rescan(self) -> None:
        """Add every live descendant of a member, walking /proc's parent links once."""
        children: dict[int, list[Member]] = {}
        for pid in procfs.pids(self.proc):
            m = _member(pid, self.proc)
            if m is not None:
                children.setdefault(m.ppid, []).append(m)
        todo = list(self._members)
        while todo:
            for child in children.get(todo.pop(), ()):
                if child.pid not in self._members:
                    self._members[child.pid] = child
                    todo.append(child.pid)

    def on_events(self, events: Iterable[ProcEvent]) -> None:
        """Follow forks (new processes whose parent is a member) and exits."""
        rescan = False
        for ev in events:
            if ev.kind == "fork" and not ev.is_thread:
                parent = ev.parent_tgid
                if parent == 0:  # the poller does not know parents: ask /proc
                    m = _member(ev.pid, self.proc)
                    if m is not None and m.ppid in self._members:
                        self._members[m.pid] = m
                elif parent in self._members and ev.pid not in self._members:
                    m = _member(ev.pid, self.proc)
                    if m is not None and m.ppid == parent:
                        self._members[m.pid] = m
            elif ev.kind == "exit" and not ev.is_thread:
                self._members.pop(ev.pid, None)
            elif ev.kind == "overrun":
                rescan = True
        if rescan:
            self.rescan()

    def members(self) -> list[Member]:
        """The members still alive (checked against their start time)."""
        if not self._members:
            raise GroupGone(f"every process of group {self.describe()} has exited")
        return list(self._members.values())

    def pids(self) -> set[int]:
        """Its processes as last known (no I/O: process events keep it current)."""
        return set(self._members)

    def forget(self, pid: int) -> None:
        """The meter found ``pid`` gone (or reused); when nothing is left, the group is gone."""
        self._members.pop(pid, None)

    def cpu_usage_s(self) -> float | None:
        return None

    def close(self) -> None:
        """Nothing is held: a pid group reads /proc."""

"""What a group used in one sampling period: CPU time, run-queue delay, pages per node.

CPU time comes from the group's cgroup counter when it has one (exact, and it
counts processes too short-lived to be seen).  Otherwise it is summed over
the members' ``/proc/PID/stat``: utime + stime of all threads (exited ones
included) plus cutime + cstime, the children they reaped.  A process forked
and reaped between two samples is thus still counted, through its parent.
Double counting is avoided: when a member that a member will reap leaves,
its share moves to the reaper's cutime (what it had before it joined is not
counted); a member reaped by a non-member keeps what was seen of it.

Delay (for the ``cpu_demand`` metric) is the time the members' threads were
runnable but waiting for a CPU: taskstats per process (exited threads
included), or the live threads' ``schedstat`` without CAP_NET_ADMIN.

Every counter is cumulative; a sample is the difference with the previous
one.  The first sample is a baseline (interval 0).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from cod.facts import procfs
from cod.rm.enforce.livestate import numa_bytes

from .group import Member
from .taskstats import TaskstatsReader

BASE_PAGE = 4096


class Group(Protocol):
    kind: str

    def describe(self) -> str: ...
    def members(self) -> list[Member]: ...
    def forget(self, pid: int) -> None: ...
    def cpu_usage_s(self) -> float | None: ...


@dataclass(frozen=True)
class Sample:
    at: float  # time.time() of the sample
    interval_s: float  # since the previous sample (0 for the first)
    cpu_s: float  # CPU time used by the group in the interval
    delay_s: float | None  # run-queue wait of its threads in the interval (None: not measured)
    members: tuple[int, ...]  # its live processes


def boot_ticks() -> int:
    """Now, in the clock ticks since boot that /proc/PID/stat's start time uses."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * procfs.CLK_TCK)


@dataclass
class _Seen:
    start: int
    ppid: int
    value: int  # cumulative counter at the last sample
    offset: int  # what it had when it joined (0 if born in the group)


class _MemberCounter:
    """A group total built from per-process cumulative counters (see the module doc)."""

    def __init__(self) -> None:
        self._seen: dict[int, _Seen] = {}
        self._credit = 0  # contributions of members that left
        self._last_ticks = boot_ticks()

    def update(self, values: dict[int, tuple[int, int, int]], absorbed: bool) -> int:
        """``values``: pid -> (counter, start time, ppid) of every live member.

        ``absorbed``: a reaped member's counter moves into its parent's (CPU time
        does, delays do not).  Returns the group's cumulative counter."""
        now_ticks = boot_ticks()
        for pid, seen in list(self._seen.items()):
            v = values.get(pid)
            if v is not None and v[1] == seen.start:
                continue
            del self._seen[pid]  # left (or its pid was reused)
            if absorbed and seen.ppid in values and seen.ppid in self._seen:
                self._credit -= seen.offset  # the reaper's cutime takes all of it
            else:
                self._credit += seen.value - seen.offset
        total = self._credit
        for pid, (value, start, ppid) in values.items():
            seen = self._seen.get(pid)
            if seen is None:
                born_here = start >= self._last_ticks  # forked since the previous sample
                seen = self._seen[pid] = _Seen(start, ppid, value, 0 if born_here else value)
            seen.value = value
            total += value - seen.offset
        self._last_ticks = now_ticks
        return total


class GroupMeter:
    def __init__(self, group: Group, want_delay: bool = False, taskstats: TaskstatsReader | None = None,
                 proc: str = procfs.PROC, clock: Callable[[], float] = time.monotonic) -> None:
        self.group = group
        self.want_delay = want_delay
        self.taskstats = taskstats
        self.proc = proc
        self.clock = clock
        self._cpu = _MemberCounter()
        self._delay = _MemberCounter()
        self._prev: tuple[float, float, float | None] | None = None  # (at, cpu_s, delay_s)

    def sample(self) -> Sample:
        """Measure now; raises GroupGone when the group has ended."""
        members = self.group.members()
        cumulative_cpu = self.group.cpu_usage_s()
        live: list[int] = []
        ticks: dict[int, tuple[int, int, int]] = {}
        if cumulative_cpu is not None and not self.want_delay:
            # The cgroup counts its CPU time and lists its processes: no /proc read per member.
            live = [m.pid for m in members]
        else:
            for m in members:
                totals = procfs.cpu_totals(m.pid, self.proc)
                if totals is None or totals[2] != m.start:
                    self.group.forget(m.pid)
                    continue
                live.append(m.pid)
                ticks[m.pid] = (totals[0] + totals[1], m.start, m.ppid)
        if cumulative_cpu is None:
            cumulative_cpu = self._cpu.update(ticks, absorbed=True) / procfs.CLK_TCK
        cumulative_delay = self._delay_total(live, members) if self.want_delay else None
        now = self.clock()
        prev, self._prev = self._prev, (now, cumulative_cpu, cumulative_delay)
        if prev is None:
            return Sample(time.time(), 0.0, 0.0, 0.0 if self.want_delay else None, tuple(live))
        interval = max(0.0, now - prev[0])
        delay = None
        if cumulative_delay is not None and prev[2] is not None:
            delay = max(0.0, cumulative_delay - prev[2])
        return Sample(time.time(), interval, max(0.0, cumulative_cpu - prev[1]), delay, tuple(live))

    def _delay_total(self, live: list[int], members: list[Member]) -> float:
        by_pid = {m.pid: m for m in members}
        values: dict[int, tuple[int, int, int]] = {}
        for pid in live:
            if self.taskstats is not None:
                d = self.taskstats.tgid(pid)
                ns = None if d is None else d.delay_ns
            else:
                ns = procfs.schedstat_delay_ns(pid, self.proc)
            if ns is not None:
                values[pid] = (ns, by_pid[pid].start, by_pid[pid].ppid)
        return self._delay.update(values, absorbed=False) / 1e9

    def pages(self) -> dict[int, int]:
        """Resident memory per NUMA node summed over the members (numa_maps), in 4 KiB
        base pages: a huge page counts as the base pages it spans."""
        total: dict[int, int] = {}
        for m in self.group.members():
            for node, n in (numa_bytes(m.pid, self.proc) or {}).items():
                total[node] = total.get(node, 0) + n
        return {node: b // BASE_PAGE for node, b in sorted(total.items())}

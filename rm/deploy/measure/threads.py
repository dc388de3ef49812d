"""Per-thread CPU time of a process, for ``cod profile`` (read through :mod:`cod.facts.procfs`).

Sources, best first:

* ``schedstat``: /proc/PID/task/TID/schedstat gives the nanoseconds a thread
  ran on a CPU and waited on a run queue (CONFIG_SCHED_INFO, on in every
  distribution kernel); world-readable, nanosecond resolution.
* ``taskstats``: the kernel's taskstats netlink family through pyroute2
  (``cpu_run_real_total`` and ``cpu_delay_total``, the same clocks); used when
  schedstat is missing.  Needs the netlink family and, for other users'
  threads, privileges.
* ``stat``: utime + stime of /proc/PID/task/TID/stat, in clock ticks (10 ms
  at USER_HZ = 100): coarse, but always there.

Thread names are /proc/PID/task/TID/comm (15 bytes at most).  Every file is
read by the one /proc reader; ``proc_root`` is its root.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from cod.facts import procfs

from ..errors import DeployError

SOURCES = ("schedstat", "taskstats", "stat")


class ProfileError(DeployError):
    """A process or thread could not be profiled; the message names it and why."""


@dataclass(frozen=True)
class ThreadSample:
    tid: int
    comm: str
    run_ns: int  # time on a CPU since the thread started
    wait_ns: int | None  # time runnable but waiting for a CPU (None: the source does not say)


def start_time(pid: int, proc_root: str | Path = procfs.PROC) -> int:
    """The process's start time (clock ticks after boot): with the pid, it names the process."""
    born = procfs.start_time(pid, str(proc_root))
    if born is None:
        raise ProfileError(f"process {pid}: no such process")
    return born


def thread_ids(pid: int, proc_root: str | Path = procfs.PROC) -> list[int]:
    try:
        tids = procfs.thread_ids(pid, str(proc_root))
    except PermissionError as err:
        raise ProfileError(f"process {pid}: {err.strerror}") from None
    if not tids:  # a live process has a thread
        raise ProfileError(f"process {pid}: no such process")
    return tids


def detect_source(pid: int, proc_root: str | Path = procfs.PROC) -> str:
    tids = thread_ids(pid, proc_root)
    if procfs.thread_schedstat(pid, tids[0], str(proc_root)) is not None:
        return "schedstat"
    if Path(proc_root) == Path(procfs.PROC) and _taskstats() is not None:
        return "taskstats"
    return "stat"


_TASKSTATS: object | None = None


def _taskstats():  # pragma: no cover - exercised where schedstat is missing
    """A bound pyroute2 TaskStats socket, or None if the family is not usable."""
    global _TASKSTATS
    if _TASKSTATS is None:
        try:
            from pyroute2 import TaskStats
            ts = TaskStats()
            ts.bind()
            ts.get_pid_stat(os.getpid())
            _TASKSTATS = ts
        except Exception:  # noqa: BLE001 - any failure means "not available"
            _TASKSTATS = False
    return _TASKSTATS or None


def sample_thread(pid: int, tid: int, source: str, proc_root: str | Path = procfs.PROC) -> ThreadSample | None:
    """One thread's name and CPU time now; None if it has exited."""
    proc = str(proc_root)
    comm = procfs.thread_comm(pid, tid, proc)
    if comm is None:
        return None
    if source == "schedstat":
        times = procfs.thread_schedstat(pid, tid, proc)
        return None if times is None else ThreadSample(tid, comm, times[0], times[1])
    if source == "taskstats":  # pragma: no cover - see _taskstats
        ts = _taskstats()
        try:
            msg = ts.get_pid_stat(tid)[0]
        except Exception:  # noqa: BLE001 - the thread is gone
            return None
        stats = msg.get_attr("TASKSTATS_TYPE_AGGR_PID").get_attr("TASKSTATS_TYPE_STATS")
        return ThreadSample(tid, comm, int(stats["cpu_run_real_total"]), int(stats["cpu_delay_total"]))
    ticks = procfs.thread_cpu_ticks(pid, tid, proc)
    return None if ticks is None else ThreadSample(tid, comm, ticks * 1_000_000_000 // procfs.CLK_TCK, None)


def sample_process(pid: int, source: str, proc_root: str | Path = procfs.PROC) -> dict[int, ThreadSample]:
    """Every live thread of ``pid`` by TID."""
    if source not in SOURCES:
        raise ProfileError(f"source: must be one of {', '.join(SOURCES)}, got {source!r}")
    out = {}
    for tid in thread_ids(pid, proc_root):
        s = sample_thread(pid, tid, source, proc_root)
        if s is not None:
            out[tid] = s
    return out

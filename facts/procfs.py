"""The one reader of /proc: what the daemon and the tools need about a process, its threads
and the machine's CPU time.

Every parse of ``/proc/PID/stat``, ``task/TID/stat``, ``schedstat``, ``wchan``, ``comm``,
``status``, ``numa_maps``, ``/proc/stat`` and ``/proc/meminfo`` (its lines parsed by
``cod.facts.sysfs.parse_meminfo``) is here, used by the enforcer, the busy detector,
the live state, elastic groups (``rm/elastic/measure.py``), ``cod profile``
(``rm/deploy/measure/threads.py``) and the SKB's watch of its starting engine
(``skb/lifecycle.py``).  It lives beside the sysfs reader, not in the RM's enforcer, so
that the SKB reads /proc through it without importing the RM.

As in psutil, every reader takes one root, ``proc`` (default ``/proc``), so tests point
it at a fake tree; and a process is identified by (pid, start time), so that a pid
reused by a new process is never mistaken for the one we pinned.  A reader of a process
that is gone answers None (or [] / {}), never a half-read value.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cod.facts.cpulist import format_cpulist as format_cpu_list  # the kernel's list format
from cod.facts.cpulist import parse_cpulist as parse_cpu_list
from cod.facts.sysfs import parse_meminfo

PROC = "/proc"
CLK_TCK = os.sysconf("SC_CLK_TCK")  # the unit of stat's CPU times: clock ticks per second
PF_KTHREAD = 0x00200000  # include/linux/sched.h: the task is a kernel thread
PF_EXITING = 0x00000004  # include/linux/sched.h: the task is exiting, or a zombie not yet reaped


@dataclass(frozen=True)
class Stat:
    """The fields of /proc/PID/stat (or /proc/PID/task/TID/stat) we use."""

    pid: int
    comm: str
    state: str
    ppid: int
    flags: int
    utime: int  # clock ticks
    stime: int  # clock ticks
    cutime: int  # clock ticks of the children it reaped
    cstime: int
    num_threads: int
    start_time: int  # clock ticks after boot; with the pid, the process identity
    processor: int  # CPU it last ran on

    @property
    def is_kernel_thread(self) -> bool:
        return bool(self.flags & PF_KTHREAD)


def parse_stat(text: str) -> Stat:
    # comm may hold spaces and parentheses: it runs to the *last* ')'.
    open_paren = text.index("(")
    close_paren = text.rindex(")")
    pid = int(text[:open_paren])
    comm = text[open_paren + 1 : close_paren]
    rest = text[close_paren + 2 :].split()
    # rest[0] is field 3 (state); field N is rest[N - 3].
    return Stat(
        pid=pid,
        comm=comm,
        state=rest[0],
        ppid=int(rest[1]),
        flags=int(rest[6]),
        utime=int(rest[11]),
        stime=int(rest[12]),
        cutime=int(rest[13]),
        cstime=int(rest[14]),
        num_threads=int(rest[17]),
        start_time=int(rest[19]),
        processor=int(rest[36]),
    )


def read_stat(pid: int, tid: int | None = None, proc: str = PROC) -> Stat:
    """Raise FileNotFoundError/ProcessLookupError when the process is gone."""
    path = f"{proc}/{pid}/stat" if tid is None else f"{proc}/{pid}/task/{tid}/stat"
    return parse_stat(read_small(path).decode("utf-8", "replace"))


def read_small(path: str) -> bytes:
    """One read of a small /proc file: os.open/os.read is ~35 % cheaper than open()."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def cpu_ticks(pid: int, proc: str = PROC) -> tuple[int, int, int] | None:
    """(utime+stime, start time, flags) of ``pid`` -- the scan's fast path; None if gone."""
    try:
        data = read_small(f"{proc}/{pid}/stat")
    except (FileNotFoundError, ProcessLookupError):
        return None
    return parse_cpu_ticks(data)


def cpu_seconds(pid: int, proc: str = PROC) -> float | None:
    """The CPU time (user + system, every thread) process ``pid`` has used, in seconds; None if gone."""
    ticks = cpu_ticks(pid, proc)
    return ticks[0] / CLK_TCK if ticks is not None else None


def thread_state(pid: int, tid: int, proc: str = PROC) -> str | None:
    """Thread ``tid``'s scheduler state (R, S, D, ...) from its stat; None if it exited."""
    try:
        return read_stat(pid, tid, proc).state
    except (FileNotFoundError, ProcessLookupError):
        return None


def cpu_totals(pid: int, proc: str = PROC) -> tuple[int, int, int] | None:
    """(utime+stime, cutime+cstime of the children it reaped, start time) of ``pid``; None if gone."""
    try:
        rest = _after_comm(read_small(f"{proc}/{pid}/stat"))
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(rest[11]) + int(rest[12]), int(rest[13]) + int(rest[14]), int(rest[19])


def start_time(pid: int, proc: str = PROC) -> int | None:
    """The start time of ``pid``, or None when there is no such process."""
    try:
        return read_stat(pid, proc=proc).start_time
    except (FileNotFoundError, ProcessLookupError):
        return None


def same_process(pid: int, start: int, proc: str = PROC) -> bool:
    return start_time(pid, proc) == start


def thread_ids(pid: int, proc: str = PROC) -> list[int]:
    """Every thread of ``pid`` (``/proc/PID/task/*``); [] when it is gone."""
    try:
        return sorted(int(t) for t in os.listdir(f"{proc}/{pid}/task"))
    except (FileNotFoundError, ProcessLookupError):
        return []


def comm(pid: int, proc: str = PROC) -> str | None:
    """The name of process ``pid`` (``/proc/PID/comm``); None if it is gone."""
    try:
        return read_small(f"{proc}/{pid}/comm").decode(errors="replace").rstrip("\n")
    except (FileNotFoundError, ProcessLookupError):
        return None


def cgroups(pid: int, proc: str = PROC) -> list[tuple[str, str, str]]:
    """(hierarchy id, controllers, path) per line of ``/proc/PID/cgroup`` (v2's line is
    ("0", "", path)); raises FileNotFoundError/ProcessLookupError when ``pid`` is gone."""
    with open(f"{proc}/{pid}/cgroup") as f:
        lines = f.read().splitlines()
    return [(hier, controllers, path) for hier, controllers, path in
            (line.split(":", 2) for line in lines if line.count(":") >= 2)]


def thread_comm(pid: int, tid: int, proc: str = PROC) -> str | None:
    """The name of thread ``tid`` (``/proc/PID/task/TID/comm``, 15 bytes at most); None if it exited."""
    try:
        return read_small(f"{proc}/{pid}/task/{tid}/comm").decode(errors="replace").rstrip("\n")
    except (FileNotFoundError, ProcessLookupError):
        return None


def thread_wait_channel(pid: int, tid: int, proc: str = PROC) -> str | None:
    """Where thread ``tid`` sleeps in the kernel (``/proc/PID/task/TID/wchan``, e.g. ``pipe_read``),
    "" when it does not (running, or the kernel hides it); None if it exited."""
    try:
        text = read_small(f"{proc}/{pid}/task/{tid}/wchan").decode(errors="replace").strip()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return "" if text == "0" else text


def thread_names(pid: int, proc: str = PROC) -> dict[int, str]:
    """Each thread of ``pid`` and its name (``/proc/PID/task/TID/comm``); {} when it is gone."""
    names = {tid: thread_comm(pid, tid, proc) for tid in thread_ids(pid, proc)}
    return {tid: name for tid, name in names.items() if name is not None}  # some exited meanwhile


def thread_schedstat(pid: int, tid: int, proc: str = PROC) -> tuple[int, int] | None:
    """(ns on a CPU, ns runnable but waiting for one) of thread ``tid`` since it started
    (``/proc/PID/task/TID/schedstat``, CONFIG_SCHED_INFO); None if it exited or the file is missing."""
    try:
        fields = read_small(f"{proc}/{pid}/task/{tid}/schedstat").split()
        return int(fields[0]), int(fields[1])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


def thread_cpu_ticks(pid: int, tid: int, proc: str = PROC) -> int | None:
    """utime+stime of thread ``tid`` in clock ticks (``/proc/PID/task/TID/stat``); None if it exited."""
    try:
        rest = _after_comm(read_small(f"{proc}/{pid}/task/{tid}/stat"))
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(rest[11]) + int(rest[12])


@dataclass(frozen=True)
class ThreadSched:
    """What the busy detector reads of one thread to tell how long it wanted a CPU."""

    run_ns: int  # on a CPU since it started (schedstat field 1)
    delay_ns: int  # waited on a run queue (schedstat field 2): added only when it next gets a CPU
    runnable: bool  # state R when read (running or waiting for a CPU)
    voluntary: int  # voluntary context switches: the times it blocked (status)


def thread_sched(pid: int, tid: int, proc: str = PROC) -> ThreadSched | None:
    """:class:`ThreadSched` of thread ``tid`` (its schedstat, stat and status); None if it exited."""
    base = f"{proc}/{pid}/task/{tid}"
    try:
        run, delay = (int(v) for v in read_small(f"{base}/schedstat").split()[:2])
        state = _after_comm(read_small(f"{base}/stat"))[0]
        status = read_small(f"{base}/status")
        at = status.index(b"\nvoluntary_ctxt_switches:") + len(b"\nvoluntary_ctxt_switches:")
        voluntary = int(status[at:status.index(b"\n", at)])
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None
    return ThreadSched(run, delay, state == b"R", voluntary)


def threads_sched(pid: int, proc: str = PROC) -> dict[int, ThreadSched]:
    """:class:`ThreadSched` of each live thread of ``pid``; {} when it is gone."""
    got = {tid: thread_sched(pid, tid, proc) for tid in thread_ids(pid, proc)}
    return {tid: s for tid, s in got.items() if s is not None}


def schedstat_delay_ns(pid: int, proc: str = PROC) -> int | None:
    """Run-queue wait of ``pid``'s live threads (``/proc/PID/task/TID/schedstat`` field 2)."""
    tids = thread_ids(pid, proc)
    if not tids:
        return None
    return sum(s[1] for s in (thread_schedstat(pid, tid, proc) for tid in tids) if s is not None)


def meminfo(path: str = PROC + "/meminfo") -> dict[str, int]:
    """A meminfo file's figures in bytes (``MemTotal``, ``MemFree``, ``MemAvailable``, ...): /proc's,
    or a NUMA node's in sysfs (its ``Node N`` prefix dropped); {} when unreadable."""
    try:
        with open(path) as f:
            return parse_meminfo(f.read())
    except OSError:
        return {}


@dataclass(frozen=True)
class NumaRange:
    """One mapping of a process and where its resident pages are (``/proc/PID/numa_maps``
    joined with ``/proc/PID/maps`` for the end address)."""

    start: int
    end: int
    page_size: int  # bytes (kernelpagesize_kB): a hugetlb mapping's pages are 2 MiB or 1 GiB
    pages: dict[int, int]  # node -> resident pages of page_size

    def pages_off(self, nodes: Iterable[int]) -> int:
        """Resident pages on nodes outside ``nodes``."""
        keep = set(nodes)
        return sum(n for node, n in self.pages.items() if node not in keep)


_NODE_TOKEN = re.compile(r"\bN(\d+)=(\d+)")
_PAGE_KB_TOKEN = re.compile(r"\bkernelpagesize_kB=(\d+)")


def parse_numa_ranges(maps: str, numa_maps: str) -> list[NumaRange]:
    """The mappings of a numa_maps text that hold resident pages, with their end from maps."""
    ends = {}
    for line in maps.splitlines():
        lo, _, hi = line.partition(" ")[0].partition("-")
        if hi:
            ends[int(lo, 16)] = int(hi, 16)
    out = []
    for line in numa_maps.splitlines():
        start_text, _, rest = line.partition(" ")
        pages = {int(n): int(c) for n, c in _NODE_TOKEN.findall(rest)}
        start = int(start_text, 16) if start_text else None
        if not pages or start not in ends:
            continue  # nothing resident, or the mapping changed between the two reads
        kb = _PAGE_KB_TOKEN.search(rest)
        out.append(NumaRange(start, ends[start], int(kb.group(1)) * 1024 if kb else 4096, pages))
    return out


def numa_ranges(pid: int, proc: str = PROC) -> list[NumaRange]:
    """``pid``'s mappings holding resident pages, and on which nodes; [] when it is gone."""
    try:
        with open(f"{proc}/{pid}/maps") as f:
            maps = f.read()
        with open(f"{proc}/{pid}/numa_maps") as f:
            numa_maps = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return []
    return parse_numa_ranges(maps, numa_maps)


def pids(proc: str = PROC) -> list[int]:
    return [int(n) for n in os.listdir(proc) if n.isdigit()]


def alive(ident: int, proc: str = PROC) -> bool:
    """Whether a process or thread ``ident`` exists (a thread id is reachable as /proc/TID too)."""
    return os.path.exists(f"{proc}/{ident}")


def numa_maps(pid: int, proc: str = PROC) -> bytes | None:
    """``/proc/PID/numa_maps`` as the kernel wrote it; None when the process is gone or hidden."""
    try:
        with open(f"{proc}/{pid}/numa_maps", "rb") as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None


def status_field(pid: int, name: str, tid: int | None = None, proc: str = PROC) -> str:
    path = f"{proc}/{pid}/status" if tid is None else f"{proc}/{pid}/task/{tid}/status"
    with open(path) as f:
        for line in f:
            key, _, value = line.partition(":")
            if key == name:
                return value.strip()
    raise KeyError(f"{path} has no field {name!r}")


def real_uid(pid: int, proc: str = PROC) -> int | None:
    """The real uid of process ``pid`` (``Uid:`` in its status); None when it is gone."""
    try:
        return int(status_field(pid, "Uid", proc=proc).split()[0])
    except (FileNotFoundError, ProcessLookupError, KeyError, ValueError, IndexError):
        return None


def is_process(ident: int, proc: str = PROC) -> bool:
    """Whether ``ident`` is a live process (its own thread group leader), not another's thread."""
    try:
        return int(status_field(ident, "Tgid", proc=proc)) == ident
    except (OSError, KeyError, ValueError):
        return False


def cpus_allowed(pid: int, tid: int | None = None, proc: str = PROC) -> tuple[int, ...]:
    """``Cpus_allowed_list`` of a process or thread, as a sorted tuple."""
    return parse_cpu_list(status_field(pid, "Cpus_allowed_list", tid, proc))


def check_ids(what: str, ids: Sequence[int]) -> tuple[int, ...]:
    """Validate a CPU or node list given by a caller: non-empty, non-negative ints."""
    if not ids:
        raise ValueError(f"{what} is empty")
    for i in ids:
        if not isinstance(i, int) or isinstance(i, bool) or i < 0:
            raise ValueError(f"{what} holds {i!r}, not a CPU/node number")
    return tuple(sorted(set(ids)))


class KeptFiles:
    """Small /proc files read again and again through fds kept open (``pread``):
    half the cost of open/read/close.  An fd on /proc/PID/... of a process that
    has exited reads ESRCH, never a later process with the same pid."""

    def __init__(self) -> None:
        self._fds: dict[str, int] = {}
        self._sizes: dict[str, int] = {}  # a read size that held the whole file last time

    def read(self, path: str) -> bytes | None:
        """The whole file, or None when its process is gone.  Most are one page; /proc/stat of a
        machine with many CPUs or interrupts is several, and its last lines (``procs_running``)
        matter as much as its first."""
        fd = self._fds.get(path)
        size = self._sizes.get(path, 4096)
        try:
            if fd is None:
                fd = self._fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            data = os.pread(fd, size, 0)
            while len(data) == size:  # perhaps cut short: read it again with room to spare
                size *= 2
                self._sizes[path] = size
                data = os.pread(fd, size, 0)
            return data
        except (FileNotFoundError, ProcessLookupError):
            self.forget(path)
            return None

    def keep_only(self, paths: Iterable[str]) -> None:
        """Close the fds of every path not in ``paths``."""
        keep = set(paths)
        for path in [p for p in self._fds if p not in keep]:
            self.forget(path)

    def forget(self, path: str) -> None:
        self._sizes.pop(path, None)
        fd = self._fds.pop(path, None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        self.keep_only(())


def cpu_line_ticks(line: bytes) -> tuple[int, int]:
    """(busy, idle) ticks of one ``cpu`` or ``cpuN`` line of /proc/stat (iowait counts as idle)."""
    values = [int(v) for v in line.split()[1:9]]  # user nice system idle iowait irq softirq steal
    idle = values[3] + values[4]
    return sum(values) - idle, idle


def machine_ticks(stat: bytes) -> tuple[int, int]:
    """(busy, idle) ticks of all CPUs together: the first line of /proc/stat."""
    return cpu_line_ticks(stat.split(b"\n", 1)[0])


def per_cpu_ticks(stat: bytes) -> dict[int, tuple[int, int]]:
    """(busy, idle) ticks of each CPU, from the ``cpuN`` lines of /proc/stat."""
    return {int(line.split(None, 1)[0][3:]): cpu_line_ticks(line)
            for line in stat.split(b"\n") if line[:3] == b"cpu" and line[3:4].isdigit()}


def machine_runnable(stat: bytes) -> tuple[int, int]:
    """(CPUs, threads runnable now) from /proc/stat (``cpuN`` lines, ``procs_running``; 0 if absent)."""
    cpus = running = 0
    for line in stat.split(b"\n"):
        if line[:3] == b"cpu" and line[3:4].isdigit():
            cpus += 1
        elif line.startswith(b"procs_running "):
            running = int(line.split()[1])
    return cpus, running


def _after_comm(data: bytes) -> list[bytes]:
    """The fields of a stat file after comm (which runs to the *last* ')'): field N is [N - 3]."""
    return data[data.rindex(b")") + 2 :].split(None, 20)


def parse_cpu_ticks(data: bytes) -> tuple[int, int, int]:
    """(utime+stime, start time, flags) from the bytes of a stat file."""
    rest = _after_comm(data)
    return int(rest[11]) + int(rest[12]), int(rest[19]), int(rest[6])

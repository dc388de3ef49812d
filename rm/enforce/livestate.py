"""The machine's live state, sampled cheaply: the raw material of the SKB's
dynamic facts (the lead turns these into facts).

* `CpuLoadSampler` -- per-CPU busy fraction from /proc/stat deltas;
* `node_free_bytes()` -- free memory per NUMA node (sysfs nodeN/meminfo);
* `numa_pages()` -- a process's pages per NUMA node (/proc/PID/numa_maps);
* `TaskSampler` -- per registered task: CPU use (cores) and pages per node.

Every sampler returns plain data and keeps no more than the previous counters.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from cod.facts import procfs

SYS_NODES = "/sys/devices/system/node"
NODE_TOKEN = re.compile(rb"\bN(\d+)=(\d+)")


class CpuLoadSampler:
    """Busy fraction (0..1) of each CPU since the previous call (first call: since boot)."""

    def __init__(self, proc: str = procfs.PROC) -> None:
        self.path = f"{proc}/stat"
        self._kept = procfs.KeptFiles()
        self._prev: dict[int, tuple[int, int]] = {}

    def _read(self) -> dict[int, tuple[int, int]]:
        """(all, idle) ticks of each CPU."""
        stat = self._kept.read(self.path)
        if stat is None:
            raise FileNotFoundError(self.path)
        return {cpu: (busy + idle, idle) for cpu, (busy, idle) in procfs.per_cpu_ticks(stat).items()}

    def sample(self) -> dict[int, float]:
        now = self._read()
        load: dict[int, float] = {}
        for cpu, (total, idle) in now.items():
            prev_total, prev_idle = self._prev.get(cpu, (0, 0))
            d_total = total - prev_total
            load[cpu] = 0.0 if d_total <= 0 else max(0.0, min(1.0, 1 - (idle - prev_idle) / d_total))
        self._prev = now
        return load


def node_free_bytes(sys_nodes: str = SYS_NODES, meminfo: str | None = None) -> dict[int, int]:
    """Free memory of every NUMA node, in bytes.  With one node and ``meminfo`` (/proc/meminfo), the
    larger of the node's MemFree and the machine's: a kernel may count part of a node's memory only
    once it has been used (facts/sysfs.py, ``_one_node_holds_all``; docs/design-facts.md, "Memory")."""
    out: dict[int, int] = {}
    for name in os.listdir(sys_nodes):
        if not (name.startswith("node") and name[4:].isdigit()):
            continue
        free = procfs.meminfo(os.path.join(sys_nodes, name, "meminfo")).get("MemFree")
        if free is not None:
            out[int(name[4:])] = free
    if len(out) == 1 and meminfo is not None:
        [(node, free)] = out.items()
        out = {node: max(free, procfs.meminfo(meminfo).get("MemFree", 0))}
    return dict(sorted(out.items()))


def parse_numa_maps(text: bytes) -> dict[int, int]:
    """Sum the ``N<node>=<pages>`` tokens of a numa_maps file: pages per node."""
    pages: dict[int, int] = {}
    for node, count in NODE_TOKEN.findall(text):
        n = int(node)
        pages[n] = pages.get(n, 0) + int(count)
    return dict(sorted(pages.items()))


PAGE_SIZE_TOKEN = re.compile(rb"\bkernelpagesize_kB=(\d+)")


def parse_numa_maps_bytes(text: bytes) -> dict[int, int]:
    """Resident bytes per node: each line's ``N<node>=<pages>`` times its ``kernelpagesize_kB``
    (a 2 MiB huge page weighs 512 base pages, not one)."""
    out: dict[int, int] = {}
    for line in text.splitlines():
        size = PAGE_SIZE_TOKEN.search(line)
        page_bytes = int(size.group(1)) * 1024 if size else 4096
        for node, count in NODE_TOKEN.findall(line):
            n = int(node)
            out[n] = out.get(n, 0) + int(count) * page_bytes
    return dict(sorted(out.items()))


def numa_bytes(pid: int, proc: str = procfs.PROC) -> dict[int, int] | None:
    """Resident bytes of ``pid`` per NUMA node; None when it is gone or unreadable."""
    text = procfs.numa_maps(pid, proc)
    return None if text is None else parse_numa_maps_bytes(text)


def numa_pages(pid: int, proc: str = procfs.PROC) -> dict[int, int] | None:
    """Pages of ``pid`` per NUMA node; None when it is gone or unreadable."""
    text = procfs.numa_maps(pid, proc)
    return None if text is None else parse_numa_maps(text)


@dataclass(frozen=True)
class TaskState:
    cpu: float  # cores used since the previous sample, summed over the task's live pids
    pages: dict[int, int]  # pages per NUMA node, summed over its pids
    pids: tuple[int, ...]  # the pids still alive


@dataclass(frozen=True)
class LiveState:
    at: float  # time.monotonic() of the sample
    cpu_load: dict[int, float]
    node_free_bytes: dict[int, int]
    tasks: dict[str, TaskState] = field(default_factory=dict)


class TaskSampler:
    """CPU use and memory placement of registered tasks."""

    def __init__(self, proc: str = procfs.PROC, clock: Callable[[], float] = time.monotonic) -> None:
        self.proc = proc
        self.clock = clock
        self._prev: dict[int, tuple[int, int, float]] = {}  # pid -> (start, ticks, at)

    def sample(self, tasks: Mapping[str, Iterable[int]], pages: bool = True) -> dict[str, TaskState]:
        seen: dict[int, tuple[int, int, float]] = {}
        out: dict[str, TaskState] = {}
        for task, pids in tasks.items():
            cpu = 0.0
            total_pages: dict[int, int] = {}
            live = []
            for pid in pids:
                try:
                    st = procfs.read_stat(pid, proc=self.proc)
                except (FileNotFoundError, ProcessLookupError):
                    continue
                # Each reading carries its own time, as the busy detector's do: a sample delayed
                # after its start (another task's numa_maps, a loaded machine) would otherwise
                # divide this process's CPU time by the wrong span (clone 65: 0.295 cores).
                now = self.clock()
                ticks = st.utime + st.stime
                prev = self._prev.get(pid)
                if prev is not None and prev[0] == st.start_time and now > prev[2]:
                    cpu += (ticks - prev[1]) / procfs.CLK_TCK / (now - prev[2])
                seen[pid] = (st.start_time, ticks, now)
                if pages:
                    for node, n in (numa_pages(pid, self.proc) or {}).items():
                        total_pages[node] = total_pages.get(node, 0) + n
                live.append(pid)
            out[task] = TaskState(cpu, dict(sorted(total_pages.items())), tuple(live))
        self._prev = seen
        return out


class LiveStateSampler:
    """All of the above in one call, for the RM's periodic refresh."""

    def __init__(self, proc: str = procfs.PROC, sys_nodes: str = SYS_NODES) -> None:
        self.cpu = CpuLoadSampler(proc)
        self.task = TaskSampler(proc)
        self.sys_nodes = sys_nodes
        self.meminfo = os.path.join(proc, "meminfo")

    def sample(self, tasks: Mapping[str, Iterable[int]], pages: bool = True) -> LiveState:
        return LiveState(
            at=time.monotonic(),
            cpu_load=self.cpu.sample(),
            node_free_bytes=node_free_bytes(self.sys_nodes, self.meminfo),
            tasks=self.task.sample(tasks, pages),
        )

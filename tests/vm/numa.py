"""Where a process's memory is: a child that touches fresh anonymous memory on request, and
readers of /proc/PID/numa_maps and /proc/PID/status (the guest tests' helpers)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from cod.rm.enforce.cgroupfs import find_cpuset_mount, process_cgroup
from cod.facts.procfs import format_cpu_list

TOUCHER = r"""
import mmap, os, sys, ctypes
os.sched_setaffinity(0, [int(c) for c in sys.argv[1].split(",")])  # where its first pages go
keep = []
for line in sys.stdin:
    mib = int(line)
    keep.append(mmap.mmap(-1, 4096, prot=mmap.PROT_READ))  # a neighbour the next one cannot merge with
    m = mmap.mmap(-1, mib << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    for off in range(0, mib << 20, 4096):
        m[off] = 1
    keep.append(m)
    print(ctypes.addressof(ctypes.c_char.from_buffer(m)), flush=True)
"""


class Toucher:
    """A Python child started on ``cpus``; ``touch(mib)`` maps and writes ``mib`` MiB and returns
    the mapping's address."""

    def __init__(self, cpus) -> None:
        self.cpus = ",".join(str(c) for c in cpus)

    def __enter__(self) -> "Toucher":
        self.proc = subprocess.Popen([sys.executable, "-c", TOUCHER, self.cpus], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        return self

    @property
    def pid(self) -> int:
        return self.proc.pid

    def touch(self, mib: int) -> int:
        self.proc.stdin.write(f"{mib}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the toucher died (exit {self.proc.poll()})"
        return int(line)

    def __exit__(self, *exc) -> None:
        self.proc.kill()
        self.proc.wait()


def node_pages(pid: int, addr: int) -> dict[int, int]:
    """Pages per node of the mapping holding ``addr`` (numa_maps' N<node>=<pages>); the kernel
    may have merged it with an anonymous neighbour, whose pages then count too."""
    starts = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= addr < hi:
                starts.append(lo)
    assert starts, f"no mapping holds {addr:#x} in /proc/{pid}/maps"
    with open(f"/proc/{pid}/numa_maps") as f:
        for line in f:
            start, _, rest = line.partition(" ")
            if int(start, 16) == starts[0]:
                return {int(n): int(c) for n, c in re.findall(r"\bN(\d+)=(\d+)", rest)}
    raise AssertionError(f"no mapping at {starts[0]:#x} in /proc/{pid}/numa_maps")


def status_list(pid: int, key: str) -> str:
    """A line of /proc/PID/status, e.g. Mems_allowed_list."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return line.split(":", 1)[1].strip()
    raise AssertionError(f"no {key} in /proc/{pid}/status")


def fmt(ids) -> str:
    return format_cpu_list(sorted(ids))


def read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def cgroup_v2_fixture(parent: str):
    """A module's autouse fixture (``cgroup_v2 = cgroup_v2_fixture(PARENT)``): the guest has the
    cgroup v2 cpuset controller and the tests run as root; at the end of the module no cgroup
    ``parent`` (the module's enforcers' parent) is left behind.  Yields the mount."""

    @pytest.fixture(scope="module", autouse=True)
    def cgroup_v2():
        mount = find_cpuset_mount()
        assert mount is not None and mount.version == 2, f"the guest has no cgroup v2 cpuset controller: {mount}"
        assert os.geteuid() == 0
        yield mount
        assert not os.path.exists(os.path.join(mount.path, parent)), "a test left its cgroup parent behind"

    return cgroup_v2


def cgroup_confines(pid: int, cpus, mems) -> None:
    """The kernel's view, not our files': the process sits in a cgroup of the v2 hierarchy whose
    effective CPUs and nodes are the given ones, and its status says the same."""
    mount = find_cpuset_mount()
    assert mount is not None and mount.version == 2, mount
    rel = process_cgroup(pid, 2)
    assert rel is not None and rel != "/", f"pid {pid} is in the root cgroup"
    cg = os.path.join(mount.path, rel.lstrip("/"))
    assert read(f"{cg}/cpuset.cpus.effective") == fmt(cpus)
    assert read(f"{cg}/cpuset.mems.effective") == fmt(mems)
    assert status_list(pid, "Cpus_allowed_list") == fmt(cpus)
    assert status_list(pid, "Mems_allowed_list") == fmt(mems)


MEMTASK = r"""
import ctypes, mmap, os, queue, sys, threading
os.sched_setaffinity(0, [int(c) for c in sys.argv[1].split(",")])  # where its first pages go
keep, jobs, done = [], [queue.Queue() for _ in range(int(sys.argv[2]))], queue.Queue()

def worker(q):
    while True:
        mib = q.get()
        keep.append(mmap.mmap(-1, 4096, prot=mmap.PROT_READ))  # a neighbour the next one cannot merge with
        m = mmap.mmap(-1, mib << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        for off in range(0, mib << 20, 4096):
            m[off] = 1
        keep.append(m)
        done.put(ctypes.addressof(ctypes.c_char.from_buffer(m)))

for q in jobs:
    threading.Thread(target=worker, args=(q,), daemon=True).start()
for line in sys.stdin:
    for q in jobs:  # each thread touches its share of a fresh mapping of its own
        q.put(int(line))
    print(" ".join(str(done.get()) for _ in jobs), flush=True)
"""


class MemTask(Toucher):
    """A Toucher whose pages are touched by ``threads`` threads that live as long as it does:
    ``touch(mib)`` has each thread map and write ``mib`` MiB and returns the mappings' addresses."""

    def __init__(self, cpus, threads: int = 1) -> None:
        super().__init__(cpus)
        self.threads = threads

    def __enter__(self) -> "MemTask":
        self.proc = subprocess.Popen([sys.executable, "-c", MEMTASK, self.cpus, str(self.threads)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        return self

    def touch(self, mib: int) -> list[int]:
        self.proc.stdin.write(f"{mib}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the memory task died (exit {self.proc.poll()})"
        return [int(a) for a in line.split()]


def process_pages(pid: int) -> dict[int, int]:
    """Resident 4 KiB pages per node of the whole process (every mapping; a huge page counts
    as the base pages it holds), read by COD's own numa_maps reader."""
    from cod.facts.procfs import numa_ranges
    out: dict[int, int] = {}
    for rng in numa_ranges(pid):
        for node, n in rng.pages.items():
            out[node] = out.get(node, 0) + n * (rng.page_size // 4096)
    return out


def share_on(pages: dict[int, int], nodes) -> float:
    total = sum(pages.values())
    return sum(n for node, n in pages.items() if node in set(nodes)) / total if total else 0.0


class NumaBalancing:
    """Sets /proc/sys/kernel/numa_balancing for a block and restores what was there."""

    PATH = "/proc/sys/kernel/numa_balancing"

    def __init__(self, on: bool) -> None:
        self.on = on

    def __enter__(self) -> "NumaBalancing":
        self.before = read(self.PATH)
        with open(self.PATH, "w") as f:
            f.write("1" if self.on else "0")
        return self

    def __exit__(self, *exc) -> None:
        with open(self.PATH, "w") as f:
            f.write(self.before)

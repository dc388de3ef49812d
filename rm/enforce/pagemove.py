"""Moving a process's resident pages to other NUMA nodes in bounded batches (``move_pages(2)``).

``migrate_pages(2)``, and a write of ``cpuset.mems`` (cgroup v2, or v1 with
``cpuset.memory_migrate``), move every page of a process in one kernel call that holds its
``mmap_lock`` all along: the process's own ``mmap``/``munmap`` wait behind it, for seconds with
a buffer pool of gigabytes.  `PageMover` finds the mappings with pages off the target nodes
(``numa_maps``), asks where each page is (``move_pages`` with no nodes, cheap), and moves those
off the target in calls sized to a time budget (20 ms by default): the size of the next call
follows the time per page the previous calls took, so no call blocks the process for long,
whatever the machine (a TCG guest is ~25 times slower than the host).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from cod.facts import procfs

from .errors import EnforceError
from .syscalls import syscall_number

log = logging.getLogger("cod.rm.enforce")

MPOL_MF_MOVE = 1 << 1      # include/uapi/linux/mempolicy.h: pages mapped by this process only
MPOL_MF_MOVE_ALL = 1 << 2  # also pages other processes map (a shared buffer pool); CAP_SYS_NICE

BUDGET_S = 0.020   # the longest one move_pages call should take
FIRST_BATCH = 64   # pages in the first call, before anything is measured
MIN_BATCH = 16
MAX_BATCH = 1 << 14  # 64 MiB of 4 KiB pages
QUERY_WINDOW = 1 << 13  # base pages asked about at once (a query moves nothing: ~1 us a page)


def move_pages_number(machine: str | None = None) -> int:
    return syscall_number("move_pages", "moving pages", machine)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def move_pages(pid: int, addrs: Sequence[int], nodes: Sequence[int] | None, flags: int = 0) -> list[int] | None:
    """move_pages(2) on ``pid``: each page's node after the call (or ``-errno`` for that page);
    with ``nodes`` None only asks where they are.  None when the process is gone."""
    n = len(addrs)
    pages = (ctypes.c_void_p * n)(*addrs)
    status = (ctypes.c_int * n)()
    targets = None if nodes is None else (ctypes.c_int * n)(*nodes)
    res = _libc.syscall(move_pages_number(), ctypes.c_int(pid), ctypes.c_ulong(n), pages, targets,
                        status, ctypes.c_int(flags))
    if res < 0:
        e = ctypes.get_errno()
        if e == errno.ESRCH:
            return None
        hint = " (a target node is outside the process's cpuset)" if e == errno.EACCES else ""
        raise EnforceError(f"move_pages({pid}, {n} pages) failed: {os.strerror(e)}{hint}")
    return list(status)


@dataclass
class MoveReport:
    """What one `PageMover.move` did."""

    pid: int
    found: int = 0        # resident pages that were off the target nodes
    moved: int = 0
    failed: int = 0       # pages the kernel did not move (busy, pinned, shared without MOVE_ALL)
    calls: int = 0        # move_pages calls that moved pages
    largest_call_s: float = 0.0
    elapsed_s: float = 0.0
    bytes_moved: int = 0
    cancelled: bool = False  # stopped between two calls (a newer move of the task, or its release)

    def describe(self) -> str:
        stop = ", cancelled" if self.cancelled else ""
        return (f"pid {self.pid}: moved {self.moved} of {self.found} pages ({self.bytes_moved >> 20} MiB, "
                f"{self.failed} not moved) in {self.elapsed_s:.3f} s, {self.calls} calls, "
                f"largest call {self.largest_call_s * 1000:.1f} ms{stop}")


class PageMover:
    """Moves a process's resident pages onto given nodes, no call longer than ``budget_s``
    (give or take the first, and the kernel's own variations)."""

    def __init__(self, budget_s: float = BUDGET_S, proc: str = procfs.PROC,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if not budget_s > 0:
            raise EnforceError(f"page move budget {budget_s!r}: give a positive number of seconds")
        self.budget_s = budget_s
        self.proc = proc
        self.clock = clock
        self.flags = MPOL_MF_MOVE_ALL if os.geteuid() == 0 else MPOL_MF_MOVE
        self.batch = FIRST_BATCH  # base (4 KiB) pages in the next call, from the calls so far

    def move(self, pid: int, nodes: Sequence[int], cancelled: Callable[[], bool] = lambda: False) -> MoveReport:
        """Move ``pid``'s resident pages that are off ``nodes`` onto them (spread in turn); stops
        between two calls once ``cancelled()`` is true (what was moved stays moved)."""
        targets = tuple(sorted(set(nodes)))
        if not targets:
            raise EnforceError("moving pages needs at least one target node")
        report = MoveReport(pid)
        began = self.clock()
        turn = 0
        for rng in procfs.numa_ranges(pid, self.proc):
            if not rng.pages_off(targets):
                continue
            turn = self._move_range(pid, rng, targets, turn, report, cancelled)
            if turn < 0:
                break  # the process is gone, or the move was cancelled
        report.elapsed_s = self.clock() - began
        return report

    def _batch(self, page_size: int) -> int:
        """Pages of ``page_size`` in the next call (a 2 MiB page weighs 512 base pages)."""
        return max(1, self.batch // max(1, page_size // 4096))

    def _move_range(self, pid: int, rng: procfs.NumaRange, targets: tuple[int, ...], turn: int,
                    report: MoveReport, cancelled: Callable[[], bool]) -> int:
        """Ask where a window of pages is (cheap), move those off the targets in timed calls;
        the next ``turn`` of the target nodes, or -1 when the process is gone or the move cancelled."""
        weight = max(1, rng.page_size // 4096)
        window = max(1, QUERY_WINDOW // weight)
        for lo in range(rng.start, rng.end, window * rng.page_size):
            if cancelled():
                report.cancelled = True
                return -1
            addrs = list(range(lo, min(rng.end, lo + window * rng.page_size), rng.page_size))
            where = move_pages(pid, addrs, None)
            if where is None:
                return -1
            off = [a for a, node in zip(addrs, where) if node >= 0 and node not in targets]
            while off:
                if cancelled():
                    report.cancelled = True
                    return -1
                chunk, off = off[:self._batch(rng.page_size)], off[self._batch(rng.page_size):]
                dest = [targets[(turn + i) % len(targets)] for i in range(len(chunk))]
                turn += len(chunk)
                t0 = self.clock()
                after = move_pages(pid, chunk, dest, self.flags)
                took = self.clock() - t0
                if after is None:
                    return -1
                done = sum(1 for node in after if node in targets)
                report.found += len(chunk)
                report.moved += done
                report.failed += len(chunk) - done
                report.bytes_moved += done * rng.page_size
                report.calls += 1
                report.largest_call_s = max(report.largest_call_s, took)
                self._learn(took, len(chunk) * weight)
        return turn

    def _learn(self, took: float, base_pages: int) -> None:
        """Size the next call from this one: aim at half the budget, at most doubling.  A call
        costs a fixed part (draining per-CPU lists, TLB flushes on every CPU) plus a part per
        page, so the aim is approached from below over a few calls rather than overshot."""
        aim = self.budget_s * 0.5
        scaled = base_pages * aim / took if took > 0 else float(MAX_BATCH)
        self.batch = max(MIN_BATCH, min(MAX_BATCH, round(min(scaled, 2.0 * base_pages))))

"""Where another process's pages are, as the kernel says: move_pages(2) in query mode (no target
nodes: nothing moves, each page's status is its node, or -ENOENT when it is not present), and the
mappings of /proc/PID/numa_maps with their memory policy (a guest tests' helper)."""

from __future__ import annotations

import ctypes
import errno
import os
import re
from collections import Counter
from dataclasses import dataclass

from cod.rm.enforce.syscalls import syscall_number

PAGE = os.sysconf("SC_PAGE_SIZE")
BATCH = 16384  # pages per call

_libc = ctypes.CDLL(None, use_errno=True)


def page_nodes(pid: int, start: int, end: int) -> Counter:
    """Pages of [start, end) of ``pid`` per node; pages that are not present are not counted.
    Raises OSError when the call fails (the process is gone, no permission)."""
    nr = syscall_number("move_pages", "reading where pages are")
    counts: Counter = Counter()
    for lo in range(start, end, BATCH * PAGE):
        n = min(BATCH, (end - lo) // PAGE)
        pages = (ctypes.c_void_p * n)(*(lo + i * PAGE for i in range(n)))
        status = (ctypes.c_int * n)()
        if _libc.syscall(nr, pid, ctypes.c_ulong(n), pages, None, status, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"move_pages({pid}, query): {os.strerror(err)}")
        for s in status:
            if s >= 0:
                counts[s] += 1
            elif s != -errno.ENOENT:
                raise OSError(-s, f"move_pages({pid}) page status: {os.strerror(-s)}")
    return counts


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    policy: str  # numa_maps' policy word: default, bind:1, interleave:0-1, prefer:0 ...


def mappings(pid: int) -> list[Mapping]:
    """Every mapping of ``pid`` with its memory policy (numa_maps gives the start and the policy,
    maps the end)."""
    ends = {}
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            ends[lo] = hi
    out = []
    with open(f"/proc/{pid}/numa_maps") as f:
        for line in f:
            start, policy = line.split()[:2]
            lo = int(start, 16)
            if lo in ends:  # a mapping gone between the two reads is skipped
                out.append(Mapping(lo, ends[lo], policy))
    return out


def bound_node(m: Mapping) -> int | None:
    """The node a ``bind:N`` mapping is bound to (one node), else None."""
    found = re.fullmatch(r"bind:(\d+)", m.policy)
    return int(found.group(1)) if found else None

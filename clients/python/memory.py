"""Where a task's new pages go: its memory nodes as the kernel's memory policy, set in the process.

The daemon moves a task's resident pages when its nodes change (both enforcement modes), and in
cpuset mode the kernel allocates new pages on the cpuset's nodes by itself.  In affinity mode no
cgroup bounds the task's memory: pages land by first touch on the node of the CPU that touches
them, unless the process sets a policy, and a policy (``set_mempolicy(2)``) belongs to the thread
that sets it.  So the engine applies its allocation's ``memory_nodes`` itself:

* `bind_thread(nodes)` from each worker thread (``MPOL_BIND``, or ``"preferred"``);
* `MemoryRanges`: address ranges the engine registers (its buffer pool), bound with ``mbind(2)``,
  which any thread may call for any range; `Client.register_task(..., memory=ranges)` re-binds
  them on every ``allocation_changed`` upcall of the task, before the task's own handler runs.

docs/design-enforce.md says which guarantee holds in which mode.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from .errors import CodError

# (mbind, set_mempolicy, get_mempolicy): arch/x86/entry/syscalls/syscall_64.tbl and the
# generic table (include/uapi/asm-generic/unistd.h) that arm64, riscv and loongarch use.
SYSCALLS = {
    "x86_64": (237, 238, 239),
    "aarch64": (235, 237, 236), "riscv64": (235, 237, 236), "loongarch64": (235, 237, 236),
}
MODES = {"default": 0, "preferred": 1, "bind": 2, "interleave": 3}  # include/uapi/linux/mempolicy.h
MPOL_MF_MOVE = 1 << 1

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _numbers() -> tuple[int, int, int]:
    arch = platform.machine()
    try:
        return SYSCALLS[arch]
    except KeyError:
        raise CodError(f"memory policies are not supported on {arch} by this client") from None


def _nodes(nodes: Iterable[int]) -> tuple[int, ...]:
    out = tuple(sorted(set(nodes)))
    if not out or any(not isinstance(n, int) or isinstance(n, bool) or n < 0 or n >= 4096 for n in out):
        raise CodError(f"memory nodes {list(nodes)!r}: give one or more node numbers (0-4095)")
    return out


def _mode(mode: str) -> int:
    if mode not in MODES or mode == "default":
        raise CodError(f"memory policy mode {mode!r}: use 'bind', 'preferred' or 'interleave'")
    return MODES[mode]


def _mask(nodes: tuple[int, ...]) -> tuple[Any, int]:
    words = nodes[-1] // 64 + 1
    mask = (ctypes.c_ulong * words)()
    for n in nodes:
        mask[n // 64] |= 1 << (n % 64)
    return mask, words * 64 + 1  # maxnode: the kernel reads maxnode - 1 bits


def _check(res: int, what: str) -> None:
    if res < 0:
        e = ctypes.get_errno()
        raise CodError(f"{what} failed: {os.strerror(e)}")


def bind_thread(nodes: Iterable[int], mode: str = "bind") -> None:
    """The calling thread's new pages on ``nodes`` (``set_mempolicy(2)``); ``"preferred"`` falls
    back to other nodes when those are full, ``"bind"`` does not."""
    nodes = _nodes(nodes)
    if mode == "preferred":
        nodes = nodes[:1]  # MPOL_PREFERRED takes one node
    mask, maxnode = _mask(nodes)
    _check(_libc.syscall(_numbers()[1], ctypes.c_int(_mode(mode)), mask, ctypes.c_ulong(maxnode)),
           f"set_mempolicy({mode}, nodes {list(nodes)})")


def unbind_thread() -> None:
    """The calling thread back to the default policy (first touch)."""
    _check(_libc.syscall(_numbers()[1], ctypes.c_int(MODES["default"]), None, ctypes.c_ulong(0)),
           "set_mempolicy(default)")


MPOL_F_ADDR = 1 << 1  # get_mempolicy: the policy of the range holding addr


def thread_policy(addr: int | None = None) -> tuple[str, tuple[int, ...]]:
    """The calling thread's policy, or with ``addr`` that of the mapping holding it: (mode,
    nodes), e.g. ("bind", (3,)) or ("default", ())."""
    mode = ctypes.c_int()
    mask = (ctypes.c_ulong * 64)()
    _check(_libc.syscall(_numbers()[2], ctypes.byref(mode), mask, ctypes.c_ulong(64 * 64 + 1),
                         None if addr is None else ctypes.c_void_p(addr),
                         ctypes.c_ulong(0 if addr is None else MPOL_F_ADDR)), "get_mempolicy")
    nodes = tuple(w * 64 + b for w in range(64) for b in range(64) if mask[w] >> b & 1)
    name = next((k for k, v in MODES.items() if v == mode.value & 0xFFFF), str(mode.value))
    return name, nodes


def bind_range(addr: int, length: int, nodes: Iterable[int], mode: str = "bind", move: bool = False) -> None:
    """Pages of ``[addr, addr + length)`` on ``nodes`` (``mbind(2)``; ``addr`` page-aligned).
    ``move`` also moves the resident ones, in one call: leave that to the daemon, which moves
    them in batches of bounded time."""
    nodes = _nodes(nodes)
    if addr % os.sysconf("SC_PAGE_SIZE") or length <= 0:
        raise CodError(f"range {addr:#x}+{length}: the address must be page-aligned and the length positive")
    if mode == "preferred":
        nodes = nodes[:1]
    mask, maxnode = _mask(nodes)
    _check(_libc.syscall(_numbers()[0], ctypes.c_void_p(addr), ctypes.c_ulong(length), ctypes.c_int(_mode(mode)),
                         mask, ctypes.c_ulong(maxnode), ctypes.c_uint(MPOL_MF_MOVE if move else 0)),
           f"mbind({addr:#x}, {length}, nodes {list(nodes)})")


class MemoryRanges:
    """Address ranges an engine registers (its buffer pool, its tables), bound to the task's
    memory nodes now and whenever its allocation changes (`follow`)."""

    def __init__(self, mode: str = "bind") -> None:
        _mode(mode)
        self.mode = mode
        self._lock = threading.Lock()
        self._ranges: dict[int, int] = {}
        self.nodes: tuple[int, ...] = ()

    def register(self, addr: int, length: int) -> None:
        """Add a range; bound at once when the nodes are known."""
        with self._lock:
            if self.nodes:
                bind_range(addr, length, self.nodes, self.mode)
            self._ranges[addr] = length

    def unregister(self, addr: int) -> None:
        with self._lock:
            if self._ranges.pop(addr, None) is None:
                raise CodError(f"no registered range at {addr:#x}")

    def follow(self, allocation: Mapping[str, Any]) -> None:
        """Bind every range to the allocation's ``memory_nodes`` (an upcall or a reply); an
        allocation without nodes (no CPU yet) changes nothing."""
        nodes = tuple(allocation.get("memory_nodes") or ())
        if not nodes:
            return
        with self._lock:
            for addr, length in self._ranges.items():
                bind_range(addr, length, nodes, self.mode)
            self.nodes = _nodes(nodes)

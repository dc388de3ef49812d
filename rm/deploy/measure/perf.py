"""Per-thread hardware counters through perf_event_open(2), by ctypes (no extra package).

The paper derives RAVs from PMU events: instructions and cycles (IPC, Eq. 1)
and memory traffic (Eq. 2; on Intel approximated by last-level-cache misses
times the line size).  We count, per thread, the generic events
``instructions``, ``cycles`` and ``cache-misses`` (the LLC misses on x86).
On machines without a PMU (most VMs, these included) opening a hardware
event fails: :func:`probe` says so and the profile leaves ``mem_bw`` unknown.
Software events (task-clock) work everywhere and test this module's plumbing.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from dataclasses import dataclass

from cod.protocol.errors import CodError

PERF_TYPE_HARDWARE = 0
PERF_TYPE_SOFTWARE = 1
PERF_COUNT_HW_CPU_CYCLES = 0
PERF_COUNT_HW_INSTRUCTIONS = 1
PERF_COUNT_HW_CACHE_MISSES = 3
PERF_COUNT_SW_TASK_CLOCK = 1
PERF_FORMAT_TOTAL_TIME_ENABLED = 1
PERF_FORMAT_TOTAL_TIME_RUNNING = 2
PERF_FLAG_FD_CLOEXEC = 8
# attr.flags bits
_EXCLUDE_KERNEL = 1 << 5
_EXCLUDE_HV = 1 << 6

CACHE_LINE_BYTES = 64

HW_EVENTS = {
    "instructions": PERF_COUNT_HW_INSTRUCTIONS,
    "cycles": PERF_COUNT_HW_CPU_CYCLES,
    "llc_misses": PERF_COUNT_HW_CACHE_MISSES,
}

_SYSCALL = {"x86_64": 298, "aarch64": 241, "riscv64": 241, "ppc64le": 319, "ppc64": 319,
            "s390x": 331, "i686": 336, "i386": 336}


class PerfEventAttr(ctypes.Structure):
    """struct perf_event_attr up to PERF_ATTR_SIZE_VER5 (112 bytes)."""

    _fields_ = [
        ("type", ctypes.c_uint32), ("size", ctypes.c_uint32), ("config", ctypes.c_uint64),
        ("sample_period", ctypes.c_uint64), ("sample_type", ctypes.c_uint64),
        ("read_format", ctypes.c_uint64), ("flags", ctypes.c_uint64),
        ("wakeup_events", ctypes.c_uint32), ("bp_type", ctypes.c_uint32),
        ("config1", ctypes.c_uint64), ("config2", ctypes.c_uint64),
        ("branch_sample_type", ctypes.c_uint64), ("sample_regs_user", ctypes.c_uint64),
        ("sample_stack_user", ctypes.c_uint32), ("clockid", ctypes.c_int32),
        ("sample_regs_intr", ctypes.c_uint64), ("aux_watermark", ctypes.c_uint32),
        ("sample_max_stack", ctypes.c_uint16), ("reserved_2", ctypes.c_uint16),
    ]


assert ctypes.sizeof(PerfEventAttr) == 112

_libc = ctypes.CDLL(None, use_errno=True)


class PerfError(CodError, OSError):
    """perf_event_open(2) or reading a counter failed; ``errno`` says why, as for any OSError."""


def perf_event_open(type_: int, config: int, tid: int, *, exclude_kernel: bool = True) -> int:
    """A counting event for thread ``tid`` on any CPU; returns its fd."""
    nr = _SYSCALL.get(platform.machine())
    if nr is None:
        raise PerfError(errno.ENOSYS, f"perf_event_open: unknown syscall number on {platform.machine()}")
    attr = PerfEventAttr()
    attr.type = type_
    attr.size = ctypes.sizeof(PerfEventAttr)
    attr.config = config
    attr.read_format = PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING
    attr.flags = (_EXCLUDE_KERNEL if exclude_kernel else 0) | _EXCLUDE_HV
    fd = _libc.syscall(ctypes.c_long(nr), ctypes.byref(attr), ctypes.c_int(tid), ctypes.c_int(-1),
                       ctypes.c_int(-1), ctypes.c_ulong(PERF_FLAG_FD_CLOEXEC))
    if fd < 0:
        err = ctypes.get_errno()
        raise PerfError(err, f"perf_event_open: {os.strerror(err)}")
    return fd


def read_scaled(fd: int) -> int | None:
    """The count, scaled up for multiplexing; None if the event never ran."""
    value, enabled, running = struct.unpack("QQQ", os.read(fd, 24))
    if running == 0:
        return None
    return value if running == enabled else int(value * enabled / running)


def probe() -> tuple[bool, str]:
    """Whether hardware counters work here, and if not why (for the profile's output)."""
    try:
        fd = perf_event_open(PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS, 0)
    except PerfError as err:
        why = {errno.ENOENT: "no hardware PMU (a VM without a virtual PMU?)",
               errno.EOPNOTSUPP: "no hardware PMU",
               errno.ENODEV: "no hardware PMU",
               errno.EACCES: "not permitted (kernel.perf_event_paranoid)",
               errno.EPERM: "not permitted (kernel.perf_event_paranoid)",
               errno.ENOSYS: "perf_event_open not available"}.get(err.errno, "")
        return False, f"{err.strerror}{': ' + why if why else ''}"
    os.close(fd)
    return True, "hardware counters available"


@dataclass
class ThreadCounters:
    """instructions, cycles and LLC misses of one thread, counting from open()."""

    tid: int
    fds: dict[str, int]

    @classmethod
    def open(cls, tid: int, exclude_kernel: bool = True) -> "ThreadCounters":
        fds: dict[str, int] = {}
        try:
            for name, config in HW_EVENTS.items():
                fds[name] = perf_event_open(PERF_TYPE_HARDWARE, config, tid, exclude_kernel=exclude_kernel)
        except PerfError:
            for fd in fds.values():
                os.close(fd)
            raise
        return cls(tid, fds)

    def read(self) -> dict[str, int | None]:
        return {name: read_scaled(fd) for name, fd in self.fds.items()}

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}

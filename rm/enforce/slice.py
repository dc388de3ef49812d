"""The RM's event loop asks the scheduler for a short slice, so that a process event wakes it at once.

Linux >= 6.12 schedules SCHED_OTHER tasks by EEVDF, where a thread may ask for its own slice
(``sched_setattr`` with ``sched_runtime``, no privilege needed; 0.1 to 100 ms, 0.7 ms x
(1 + log2 CPUs) by default).  A task woken with a shorter slice than the running one may preempt
it before that one's slice is used up.  Measured on the host (docs/design-enforce.md,
"Measured on the host"): an exec event's reader woken onto the exec'ing child's CPU otherwise waits
until the child leaves that CPU (its exit, for /bin/true: 400 us at the median), the tail of both
the BPF and the connector event paths.  The flag SCHED_FLAG_RESET_ON_FORK keeps the short slice to
this thread: its threads and children start with the default one (and, by the same kernel rule,
with nice 0 if this thread's nice is negative; cod-rm.service sets none).  Kernels before 6.12 ignore
``sched_runtime`` for SCHED_OTHER: the call is harmless there.

Opt-in (``event_loop_rt_priority``, root): SCHED_FIFO at a low real-time priority, which preempts
every SCHED_OTHER task at once, whatever its slice and however loaded the machine.  Not the
default, because every request of every client is handled on that thread too: a client that
floods the daemon would then take up to the kernel's real-time share of a CPU (95 %) ahead of
the machine's other work.  Reset on fork as well: the engine, the solver's threads and every
other thread or child start as SCHED_OTHER.
"""

from __future__ import annotations

import ctypes
import os
import struct

from .errors import EnforceError
from .syscalls import syscall_number

EVENT_LOOP_SLICE_NS = 100_000  # the kernel's shortest slice
RT_PRIORITY_MAX = 99  # sched_get_priority_max(SCHED_FIFO) on Linux
SCHED_OTHER = 0
SCHED_FIFO = 1
SCHED_FLAG_RESET_ON_FORK = 0x01
# struct sched_attr (include/uapi/linux/sched/types.h), SCHED_ATTR_SIZE_VER1: size, policy, flags,
# nice, priority, runtime, deadline, period, util_min, util_max
SCHED_ATTR = struct.Struct("=IIQiIQQQII")


def sched_attr(policy: int, nice: int = 0, priority: int = 0, runtime_ns: int = 0) -> bytes:
    """``struct sched_attr`` for this thread, reset on fork.  Pure."""
    return SCHED_ATTR.pack(SCHED_ATTR.size, policy, SCHED_FLAG_RESET_ON_FORK, nice, priority,
                           runtime_ns, 0, 0, 0, 0)


def request_slice(ns: int = EVENT_LOOP_SLICE_NS) -> None:
    """Ask for an EEVDF slice of ``ns`` for the calling thread (SCHED_OTHER, its nice kept, not
    inherited by its children).  An EnforceError saying why when the kernel refuses."""
    if not 100_000 <= ns <= 100_000_000:
        raise EnforceError(f"a slice is 0.1 to 100 ms, not {ns} ns")
    _set_attr(sched_attr(SCHED_OTHER, nice=os.getpriority(os.PRIO_PROCESS, 0), runtime_ns=ns),
              f"sched_setattr(slice {ns} ns)")


def request_realtime(priority: int) -> None:
    """Run the calling thread SCHED_FIFO at ``priority`` (1-99; needs CAP_SYS_NICE), not inherited
    by its threads and children.  An EnforceError saying why when the kernel refuses."""
    if isinstance(priority, bool) or not isinstance(priority, int) or not 1 <= priority <= RT_PRIORITY_MAX:
        raise EnforceError(f"a real-time priority is 1 to {RT_PRIORITY_MAX}, not {priority!r}")
    _set_attr(sched_attr(SCHED_FIFO, priority=priority), f"sched_setattr(SCHED_FIFO, priority {priority})")


def _set_attr(packed: bytes, what: str) -> None:
    number = syscall_number("sched_setattr", "asking the scheduler for the event loop's policy",
                            remedy="the RM runs with the default slice")
    attr = ctypes.create_string_buffer(packed, len(packed))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, 0, attr, 0) != 0:
        err = ctypes.get_errno()
        raise EnforceError(f"{what} refused: {os.strerror(err)}")

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
"""

from __future__ import annotations

import ctypes
import os
import struct

from .errors import EnforceError
from .syscalls import syscall_number

EVENT_LOOP_SLICE_NS = 100_000  # the kernel's shortest slice
SCHED_OTHER = 0
SCHED_FLAG_RESET_ON_FORK = 0x01
# struct sched_attr (include/uapi/linux/sched/types.h), SCHED_ATTR_SIZE_VER1: size, policy, flags,
# nice, priority, runtime, deadline, period, util_min, util_max
SCHED_ATTR = struct.Struct("=IIQiIQQQII")


def request_slice(ns: int = EVENT_LOOP_SLICE_NS) -> None:
    """Ask for an EEVDF slice of ``ns`` for the calling thread (SCHED_OTHER, its nice kept, not
    inherited by its children).  An EnforceError saying why when the kernel refuses."""
    if not 100_000 <= ns <= 100_000_000:
        raise EnforceError(f"a slice is 0.1 to 100 ms, not {ns} ns")
    number = syscall_number("sched_setattr", "asking for a scheduler slice",
                            remedy="the RM runs with the default slice")
    nice = os.getpriority(os.PRIO_PROCESS, 0)
    attr = ctypes.create_string_buffer(SCHED_ATTR.pack(
        SCHED_ATTR.size, SCHED_OTHER, SCHED_FLAG_RESET_ON_FORK, nice, 0, ns, 0, 0, 0, 0), SCHED_ATTR.size)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, 0, attr, 0) != 0:
        err = ctypes.get_errno()
        raise EnforceError(f"sched_setattr(slice {ns} ns) refused: {os.strerror(err)}")

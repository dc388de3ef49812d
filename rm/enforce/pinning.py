"""Pinning threads with ``sched_setaffinity``: the mechanism under every backend.

`set_thread_affinity` pins one thread (tolerating threads that exit and
kernel threads whose mask is fixed, as tuned does); `pin_process` every thread
of a process, listing them again while new ones appear; `own_placement`
tells a placement the program chose itself from the one the RM gave (design
decision 14 of docs/design-enforce.md).  Threads are listed by the one /proc
reader, :mod:`.procfs`.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Mapping, Sequence

from cod.facts import procfs

from .errors import EnforceError

# A thread may be created while we pin its siblings; re-list this many times.
PIN_ROUNDS = 4


def set_thread_affinity(tid: int, cpus: Sequence[int], proc: str = procfs.PROC) -> bool:
    """Pin one thread.  False when it is gone or is a kernel thread with a fixed mask."""
    try:
        os.sched_setaffinity(tid, cpus)
        return True
    except ProcessLookupError:
        return False
    except OSError as err:
        if err.errno == errno.EINVAL:
            st = _stat_or_none(tid, proc)
            if st is None or st.is_kernel_thread:
                return False  # exited meanwhile, or a per-CPU kernel thread
            raise EnforceError(
                f"cannot pin thread {tid} to CPUs {procfs.format_cpu_list(cpus)}: "
                "none of them is allowed (offline, or outside its cpuset)"
            ) from err
        if err.errno == errno.EPERM:
            raise EnforceError(f"not permitted to pin thread {tid} (not root, not its owner)") from err
        raise EnforceError(f"cannot pin thread {tid}: {err.strerror}") from err


def _stat_or_none(tid: int, proc: str) -> procfs.Stat | None:
    try:
        return procfs.read_stat(tid, proc=proc)
    except (FileNotFoundError, ProcessLookupError):
        return None


def own_placement(mask: Sequence[int], given: Sequence[int] | None, cpus: Sequence[int],
                  former: Iterable[Sequence[int]] = ()) -> tuple[int, ...] | None:
    """A thread's own placement, to keep when its task is pinned to ``cpus`` (design decision 14).

    ``mask`` is the thread's mask now and ``given`` the mask the RM gave the whole task before
    (None at the first pin: nothing is kept then).  A mask that differs from ``given`` was set
    by the thread's program (a storage engine pins each scan thread to one core); it is kept
    when it lies inside ``cpus``.  A mask equal to ``given``, or to one of the masks the RM gave
    the task before that (``former``), cannot be told from the RM's own pinning and follows the
    task: a process forked before its task's CPUs changed inherits the old mask (decision 18).
    None: give the thread the whole of ``cpus``."""
    own = set(mask)
    if not own or given is None or own == set(given) or not own <= set(cpus):
        return None
    if any(own == set(f) for f in former):
        return None
    return tuple(sorted(own))


def thread_placements(pid: int, given: Sequence[int] | None, cpus: Sequence[int],
                      proc: str = procfs.PROC, former: Iterable[Sequence[int]] = ()) -> dict[int, tuple[int, ...]]:
    """The own placements (see `own_placement`) of ``pid``'s threads, read before re-pinning."""
    out: dict[int, tuple[int, ...]] = {}
    if given is None:
        return out
    former = [tuple(f) for f in former]
    for tid in procfs.thread_ids(pid, proc):
        try:
            kept = own_placement(tuple(os.sched_getaffinity(tid)), given, cpus, former)
        except OSError:
            continue
        if kept is not None:
            out[tid] = kept
    return out


def pin_process(pid: int, cpus: Sequence[int], proc: str = procfs.PROC,
                placements: Mapping[int, Sequence[int]] | None = None) -> list[int]:
    """Pin every thread of ``pid``; returns the tids pinned ([] when it is gone).

    A thread in ``placements`` gets its own placement there (inside ``cpus``) instead."""
    done: set[int] = set()
    placements = placements or {}
    for _ in range(PIN_ROUNDS):
        new = [t for t in procfs.thread_ids(pid, proc) if t not in done]
        if not new:
            break
        for tid in new:
            # False (gone, fixed kthread): no retry either
            set_thread_affinity(tid, placements.get(tid, cpus), proc)
            done.add(tid)
    return sorted(t for t in done if os.path.exists(f"{proc}/{pid}/task/{t}"))

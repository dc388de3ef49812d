"""The event loop's scheduling (cod.rm.enforce.slice) against the real kernel: the short slice,
and the opt-in SCHED_FIFO.

Each test asks from a thread of its own, so the test process keeps what it has, and measures what
a thread has from a new thread: an in-process daemon of another test may have given this
process's main thread the short slice (its event loop ran there), which new threads do not inherit."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from cod.rm.enforce.errors import EnforceError
from cod.rm.enforce.slice import (EVENT_LOOP_SLICE_NS, SCHED_ATTR, SCHED_FIFO, SCHED_OTHER, request_realtime,
                                  request_slice, sched_attr)
from cod.rm.enforce.syscalls import syscall_number
from helpers.procs import needs_root
from helpers.rm_support import NOBODY, as_user


def sched_slice(path: str) -> int:
    """se.slice (ns) from a /proc sched file."""
    for line in open(path).read().splitlines():
        if line.startswith("se.slice"):
            return int(line.split(":")[1])
    pytest.skip("this kernel shows no se.slice in /proc/PID/sched (before 6.6, or no SCHED_DEBUG)")


def in_a_thread(work):
    """Run ``work()`` in a new thread; what it returned, or the exception it raised."""
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = work()
        except Exception as err:  # handed to the test
            out["error"] = err
    t = threading.Thread(target=run)
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_the_thread_gets_the_short_slice_and_its_children_the_default():
    default = in_a_thread(lambda: sched_slice("/proc/thread-self/sched"))
    if default == EVENT_LOOP_SLICE_NS:
        pytest.skip("a new thread already has the short slice")
    main_before = sched_slice("/proc/thread-self/sched")

    def work() -> tuple[int, int, int]:
        request_slice()
        mine = sched_slice("/proc/thread-self/sched")
        child = subprocess.run(["cat", "/proc/self/sched"], capture_output=True, text=True, check=True).stdout
        child_slice = next(int(l.split(":")[1]) for l in child.splitlines() if l.startswith("se.slice"))
        return mine, child_slice, os.sched_getscheduler(0)
    mine, child, policy = in_a_thread(work)
    assert mine == EVENT_LOOP_SLICE_NS
    assert child == default  # SCHED_FLAG_RESET_ON_FORK: not inherited
    assert policy == os.SCHED_OTHER | os.SCHED_RESET_ON_FORK
    assert sched_slice("/proc/thread-self/sched") == main_before  # other threads keep theirs


@pytest.mark.parametrize("ns", [0, 99_999, 100_000_001, -1])
def test_a_slice_out_of_the_kernels_range_is_refused_and_changes_nothing(ns):
    def work() -> tuple[int, int]:
        before = sched_slice("/proc/thread-self/sched")
        with pytest.raises(EnforceError, match=r"0\.1 to 100 ms, not"):
            request_slice(ns)
        return before, sched_slice("/proc/thread-self/sched")
    before, after = in_a_thread(work)
    assert after == before


def test_an_unknown_architecture_is_a_clear_error():
    with pytest.raises(EnforceError, match=r"scheduler slice is not supported on vax.*default slice"):
        syscall_number("sched_setattr", "asking for a scheduler slice", "vax", remedy="the RM runs with the default slice")


@pytest.mark.parametrize("args,fields", [
    # (policy, nice, priority, runtime) -> size, policy, flags (reset on fork), nice, priority, runtime
    ((SCHED_OTHER, 0, 0, EVENT_LOOP_SLICE_NS), (SCHED_ATTR.size, 0, 1, 0, 0, 100_000)),
    ((SCHED_OTHER, 5, 0, 2_000_000), (SCHED_ATTR.size, 0, 1, 5, 0, 2_000_000)),
    ((SCHED_FIFO, 0, 1, 0), (SCHED_ATTR.size, 1, 1, 0, 1, 0)),
    ((SCHED_FIFO, 0, 99, 0), (SCHED_ATTR.size, 1, 1, 0, 99, 0)),
])
def test_the_attributes_asked_for(args, fields):
    policy, nice, priority, runtime = args
    assert SCHED_ATTR.unpack(sched_attr(policy, nice, priority, runtime))[:6] == fields


@needs_root()
def test_a_real_time_threads_children_and_threads_do_not_inherit_it():
    def work() -> tuple[int, int, int, int] | EnforceError:
        try:
            request_realtime(1)
        except EnforceError as err:
            return err
        child = subprocess.run([sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"],
                               capture_output=True, text=True, check=True).stdout
        thread_policy = in_a_thread(lambda: os.sched_getscheduler(0))
        return os.sched_getscheduler(0), os.sched_getparam(0).sched_priority, int(child), thread_policy
    main_before = os.sched_getscheduler(0)
    got = in_a_thread(work)
    if isinstance(got, EnforceError):  # e.g. a cgroup with no real-time runtime (RT_GROUP_SCHED)
        pytest.skip(f"this kernel refuses SCHED_FIFO to root here: {got}")
    policy, priority, child, thread = got
    assert policy == os.SCHED_FIFO | os.SCHED_RESET_ON_FORK and priority == 1
    assert child == os.SCHED_OTHER and thread == os.SCHED_OTHER
    assert os.sched_getscheduler(0) == main_before  # other threads keep theirs


@pytest.mark.parametrize("priority", [0, 100, -1, True, "1", 1.0])
def test_a_priority_out_of_range_is_refused_and_changes_nothing(priority):
    def work() -> tuple[int, int]:
        before = os.sched_getscheduler(0)
        with pytest.raises(EnforceError, match=r"a real-time priority is 1 to 99, not"):
            request_realtime(priority)
        return before, os.sched_getscheduler(0)
    before, after = in_a_thread(work)
    assert after == before


@needs_root()
def test_without_the_privilege_the_kernel_refuses_and_says_so():
    def unprivileged() -> None:
        with pytest.raises(EnforceError, match=r"sched_setattr\(SCHED_FIFO, priority 1\) refused: Operation not permitted"):
            request_realtime(1)
        assert os.sched_getscheduler(0) == os.SCHED_OTHER
    assert as_user(NOBODY, unprivileged) == 0

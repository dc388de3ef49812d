"""The event loop's short scheduler slice (cod.rm.enforce.slice) against the real kernel.

Each test asks for the slice from a thread of its own, so the test process keeps its default."""

from __future__ import annotations

import os
import subprocess
import threading

import pytest

from cod.rm.enforce.errors import EnforceError
from cod.rm.enforce.slice import EVENT_LOOP_SLICE_NS, request_slice
from cod.rm.enforce.syscalls import syscall_number


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
    default = sched_slice("/proc/thread-self/sched")
    if default == EVENT_LOOP_SLICE_NS:
        pytest.skip("this thread already has the short slice")

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
    assert sched_slice("/proc/thread-self/sched") == default  # other threads keep theirs


@pytest.mark.parametrize("ns", [0, 99_999, 100_000_001, -1])
def test_a_slice_out_of_the_kernels_range_is_refused_and_changes_nothing(ns):
    before = sched_slice("/proc/thread-self/sched")

    def work() -> int:
        with pytest.raises(EnforceError, match=r"0\.1 to 100 ms, not"):
            request_slice(ns)
        return sched_slice("/proc/thread-self/sched")
    assert in_a_thread(work) == before


def test_an_unknown_architecture_is_a_clear_error():
    with pytest.raises(EnforceError, match=r"scheduler slice is not supported on vax.*default slice"):
        syscall_number("sched_setattr", "asking for a scheduler slice", "vax", remedy="the RM runs with the default slice")

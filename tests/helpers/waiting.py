"""Polling until something holds: the one wait helper of the tests."""

from __future__ import annotations

import os
import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_until(check: Callable[[], T], timeout: float = 5.0, what: str = "condition",
               interval: float = 0.01) -> T:
    """Call ``check`` until it returns something truthy and return that; fail the test
    (AssertionError naming ``what``) when ``timeout`` seconds pass first."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(interval)


# The time a solver is given where a test checks what it proves (optimality, a gap, the oracle's
# optimum), not how fast: a quiet machine proves these instances in well under the allocator's
# default second, but at load 9 on 2 CPUs (two clean-clone runs with their guests and a spinner)
# a 1 s budget ran out ("feasible", "count model, time limit"). A proof ends the solve at once,
# so this costs nothing when the machine is quiet.
PROVING_S = 60.0


def load_scaled(seconds: float) -> float:
    """A time budget for work that needs CPU (a daemon's start-up: ~1 s of CPU for the daemon and as
    much for its engine), stretched by how oversubscribed the machine is (1-minute load average per
    CPU, at least 1): at load 28 on 2 CPUs a process gets ~1/14 of a CPU and a start-up that takes
    4 s at load 12 took over 20 s.  On a quiet machine the budget is ``seconds`` unchanged."""
    return seconds * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))

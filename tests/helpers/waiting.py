"""Polling until something holds: the one wait helper of the tests."""

from __future__ import annotations

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

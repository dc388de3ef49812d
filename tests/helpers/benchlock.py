"""The shared lock that keeps timing-sensitive work (benchmarks, duty-cycle measurements) apart."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time

LOCK_PATH = "/tmp/cod-bench.lock"


@contextlib.contextmanager
def bench_lock(timeout_s: float = 1200.0):
    """Hold ``flock /tmp/cod-bench.lock`` (as the benches do) for the block."""
    fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{LOCK_PATH} stayed locked for {timeout_s:.0f} s") from None
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)  # releases the lock

"""A cgroup of the test's own (v2 where mounted, else v1 cpuacct), removed afterwards.

Only the processes a test starts go in; on removal whatever is left is moved
back to the parent, so nothing of anybody else is ever touched.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator


def cgroup_root() -> str | None:
    """A hierarchy where we may make a group with a CPU counter: cgroup2, else v1 cpuacct."""
    v1 = None
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) < 4:
                continue
            path, fstype, options = fields[1], fields[2], fields[3].split(",")
            if fstype == "cgroup2":
                return path
            if fstype == "cgroup" and "cpuacct" in options and v1 is None:
                v1 = path
    return v1


def enter(path: str, pid: int) -> None:
    with open(os.path.join(path, "cgroup.procs"), "w") as f:
        f.write(str(pid))


def remove(path: str) -> None:
    """Move what is left to the parent and remove the directory (no error if gone)."""
    parent = os.path.dirname(path)
    for _ in range(200):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            pass
        try:
            with open(os.path.join(path, "cgroup.procs")) as f:
                left = [int(x) for x in f.read().split()]
        except FileNotFoundError:
            return
        for pid in left:
            try:
                enter(parent, pid)
            except OSError:
                pass
        time.sleep(0.01)
    os.rmdir(path)


def remove_tree(path: str) -> None:
    """``remove`` for a cgroup and every cgroup under it, deepest first (nothing if it is gone)."""
    for sub, _dirs, _files in sorted(os.walk(path), key=lambda w: -w[0].count(os.sep)):
        remove(sub)


def cgroup_v1_root() -> str | None:
    """A cgroup v1 hierarchy with a CPU counter (cpuacct): the one where a cgroup can be renamed."""
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 4 and fields[2] == "cgroup" and "cpuacct" in fields[3].split(","):
                return fields[1]
    return None


@contextlib.contextmanager
def temp_cgroup(tag: str, skip: bool = True, root: str | None = None) -> Iterator[str]:
    """A new cgroup (under ``root``, by default `cgroup_root`'s hierarchy); without root or a
    hierarchy the test is skipped (``skip``) or this raises."""
    root = root or cgroup_root()
    if os.geteuid() != 0 or root is None:
        if skip:
            import pytest

            pytest.skip("needs root and a cgroup2 or cpuacct hierarchy")
        raise RuntimeError("a cgroup needs root and a cgroup2 or cpuacct hierarchy")
    path = os.path.join(root, f"cod-elastic-{tag}-{os.getpid()}-{time.monotonic_ns() % 10**9}")
    os.mkdir(path)
    try:
        yield path
    finally:
        remove(path)

"""Finding the cpuset controller: cgroup v1 hierarchy or cgroup v2 (unified)."""

from __future__ import annotations

import errno
import os
import time
from dataclasses import dataclass

from cod.facts import procfs

MOUNTS = "/proc/self/mounts"


@dataclass(frozen=True)
class CpusetMount:
    version: int  # 1 or 2
    path: str  # mount point

    def describe(self) -> str:
        return f"cgroup v{self.version} cpuset at {self.path}"


def cgroup_mounts(mounts: str = MOUNTS) -> list[tuple[str, str, list[str]]]:
    """(mount point, ``cgroup`` or ``cgroup2``, options) of every cgroup mount, in mount order."""
    found = []
    with open(mounts) as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 4 and fields[2] in ("cgroup", "cgroup2"):
                found.append((fields[1].replace("\\040", " "), fields[2], fields[3].split(",")))
    return found


def find_cpuset_mount(mounts: str = MOUNTS) -> CpusetMount | None:
    """The cpuset controller's mount: v1 ``cgroup ... cpuset`` first, else a cgroup2 mount
    whose ``cgroup.controllers`` lists cpuset.  None when neither exists."""
    v2: list[str] = []
    for path, fstype, options in cgroup_mounts(mounts):
        if fstype == "cgroup" and "cpuset" in options:
            return CpusetMount(1, path)
        if fstype == "cgroup2":
            v2.append(path)
    for path in v2:
        try:
            with open(os.path.join(path, "cgroup.controllers")) as f:
                if "cpuset" in f.read().split():
                    return CpusetMount(2, path)
        except OSError:
            continue
    return None


def process_cgroup(pid: int, version: int, proc: str = procfs.PROC) -> str | None:
    """The cgroup path (relative to the mount, starting with '/') of ``pid`` in the
    cpuset hierarchy (v1) or the unified one (v2); None when gone or absent."""
    try:
        lines = procfs.cgroups(pid, proc)
    except (FileNotFoundError, ProcessLookupError):
        return None
    for hier, controllers, path in lines:
        if version == 1 and "cpuset" in controllers.split(","):
            return path
        if version == 2 and hier == "0" and controllers == "":
            return path
    return None


def members_file(cgroup_dir: str) -> str:
    """``tasks`` (v1: threads) when present, else ``cgroup.procs`` (v2: processes)."""
    tasks = os.path.join(cgroup_dir, "tasks")
    return tasks if os.path.exists(tasks) else os.path.join(cgroup_dir, "cgroup.procs")


def move_into(cgroup_dir: str, ident: int) -> bool:
    """Write a tid (v1) or pid (v2) into ``cgroup_dir``; False when it is gone.
    Raises OSError for other failures (the caller names the task)."""
    try:
        with open(members_file(cgroup_dir), "w") as f:
            f.write(str(ident))
        return True
    except ProcessLookupError:
        return False
    except OSError as err:
        if err.errno == errno.EINVAL and not procfs.alive(ident):
            return False
        raise


def members(cgroup_dir: str) -> list[int]:
    try:
        with open(members_file(cgroup_dir)) as f:
            return [int(x) for x in f.read().split()]
    except FileNotFoundError:
        return []


def exiting(ident: int) -> bool:
    """True when task ``ident`` is exiting (``PF_EXITING``) or gone: it leaves its cgroup on its
    own, once the kernel has run its exit, and no write can move it before that."""
    try:
        return bool(procfs.read_stat(ident).flags & procfs.PF_EXITING)
    except (FileNotFoundError, ProcessLookupError):
        return True


def remove_cgroup(path: str, evict_to: str, tries: int = 50, wait_for_exits: bool = True) -> bool:
    """Move what is left in ``path`` to ``evict_to`` and remove it; False if it did not exist.

    Tries ``tries`` times, 2 ms apart; with ``wait_for_exits`` False it gives up (EBUSY) as soon
    as what keeps it busy is nothing a move can fix (a task still in it is exiting, or no task is
    left in it: a child cgroup), for a caller that removes it later (rm/enforce/leftovers.py)."""
    for _ in range(tries):
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return False
        except OSError as err:
            if err.errno != errno.EBUSY:
                raise
        left = members(path)
        for m in left:
            try:
                move_into(evict_to, m)
            except OSError:
                pass  # a kernel thread or an exiting task: retry the rmdir
        if not wait_for_exits and (not left or any(exiting(m) for m in left)):
            break
        time.sleep(0.002)
    os.rmdir(path)  # raises EBUSY for the caller to report
    return True

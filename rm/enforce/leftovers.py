"""Task cgroups that could not be removed yet because a task in them is still exiting.

A process in the middle of its exit (``PF_EXITING``, from the signal that killed it until the
kernel's ``cgroup_exit``) stays a member of its cgroup, and a write that moves it elsewhere is
accepted and ignored; the cgroup's ``rmdir`` answers EBUSY until the exit has run. Measured here
(v1 cpuset, kernel 6.18, a process killed with SIGKILL): 73 ms for one holding 0.5 GB, 184 ms
for 2 GB, and longer for one starved of CPU on a loaded machine. Waiting for that in
``release`` held the daemon's event loop (up to ~100 ms, then it gave up and the cgroup stayed
behind the daemon for good). A cgroup that an exiting task keeps busy is kept here instead and
removed later: at the enforcer's next ``apply``/``release``, and at ``close``, which waits for it
a bounded time.
"""

from __future__ import annotations

import errno
import logging
import os
import time

from . import cgroupfs
from .errors import EnforceError

log = logging.getLogger("cod.rm.enforce")

CLOSE_WAIT_S = 5.0  # an exit that takes longer is not one the RM should hold its stop for
POLL_S = 0.01


class Leftovers:
    """The cgroups whose removal found them busy, each with where its members go."""

    def __init__(self) -> None:
        self.pending: dict[str, str] = {}  # cgroup path -> the cgroup its members are evicted to

    def remove(self, path: str, evict_to: str) -> bool:
        """Remove ``path`` now if it can be; kept for later when it is still busy.

        True if it was removed now, False if it did not exist or was kept."""
        try:
            return cgroupfs.remove_cgroup(path, evict_to=evict_to, wait_for_exits=False)
        except OSError as err:
            if err.errno != errno.EBUSY:
                raise EnforceError(f"cannot remove cgroup {path}: {err.strerror}") from err
        self.pending[path] = evict_to
        log.info("cgroup %s is still busy (a task in it is exiting); it is removed later", path)
        return False

    def reused(self, path: str) -> None:
        """``path`` holds a task again: it is no longer ours to remove."""
        self.pending.pop(path, None)

    def retry(self) -> list[str]:
        """One attempt at each (no waiting); the paths removed."""
        done = []
        for path, evict_to in list(self.pending.items()):
            try:
                removed = cgroupfs.remove_cgroup(path, evict_to=evict_to, tries=1, wait_for_exits=False)
            except OSError as err:
                if err.errno == errno.EBUSY:
                    continue
                log.warning("cannot remove cgroup %s: %s", path, err.strerror)
                removed = False
            del self.pending[path]
            if removed:
                done.append(path)
        return done

    def drain(self, wait_s: float = CLOSE_WAIT_S) -> list[str]:
        """Retry until none is left or ``wait_s`` has passed; the paths removed.  Those still
        busy then are named in the log and left."""
        deadline = time.monotonic() + wait_s
        done = self.retry()
        while self.pending and time.monotonic() < deadline:
            time.sleep(POLL_S)
            done += self.retry()
        for path in self.pending:
            members = cgroupfs.members(path) if os.path.isdir(path) else []
            log.warning("left cgroup %s in place: still busy after %g s (tasks in it: %s)",
                        path, wait_s, members)
        return done

"""The enforcement state file: what COD changed, so that it can be undone.

Before COD first pins a thread or moves it into a cgroup it records the
thread's original affinity (and the process's original cpuset cgroup) here,
keyed by pid *and* start time.  The file is rewritten (atomically, by rename)
on every change, so that after a crash (SIGKILL included) the next start finds
exactly what to restore.  A lock (``flock``) on ``STATE_DIR/lock`` is held for
the enforcer's lifetime: a second RM on the same state directory is refused,
and a lock found free means its previous owner is dead.

Format (JSON, versioned like Kubernetes' checkpoints)::

    {"version": 1,
     "tasks": {TASK: {"cgroup": PATH | null,
                      "procs": {PID: {"start": TICKS,
                                      "affinity": [CPU...],          # the process's
                                      "threads": {TID: [CPU...]},    # where a thread differed
                                      "cpuset": PATH | null}},       # original cgroup
                      "children": {PID: <as procs>}}}}              # forked after pinning
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from dataclasses import dataclass, field
from typing import Any

from .errors import EnforceError

VERSION = 1
STATE_FILE = "enforce-state.json"
LOCK_FILE = "lock"


@dataclass
class ProcRecord:
    start: int
    affinity: tuple[int, ...]
    threads: dict[int, tuple[int, ...]] = field(default_factory=dict)
    cpuset: str | None = None  # original cpuset cgroup directory (cpuset backends)

    def to_json(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "affinity": list(self.affinity),
            "threads": {str(t): list(c) for t, c in sorted(self.threads.items())},
            "cpuset": self.cpuset,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ProcRecord":
        return cls(
            start=int(data["start"]),
            affinity=tuple(int(c) for c in data["affinity"]),
            threads={int(t): tuple(int(c) for c in cs) for t, cs in data.get("threads", {}).items()},
            cpuset=data.get("cpuset"),
        )


@dataclass
class TaskRecord:
    cgroup: str | None = None
    procs: dict[int, ProcRecord] = field(default_factory=dict)
    # Processes the task forked after it was pinned: they inherited its CPUs,
    # and get the original of the process that forked them back on release.
    children: dict[int, ProcRecord] = field(default_factory=dict)


class StateStore:
    """The state file of one enforcer; holds the directory's lock while open."""

    def __init__(self, state_dir: str) -> None:
        self.dir = state_dir
        self.path = os.path.join(state_dir, STATE_FILE)
        try:
            os.makedirs(state_dir, mode=0o700, exist_ok=True)
            self._lock_fd = os.open(os.path.join(state_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as err:
            raise EnforceError(f"cannot use state directory {state_dir}: {err.strerror}") from err
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = os.pread(self._lock_fd, 32, 0).decode(errors="replace").strip()
            os.close(self._lock_fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise EnforceError(
                    f"state directory {state_dir} is in use by another COD RM (pid {holder or '?'})"
                ) from err
            raise EnforceError(f"cannot lock {state_dir}/{LOCK_FILE}: {err.strerror}") from err
        os.ftruncate(self._lock_fd, 0)
        os.pwrite(self._lock_fd, f"{os.getpid()}\n".encode(), 0)
        # What a previous owner left behind (empty after a clean exit).
        self.stale: dict[str, TaskRecord] = self._load()
        self.tasks: dict[str, TaskRecord] = {}

    def _load(self) -> dict[str, TaskRecord]:
        try:
            with open(self.path) as f:
                data = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            raise EnforceError(
                f"state file {self.path} is unreadable ({err}); inspect it, then delete it to start afresh"
            ) from err
        if data.get("version") != VERSION:
            raise EnforceError(
                f"state file {self.path} has version {data.get('version')!r}, this COD reads {VERSION}"
            )
        tasks: dict[str, TaskRecord] = {}
        for name, t in data.get("tasks", {}).items():
            tasks[name] = TaskRecord(
                cgroup=t.get("cgroup"),
                procs={int(p): ProcRecord.from_json(r) for p, r in t.get("procs", {}).items()},
                children={int(p): ProcRecord.from_json(r) for p, r in t.get("children", {}).items()},
            )
        return tasks

    def save(self) -> None:
        """Write stale (not yet cleaned) and current records; atomic by rename."""
        merged = dict(self.stale)
        merged.update(self.tasks)
        data = {
            "version": VERSION,
            "tasks": {
                name: {
                    "cgroup": t.cgroup,
                    "procs": {str(p): r.to_json() for p, r in t.procs.items()},
                    "children": {str(p): r.to_json() for p, r in t.children.items()},
                }
                for name, t in merged.items()
            },
        }
        tmp = self.path + ".tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
        except OSError as err:
            raise EnforceError(f"cannot write state file {self.path}: {err.strerror}") from err

    def close(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1

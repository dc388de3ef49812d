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

What the file may say is checked before anything is done with it (`cod.rm.enforce.statecheck`,
issue 47): recovery acts on it as root.  Only the daemon's uid may have written it: the
directory and the file must be its own and writable by nobody else, and the file a regular one
(not a symbolic link).  A file that fails either check is refused, whole, in one line naming it
and what is wrong, and kept as it is (docs/design-enforce.md, "The state file").
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
from dataclasses import dataclass, field
from typing import Any

from .errors import EnforceError
from .statecheck import VERSION, CgroupScope, StateFileInvalid, check_state

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
    """The state file of one enforcer; holds the directory's lock while open.

    ``scope`` says where the enforcer's cgroups are: a stale record naming any other cgroup is
    refused (`check_state`); None for an enforcer without a cpuset hierarchy."""

    def __init__(self, state_dir: str, scope: CgroupScope | None = None) -> None:
        self.dir = state_dir
        self.path = os.path.join(state_dir, STATE_FILE)
        self.scope = scope
        try:
            os.makedirs(state_dir, mode=0o700, exist_ok=True)
            found = os.stat(state_dir)
        except OSError as err:
            raise EnforceError(f"cannot use state directory {state_dir}: {err.strerror}") from err
        _check_owned(state_dir, found, "state directory", stat.S_ISDIR)
        try:
            self._lock_fd = os.open(os.path.join(state_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
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
        try:
            # What a previous owner left behind (empty after a clean exit); checked before the lock
            # file names this process, so that a refused start changes nothing.
            self.stale: dict[str, TaskRecord] = self._load()
            os.ftruncate(self._lock_fd, 0)
            os.pwrite(self._lock_fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            self.close()
            raise
        self.tasks: dict[str, TaskRecord] = {}

    def _read(self) -> Any:
        """The parsed file, None when there is none; opened without following a symbolic link
        and checked to be the daemon's own before it is read."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise EnforceError(f"state file {self.path} is a symbolic link; the daemon reads only a file of "
                                   "its own: remove the link") from err
            raise EnforceError(f"state file {self.path} is unreadable ({err.strerror})") from err
        with os.fdopen(fd, "rb") as f:
            _check_owned(self.path, os.fstat(f.fileno()), "state file", stat.S_ISREG)
            try:
                return json.loads(f.read())
            except (OSError, ValueError) as err:
                raise EnforceError(
                    f"state file {self.path} is unreadable ({err}); inspect it, then delete it to start afresh"
                ) from err

    def _load(self) -> dict[str, TaskRecord]:
        data = self._read()
        if data is None:
            return {}
        try:
            check_state(data, self.scope)
        except StateFileInvalid as err:
            raise StateFileInvalid(f"state file {self.path}: {err}; nothing was done: inspect the file, "
                                   "then delete it to start afresh") from None
        tasks: dict[str, TaskRecord] = {}
        for name, t in data["tasks"].items():
            tasks[name] = TaskRecord(
                cgroup=t["cgroup"],
                procs={int(p): ProcRecord.from_json(r) for p, r in t["procs"].items()},
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
            # Mode 0600 whatever the umask: the next start refuses a file others may write.
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "w") as f:
                os.fchmod(fd, 0o600)
                json.dump(data, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)
        except OSError as err:
            raise EnforceError(f"cannot write state file {self.path}: {err.strerror}") from err

    def close(self) -> None:
        if getattr(self, "_lock_fd", -1) >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1


def _check_owned(path: str, st: os.stat_result, what: str, is_kind: Any) -> None:
    """``path`` (``st``) is of the right kind, the daemon's uid's, and writable by no other uid:
    crash recovery, as root, does what the state file says."""
    kind = "directory" if what.endswith("directory") else "regular file"
    if not is_kind(st.st_mode):
        raise EnforceError(f"{what} {path} is not a {kind}")
    if st.st_uid != os.geteuid():
        raise EnforceError(f"{what} {path} belongs to uid {st.st_uid}, not to the daemon's uid {os.geteuid()}: "
                           "another uid could have written what crash recovery would do; use a directory of the "
                           "daemon's own (--state-dir)")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise EnforceError(f"{what} {path} is writable by other uids (mode {stat.S_IMODE(st.st_mode):04o}): "
                           f"another uid could have written what crash recovery would do; chmod go-w {path}")

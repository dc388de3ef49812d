"""What a state file may say before crash recovery acts on it (issue 47, item 7).  Pure.

Crash recovery does what the state file says: it removes the cgroups it names, moves the
processes it names into the cgroups it names and sets their affinity.  A file that says
something this daemon would never have written (a cgroup outside its parent, a ``..``, a pid
that is not a number, a truncated record) is refused, whole, before anything is done, with one
line saying where in the file and what is wrong: `check_state`.

* **Shape**: the format of `cod.rm.enforce.state` exactly; the keys a field may lack are those
  an older COD of the same version did not write (``children``, ``threads``, ``cpuset``).  No
  other key.  Numbers are JSON integers (not true/false, not 1.0), pids and tids decimal keys
  from 1 to `PID_MAX_LIMIT`, CPUs from 0 below `MAX_CPUS`.
* **A task's cgroup** is exactly the directory this daemon makes for that task name under its
  configured parent (``MOUNT/PARENT/<the task's directory name>``, `CgroupScope.task_dir`), or
  null.  Nothing else is compared, so a ``..``, a symbolic link or another hierarchy cannot pass.
* **A process's original cgroup** (where it goes back to) is a path in normal form inside the
  cpuset hierarchy's mount: absolute, no ``.``/``..``/empty component.  A cgroup file system
  has no symbolic links, and the mount point comes from the kernel, so such a path meets none.
* Without a cpuset hierarchy (no scope) a file that names any cgroup is refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cod.protocol.names import name_problem

from .errors import EnforceError

VERSION = 1
PID_MAX_LIMIT = 4 * 1024 * 1024  # include/linux/threads.h: no pid or tid is larger
MAX_CPUS = 8192  # the largest NR_CPUS Linux builds (x86-64 MAXSMP): no CPU number reaches it
PID_KEY = re.compile(r"[1-9][0-9]{0,6}")

TOP_KEYS = {"version", "tasks"}
TASK_KEYS, TASK_REQUIRED = {"cgroup", "procs", "children"}, {"cgroup", "procs"}
PROC_KEYS, PROC_REQUIRED = {"start", "affinity", "threads", "cpuset"}, {"start", "affinity"}


class StateFileInvalid(EnforceError):
    """The state file is not one this daemon wrote: where in it and what is wrong."""


@dataclass(frozen=True)
class CgroupScope:
    """Where this daemon's cgroups are: the cpuset hierarchy and the parent of its task cgroups."""

    version: int  # cgroup version of the hierarchy (1 or 2)
    mount: str  # its mount point
    parent: str  # MOUNT/PARENT
    task_dir: Callable[[str], str]  # a task name -> MOUNT/PARENT/<its directory name>

    def holds(self, path: str) -> bool:
        """``path`` is in normal form (absolute, no empty, ``.`` or ``..`` component; one trailing
        slash, as the daemon writes the mount's root ``MOUNT/``) and inside the mount, the mount
        itself included.  Pure."""
        if path.endswith("/") and len(path) > 1:
            path = path[:-1]
        if not path.startswith("/") or any(p in ("", ".", "..") for p in path[1:].split("/")):
            return False
        return path == self.mount or path.startswith(self.mount.rstrip("/") + "/")


def _fail(where: str, what: str) -> StateFileInvalid:
    return StateFileInvalid(f"{where}: {what}")


def _object(value: Any, where: str, keys: set[str], required: set[str]) -> Mapping[str, Any]:
    """``value`` as an object of these fields (``required`` among them)."""
    fields = _mapping(value, where)
    unknown = sorted(set(fields) - keys)
    if unknown:
        raise _fail(where, f"has no field {unknown[0]!r} (fields: {', '.join(sorted(keys))})")
    missing = sorted(required - set(fields))
    if missing:
        raise _fail(where, f"lacks the field {missing[0]!r}")
    return fields


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    """``value`` as an object of any keys (task names, pids)."""
    if not isinstance(value, dict):
        raise _fail(where, f"must be an object, not {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null",
            float: "a fraction"}.get(type(value), type(value).__name__)


def _integer(value: Any, where: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(where, f"must be a whole number, not {_kind(value)}")
    if value < low or (high is not None and value >= high):
        bound = f"from {low}" + (f" below {high}" if high is not None else "")
        raise _fail(where, f"must be a whole number {bound}, not {value}")
    return value


def _cpus(value: Any, where: str) -> None:
    if not isinstance(value, list):
        raise _fail(where, f"must be a list of CPU numbers, not {_kind(value)}")
    if not value:
        raise _fail(where, "must list at least one CPU")
    for i, cpu in enumerate(value):
        _integer(cpu, f"{where}[{i}]", 0, MAX_CPUS)


def _pid_key(key: str, where: str) -> None:
    if not PID_KEY.fullmatch(key) or int(key) > PID_MAX_LIMIT:
        raise _fail(where, f"{key!r} is not a process id (a decimal number from 1 to {PID_MAX_LIMIT})")


def _proc(value: Any, where: str, scope: CgroupScope | None) -> None:
    rec = _object(value, where, PROC_KEYS, PROC_REQUIRED)
    _integer(rec["start"], f"{where}.start", 0)
    _cpus(rec["affinity"], f"{where}.affinity")
    for tid, cpus in _mapping(rec.get("threads", {}), f"{where}.threads").items():
        _pid_key(tid, f"{where}.threads")
        _cpus(cpus, f"{where}.threads[{tid!r}]")
    home = rec.get("cpuset")
    if home is None:
        return
    if not isinstance(home, str):
        raise _fail(f"{where}.cpuset", f"must be a cgroup path or null, not {_kind(home)}")
    if scope is None:
        raise _fail(f"{where}.cpuset", f"names cgroup {home!r}, but this daemon has no cpuset hierarchy")
    if not scope.holds(home):
        raise _fail(f"{where}.cpuset", f"{home!r} is not a cgroup of {scope.mount} (an absolute path in "
                                       "normal form inside it)")


def _task(name: str, value: Any, scope: CgroupScope | None) -> None:
    where = f"tasks[{name!r}]"
    problem = name_problem(name)
    if problem is not None:
        raise _fail("tasks", f"task name {name!r} {problem}")
    task = _object(value, where, TASK_KEYS, TASK_REQUIRED)
    cgroup = task["cgroup"]
    if cgroup is not None:
        if not isinstance(cgroup, str):
            raise _fail(f"{where}.cgroup", f"must be a cgroup path or null, not {_kind(cgroup)}")
        if scope is None:
            raise _fail(f"{where}.cgroup", f"names cgroup {cgroup!r}, but this daemon has no cpuset hierarchy")
        if cgroup != scope.task_dir(name):
            raise _fail(f"{where}.cgroup", f"{cgroup!r} is not the task's cgroup under this daemon's parent "
                                           f"{scope.parent} (that is {scope.task_dir(name)!r})")
    for field in ("procs", "children"):
        for pid, rec in _mapping(task.get(field, {}), f"{where}.{field}").items():
            _pid_key(pid, f"{where}.{field}")
            _proc(rec, f"{where}.{field}[{pid!r}]", scope)


def check_state(data: Any, scope: CgroupScope | None) -> None:
    """Raise `StateFileInvalid` ("where: what") for the first thing in ``data`` (a parsed state
    file) that this daemon, with ``scope``, would not have written; None when all is well."""
    version = _mapping(data, "the file").get("version")
    if type(version) is not int or version != VERSION:
        raise StateFileInvalid(f"has version {version!r}, this COD reads {VERSION}")
    top = _object(data, "the file", TOP_KEYS, TOP_KEYS)
    for name, task in _mapping(top["tasks"], "tasks").items():
        _task(name, task, scope)

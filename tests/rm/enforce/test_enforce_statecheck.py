"""What a state file may say before crash recovery acts on it (rm/enforce/statecheck.py): a table.

Pure: no file, no cgroup.  tests/rm/enforce/test_enforce_state_startup.py runs the same checks through the
real daemon's start-up.
"""

from __future__ import annotations

import copy
import os

import pytest

from cod.rm.enforce.cpuset import cgroup_dir_name
from cod.rm.enforce.statecheck import MAX_CPUS, PID_MAX_LIMIT, CgroupScope, StateFileInvalid, check_state

MOUNT = "/sys/fs/cgroup/cpuset"
SCOPE = CgroupScope(1, MOUNT, f"{MOUNT}/cod", lambda task: os.path.join(MOUNT, "cod", cgroup_dir_name(task)))
PROC = {"start": 123, "affinity": [0, 1], "threads": {"43": [1]}, "cpuset": f"{MOUNT}/system.slice"}
GOOD = {"version": 1, "tasks": {
    "db": {"cgroup": f"{MOUNT}/cod/db", "procs": {"42": PROC}, "children": {"44": {**PROC, "threads": {}}}},
    "PostgreSQL 16": {"cgroup": f"{MOUNT}/cod/{cgroup_dir_name('PostgreSQL 16')}", "procs": {}, "children": {}},
    "affinity-only": {"cgroup": None, "procs": {"7": {**PROC, "cpuset": None}}, "children": {}},
    # written by an older COD of version 1: no children, no threads, no cpuset
    "old": {"cgroup": None, "procs": {"8": {"start": 1, "affinity": [0]}}},
    "root-home": {"cgroup": f"{MOUNT}/cod/root-home", "procs": {"9": {**PROC, "cpuset": f"{MOUNT}/"}}},
}}


def changed(path: tuple, value=None, delete: bool = False) -> dict:
    data = copy.deepcopy(GOOD)
    node = data
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data


def test_what_the_daemon_writes_passes():
    check_state(GOOD, SCOPE)
    check_state({"version": 1, "tasks": {}}, None)
    check_state({"version": 1, "tasks": {"a": {"cgroup": None, "procs": {"1": {"start": 0, "affinity": [0]}}}}}, None)


DB = ("tasks", "db")
P42 = (*DB, "procs", "42")
BAD = [
    # the file itself
    ([], "the file: must be an object, not a list"),
    ({"version": 2, "tasks": {}}, "has version 2, this COD reads 1"),
    ({"version": True, "tasks": {}}, "has version True"),
    ({"version": 1.0, "tasks": {}}, "has version 1.0"),
    ({"version": 1}, "the file: lacks the field 'tasks'"),
    ({"version": 1, "tasks": {}, "extra": 1}, "the file: has no field 'extra'"),
    ({"version": 1, "tasks": []}, "tasks: must be an object, not a list"),
    # a task
    (changed(DB, "x"), "tasks['db']: must be an object, not a string"),
    (changed((*DB, "cgroup"), delete=True), "tasks['db']: lacks the field 'cgroup'"),
    (changed((*DB, "procs"), delete=True), "tasks['db']: lacks the field 'procs'"),
    (changed((*DB, "pids"), {}), "tasks['db']: has no field 'pids'"),
    (changed(("tasks", "a\nb"), {"cgroup": None, "procs": {}}), "holds the control character U+000A"),
    (changed((*DB, "cgroup"), 5), "tasks['db'].cgroup: must be a cgroup path or null, not int"),
    (changed((*DB, "cgroup"), "/sys/fs/cgroup/cpuset/system.slice"), "is not the task's cgroup under this daemon"),
    (changed((*DB, "cgroup"), f"{MOUNT}/cod/../system.slice"), "is not the task's cgroup"),
    (changed((*DB, "cgroup"), f"{MOUNT}/cod/db/"), "is not the task's cgroup"),
    (changed((*DB, "cgroup"), f"{MOUNT}/cod/other"), "(that is '/sys/fs/cgroup/cpuset/cod/db')"),
    (changed((*DB, "cgroup"), "/tmp/link-to-a-cgroup"), "is not the task's cgroup"),
    (changed((*DB, "procs"), []), "tasks['db'].procs: must be an object, not a list"),
    (changed((*DB, "children"), None), "tasks['db'].children: must be an object, not null"),
    # a pid
    (changed((*DB, "procs", "abc"), PROC), "tasks['db'].procs: 'abc' is not a process id"),
    (changed((*DB, "procs", "0"), PROC), "'0' is not a process id"),
    (changed((*DB, "procs", "-5"), PROC), "'-5' is not a process id"),
    (changed((*DB, "procs", "007"), PROC), "'007' is not a process id"),
    (changed((*DB, "procs", " 7"), PROC), "' 7' is not a process id"),
    (changed((*DB, "procs", str(PID_MAX_LIMIT + 1)), PROC), f"from 1 to {PID_MAX_LIMIT}"),
    (changed((*DB, "children", "x1"), PROC), "tasks['db'].children: 'x1' is not a process id"),
    # a process record
    (changed(P42, 42), "tasks['db'].procs['42']: must be an object, not int"),
    (changed((*P42, "start"), delete=True), "tasks['db'].procs['42']: lacks the field 'start'"),
    (changed((*P42, "start"), "123"), "procs['42'].start: must be a whole number, not a string"),
    (changed((*P42, "start"), 1.5), "procs['42'].start: must be a whole number, not a fraction"),
    (changed((*P42, "start"), -1), "procs['42'].start: must be a whole number from 0, not -1"),
    (changed((*P42, "uid"), 0), "procs['42']: has no field 'uid'"),
    (changed((*P42, "affinity"), []), "procs['42'].affinity: must list at least one CPU"),
    (changed((*P42, "affinity"), "0-3"), "procs['42'].affinity: must be a list of CPU numbers, not a string"),
    (changed((*P42, "affinity"), [0, True]), "procs['42'].affinity[1]: must be a whole number, not true/false"),
    (changed((*P42, "affinity"), [MAX_CPUS]), f"affinity[0]: must be a whole number from 0 below {MAX_CPUS}"),
    (changed((*P42, "threads"), [1]), "procs['42'].threads: must be an object, not a list"),
    (changed((*P42, "threads", "t"), [0]), "procs['42'].threads: 't' is not a process id"),
    (changed((*P42, "threads", "43"), [-1]), "procs['42'].threads['43'][0]: must be a whole number from 0"),
    # where a process goes back to
    (changed((*P42, "cpuset"), 3), "procs['42'].cpuset: must be a cgroup path or null, not int"),
    (changed((*P42, "cpuset"), "/tmp/cgroup-link"), "'/tmp/cgroup-link' is not a cgroup of /sys/fs/cgroup/cpuset"),
    (changed((*P42, "cpuset"), f"{MOUNT}/../memory/x"), "is not a cgroup of"),
    (changed((*P42, "cpuset"), f"{MOUNT}/a/./b"), "is not a cgroup of"),
    (changed((*P42, "cpuset"), f"{MOUNT}//a"), "is not a cgroup of"),
    (changed((*P42, "cpuset"), f"{MOUNT}x/a"), "is not a cgroup of"),
    (changed((*P42, "cpuset"), "system.slice"), "is not a cgroup of"),
]


@pytest.mark.parametrize("data, needle", BAD, ids=[b[1][:50] for b in BAD])
def test_what_the_daemon_would_not_write_is_refused_saying_where(data, needle):
    with pytest.raises(StateFileInvalid) as err:
        check_state(data, SCOPE)
    assert needle in str(err.value), str(err.value)
    assert "\n" not in str(err.value).replace("\\n", "")  # one line (a name's newline is shown escaped)


def test_without_a_cpuset_hierarchy_no_cgroup_is_accepted():
    with pytest.raises(StateFileInvalid, match=r"tasks\['db'\].cgroup: names cgroup .* no cpuset hierarchy"):
        check_state(GOOD, None)
    only_home = {"version": 1, "tasks": {"a": {"cgroup": None, "procs": {"1": PROC}}}}
    with pytest.raises(StateFileInvalid, match=r"procs\['1'\].cpuset: names cgroup .* no cpuset hierarchy"):
        check_state(only_home, None)

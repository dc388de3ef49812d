"""Crash recovery does not trust its state file (issue 47, item 7), at the real `cod rm` start-up.

The finding: a crafted ``enforce-state.json`` made the daemon, as root, remove a cgroup outside
its parent (after moving its processes out) and move a root process into a cgroup of the file's
choosing.  A wrong shape gave a traceback.  Now the daemon checks the file before it acts on it
(rm/enforce/statecheck.py): a file it would not have written is refused in one line naming the
file and what is wrong, and nothing is done (the cgroups, the processes and the file are as
they were); a process is given back only if it is still where the daemon put it.

Every cgroup here is one the test makes (under the cpuset hierarchy, which the daemon's cgroups
are in), every process one it starts; the daemon runs with a cgroup parent of the test's own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from cod.facts import procfs
from cod.rm.enforce.cgroupfs import find_cpuset_mount, process_cgroup
from helpers.cgroups import enter, remove_tree
from helpers.procs import allowed_list
from helpers.waiting import load_scaled
from helpers.rm_support import COD, NOBODY, start_daemon

MOUNT = find_cpuset_mount()
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or MOUNT is None,
                                reason="needs root and a cpuset hierarchy (the daemon's cgroups are there)")
PARENT = f"cod-test-state-{os.getpid()}"
CPU0 = min(os.sched_getaffinity(0))


def daemon_args(tmp: Path, log_level: str = "warning") -> list[str]:
    return ["--enforce", "affinity", "--no-busy-detect", "--state-dir", str(tmp / "state"),
            "--cgroup-parent", PARENT, "--log-level", log_level]


def write_state(tmp: Path, text: str) -> Path:
    state = tmp / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    path = state / "enforce-state.json"
    path.write_text(text)
    return path


def refused(tmp: Path) -> str:
    """`cod rm`'s one line (it must not start)."""
    d = subprocess.Popen([*COD, "rm", "--socket", str(tmp / "rm.sock"), *daemon_args(tmp)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, err = d.communicate(timeout=load_scaled(20))
    except subprocess.TimeoutExpired:  # it started: stopped cleanly (its engine with it), and failed
        d.send_signal(signal.SIGTERM)
        _, err = d.communicate(timeout=30)
        raise AssertionError(f"the daemon started: {err}") from None
    assert d.returncode != 0 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert not (tmp / "rm.sock").exists()
    return lines[0]


def make_cgroup(path: str) -> str:
    """A cpuset cgroup that can hold processes (v1 starts with no CPUs and no nodes)."""
    os.mkdir(path)
    if MOUNT.version == 1:
        parent = os.path.dirname(path)
        for name in ("cpuset.cpus", "cpuset.mems"):
            with open(os.path.join(parent, name)) as f:
                value = f.read().strip()
            with open(os.path.join(path, name), "w") as f:
                f.write(value)
    return path


def cgroup_of(pid: int) -> str:
    rel = process_cgroup(pid, MOUNT.version)
    assert rel is not None
    return os.path.join(MOUNT.path, rel.lstrip("/")).rstrip("/")


@pytest.fixture
def victim():
    """A cgroup of the test's own, two levels deep in the cpuset hierarchy, with a process in it;
    (its path, the process, the CPUs the process may use)."""
    top = make_cgroup(os.path.join(MOUNT.path, f"cod-test-victim-{os.getpid()}"))
    inner = make_cgroup(os.path.join(top, "inner"))
    proc = subprocess.Popen(["sleep", "300"])
    try:
        enter_cgroup(inner, proc.pid)
        yield inner, proc, allowed_list(proc.pid)
    finally:
        proc.kill()
        proc.wait()
        remove_tree(top)
        remove_tree(os.path.join(MOUNT.path, PARENT))


def enter_cgroup(path: str, pid: int) -> None:
    if MOUNT.version == 1:
        with open(os.path.join(path, "tasks"), "w") as f:
            f.write(str(pid))
    else:
        enter(path, pid)


def record(pid: int, cpuset: str | None) -> dict:
    return {"start": procfs.start_time(pid), "affinity": [CPU0], "threads": {}, "cpuset": cpuset}


def state_text(tasks: dict) -> str:
    return json.dumps({"version": 1, "tasks": tasks})


def task_dir(task: str) -> str:
    return os.path.join(MOUNT.path, PARENT, task)


def unchanged(path: Path, text: str, inner: str, proc: subprocess.Popen, mask: str) -> None:
    assert path.read_text() == text, "the refused file is kept as it was"
    assert os.path.isdir(inner), "the cgroup the file named is still there"
    assert cgroup_of(proc.pid) == inner and allowed_list(proc.pid) == mask, "its process is where it was"


@pytest.mark.parametrize("how", ["outside the parent", "'..' out of the parent"])
def test_a_cgroup_outside_the_parent_is_refused_and_not_removed(tmp_path, victim, how):
    inner, proc, mask = victim
    if how == "outside the parent":
        cgroup = inner
    else:  # through the parent, which exists
        make_cgroup(os.path.join(MOUNT.path, PARENT))
        cgroup = os.path.join(MOUNT.path, PARENT, "..", os.path.relpath(inner, MOUNT.path))
    path = write_state(tmp_path, text := state_text({"db": {"cgroup": cgroup, "procs": {}, "children": {}}}))
    line = refused(tmp_path)
    assert f"state file {path}: tasks['db'].cgroup: '{cgroup}' is not the task's cgroup" in line, line
    assert f"that is '{task_dir('db')}'" in line and "nothing was done" in line, line
    unchanged(path, text, inner, proc, mask)


def test_a_symbolic_link_to_a_cgroup_is_refused_and_no_process_moves(tmp_path, victim):
    """A root process's record whose original cgroup is a link to another cgroup."""
    inner, proc, mask = victim
    root_proc = subprocess.Popen(["sleep", "300"])
    try:
        home, root_mask = cgroup_of(root_proc.pid), allowed_list(root_proc.pid)
        link = tmp_path / "cgroup-link"
        link.symlink_to(inner)
        path = write_state(tmp_path, text := state_text(
            {"db": {"cgroup": None, "procs": {str(root_proc.pid): record(root_proc.pid, str(link))}}}))
        line = refused(tmp_path)
        assert f"tasks['db'].procs['{root_proc.pid}'].cpuset: '{link}' is not a cgroup of {MOUNT.path}" in line, line
        unchanged(path, text, inner, proc, mask)
        assert cgroup_of(root_proc.pid) == home and allowed_list(root_proc.pid) == root_mask
    finally:
        root_proc.kill()
        root_proc.wait()


def test_a_root_process_the_daemon_never_moved_is_left_alone(tmp_path, victim):
    """A well-formed file: the task's cgroup is the daemon's own path, and it names a root process
    (its real pid and start time) with the victim as its "original" cgroup.  The process is not in
    the task's cgroup, so the daemon never moved it: it starts, and leaves the process as it is."""
    inner, proc, mask = victim
    root_proc = subprocess.Popen(["sleep", "300"])
    try:
        home, root_mask = cgroup_of(root_proc.pid), allowed_list(root_proc.pid)
        write_state(tmp_path, state_text({"db": {"cgroup": task_dir("db"),
                                                 "procs": {str(root_proc.pid): record(root_proc.pid, inner)}}}))
        d = start_daemon(tmp_path, *daemon_args(tmp_path, "info"))
        try:
            assert cgroup_of(root_proc.pid) == home and allowed_list(root_proc.pid) == root_mask
            assert f"pid {root_proc.pid} of task db is not in the task's cgroup" in d.log_text()
        finally:
            d.stop()
        assert cgroup_of(root_proc.pid) == home and allowed_list(root_proc.pid) == root_mask
        assert cgroup_of(proc.pid) == inner and allowed_list(proc.pid) == mask
    finally:
        root_proc.kill()
        root_proc.wait()


WRONG = [
    ('{"version": 1, "tasks": [], ', "is unreadable (Expecting"),  # truncated JSON
    ('{"version": 1, "tasks": []}', "tasks: must be an object, not a list"),
    ('[1]', "the file: must be an object, not a list"),
    ('{"version": 1}', "the file: lacks the field 'tasks'"),
    ('{"version": "1", "tasks": {}}', "has version '1', this COD reads 1"),
    ('{"version": 1, "tasks": {"db": {"cgroup": null, "procs": {"abc": {"start": 1, "affinity": [0]}}}}}',
     "tasks['db'].procs: 'abc' is not a process id"),
    ('{"version": 1, "tasks": {"db": {"cgroup": null, "procs": {"-1": {"start": 1, "affinity": [0]}}}}}',
     "tasks['db'].procs: '-1' is not a process id"),
    ('{"version": 1, "tasks": {"db": {"cgroup": null, "procs": {"12": {"start": "x", "affinity": [0]}}}}}',
     "tasks['db'].procs['12'].start: must be a whole number, not a string"),
    ('{"version": 1, "tasks": {"db": {"cgroup": null, "procs": {"12": {"start": 5, "affinity": [true]}}}}}',
     "tasks['db'].procs['12'].affinity[0]: must be a whole number, not true/false"),
    ('{"version": 1, "tasks": {"db": {"cgroup": null, "procs": {"12": {"start": 5, "affinity": 3}}}}}',
     "tasks['db'].procs['12'].affinity: must be a list of CPU numbers, not int"),
    ('{"version": 1, "tasks": {"db": {"cgroup": 7, "procs": {}}}}', "tasks['db'].cgroup: must be a cgroup path or null"),
    ('{"version": 1, "tasks": {"db": {"procs": {}}}}', "tasks['db']: lacks the field 'cgroup'"),
    ('{"version": 1, "tasks": {"db": {"cgroup": null, "procs": {}, "run": "rm -rf /"}}}',
     "tasks['db']: has no field 'run'"),
    ('{"version": 1, "tasks": {"": {"cgroup": null, "procs": {}}}}', "tasks: task name '' must not be empty"),
]


@pytest.mark.parametrize("text, needle", WRONG, ids=[w[1][:40] for w in WRONG])
def test_a_wrong_shape_is_one_line_naming_the_file(tmp_path, text, needle):
    path = write_state(tmp_path, text)
    line = refused(tmp_path)
    assert f"state file {path}" in line and needle in line, line
    assert path.read_text() == text


def test_a_state_file_another_uid_could_write_is_refused(tmp_path, victim):
    """Layer one: the file and its directory are the daemon's own and nobody else's to write; a
    well-formed file another uid wrote would otherwise be obeyed."""
    inner, proc, mask = victim
    text = state_text({"db": {"cgroup": None, "procs": {str(proc.pid): record(proc.pid, None)}}})
    path = write_state(tmp_path, text)
    os.chown(path, NOBODY, -1)
    line = refused(tmp_path)
    assert f"state file {path} belongs to uid {NOBODY}, not to the daemon's uid 0" in line, line
    os.chown(path, 0, -1)
    os.chmod(path.parent, 0o777)
    line = refused(tmp_path)
    assert f"state directory {path.parent} is writable by other uids (mode 0777)" in line, line
    os.chmod(path.parent, 0o700)
    link = path.parent / "elsewhere.json"
    path.rename(link)
    path.symlink_to(link)
    line = refused(tmp_path)
    assert f"state file {path} is a symbolic link" in line, line
    assert allowed_list(proc.pid) == mask, "nothing was restored"

"""Enforcement backends against the real kernel: real processes, real pinning, real cgroups."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from cod.facts.cpulist import parse_cpulist as parse_cpu_list
from cod.rm.enforce import AffinityEnforcer, CpusetV1Enforcer, EnforceError, NullEnforcer, detect
from cod.rm.enforce.pinning import own_placement, set_thread_affinity
from cod.rm.enforce.cgroupfs import exiting, find_cpuset_mount, process_cgroup
from cod.rm.enforce.leftovers import Leftovers
from cod.facts.procfs import cpus_allowed, pids, read_stat, thread_ids
from helpers.cgroups import remove_tree
from helpers.procs import allowed_list, needs_root, spawn, spinner_cmd  # noqa: F401 (fixtures)

CPUS = sorted(os.sched_getaffinity(0))
two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to move a task between")
MOUNT = find_cpuset_mount()
v1_only = pytest.mark.skipif(MOUNT is None or MOUNT.version != 1, reason="no cgroup v1 cpuset hierarchy here")
v2_only = pytest.mark.skipif(MOUNT is None or MOUNT.version != 2, reason="no cgroup v2 cpuset controller here")
PARENT = f"cod-test-{os.getpid()}"


def make(kind: str, state_dir: str):
    if kind == "affinity":
        return AffinityEnforcer(state_dir)
    if kind == "cpuset":
        if os.geteuid() != 0:
            pytest.skip("needs root to write cgroups")
        if MOUNT is None:
            pytest.skip("no cpuset controller mounted")
        return detect("cpuset", state_dir, cgroup_parent=PARENT)
    raise AssertionError(kind)


BACKENDS = ["affinity", "cpuset"]


@pytest.fixture
def state_dir(tmp_path):
    return str(tmp_path / "state")


@pytest.fixture(autouse=True)
def no_cgroup_left_behind():
    """Whatever a test's own assertions found, the cgroups it made go with it: a leftover top-level
    cpuset on these CPUs makes the kernel refuse an exclusive one to every later run."""
    yield
    if MOUNT is not None and os.geteuid() == 0:
        remove_tree(os.path.join(MOUNT.path, PARENT))


def thread_masks(pid: int) -> dict[int, str]:
    return {tid: allowed_list(pid, tid) for tid in thread_ids(pid)}


@two_cpus
@pytest.mark.parametrize("kind", BACKENDS)
def test_four_thread_task_moves_from_cpu0_to_cpu1_with_every_thread(kind, state_dir, spawn):
    task = spawn(4, "spin")
    enf = make(kind, state_dir)
    try:
        first, second = CPUS[0], CPUS[1]
        assert enf.apply("db", [task.pid], [first], [0]) == [task.pid]
        masks = thread_masks(task.pid)
        assert len(masks) == 4 and set(masks) == set(task.tids)
        assert set(masks.values()) == {str(first)}
        enf.apply("db", [task.pid], [second], [0])
        assert set(thread_masks(task.pid).values()) == {str(second)}
        for tid in task.tids:
            assert os.sched_getaffinity(tid) == {second}
    finally:
        enf.close()
    # A clean close gives every thread its original mask back.
    assert set(thread_masks(task.pid).values()) == {allowed_list(os.getpid())}


@two_cpus
@pytest.mark.parametrize("kind", BACKENDS)
def test_thread_created_after_pinning_is_pinned(kind, state_dir, spawn):
    task = spawn(2, "sleep")
    enf = make(kind, state_dir)
    try:
        enf.apply("db", [task.pid], [CPUS[1]], [0])
        tid = task.spawn_thread()  # inherits the mask (affinity) or the cgroup (cpuset)
        assert cpus_allowed(task.pid, tid) == (CPUS[1],)
        # A thread that escaped (here: re-pinned by someone else) is caught by add_thread.
        os.sched_setaffinity(tid, CPUS)
        assert enf.add_thread("db", tid) is True
        assert cpus_allowed(task.pid, tid) == (CPUS[1],)
    finally:
        enf.close()


# ---- decision 14: a thread's own placement survives a re-pin of its task --------------------------
@pytest.mark.parametrize("mask, given, cpus, kept", [
    ((1,), (0, 1), (0, 1), (1,)),        # pinned itself inside: kept
    ((1,), (0, 1), (1, 2), (1,)),        # still inside the new CPUs: kept
    ((0,), (0, 1), (1, 2), None),        # outside the new CPUs: the task's CPUs
    ((1,), (1,), (0, 1), None),          # the RM's own former mask: follows the task
    ((0, 1), (0, 1), (0, 1, 2), None),   # the whole former mask: follows the task
    ((2, 0), (0, 1, 2, 3), (0, 2), (0, 2)),
    ((1,), None, (0, 1), None),          # the first pin keeps nothing
    ((), (0, 1), (0, 1), None),
])
def test_own_placement_rule(mask, given, cpus, kept):
    assert own_placement(mask, given, cpus) == kept


@pytest.mark.parametrize("mask, given, cpus, former, kept", [
    ((0,), (0, 1), (0, 1), [(0,)], None),            # the task's mask before a grow: follows (decision 18)
    ((0,), (0, 1), (0, 1), [(2,), (0,)], None),      # any of its former masks
    ((1,), (0, 1), (0, 1), [(0,)], (1,)),            # a mask it never had: its own, kept
    ((0, 1), (0, 1, 2), (0, 1, 2, 3), [(0, 1)], None),
])
def test_own_placement_rule_with_former_masks(mask, given, cpus, former, kept):
    assert own_placement(mask, given, cpus, former) == kept


@two_cpus
@pytest.mark.parametrize("kind", BACKENDS)
def test_a_process_forked_before_its_task_grew_gets_the_new_cpus(kind, state_dir, spawn):
    """Decision 18: PostgreSQL's backends, forked while the elastic group held one CPU and joined
    after it grew to two, inherited the old mask; taken for their own placement, they stayed on
    one CPU (pgbench select-only at 0.47 of the all-CPU throughput).  A mask the RM gave the task
    before follows the task, for a process joining it and for a thread the fork events show."""
    a, b = CPUS[0], CPUS[1]
    task, backend = spawn(1, "sleep"), spawn(2, "sleep")
    enf = make(kind, state_dir)
    try:
        enf.apply("db", [task.pid], [a], [0])
        for tid in backend.tids:  # forked while the task held a: the mask it inherits
            os.sched_setaffinity(tid, [a])
        enf.apply("db", [task.pid], [a, b], [0])  # the group grows
        enf.apply("db", [task.pid, backend.pid], [a, b], [0])  # the backend joins
        assert {cpus_allowed(backend.pid, tid) for tid in backend.tids} == {(a, b)}
        late = task.spawn_thread()
        os.sched_setaffinity(late, [a])  # a thread born with the old mask, seen by a fork event
        assert enf.add_thread("db", late) is True
        assert cpus_allowed(task.pid, late) == (a, b)
    finally:
        enf.close()


@two_cpus
@pytest.mark.parametrize("kind", BACKENDS)
def test_a_threads_own_placement_is_kept_when_its_task_is_pinned_again(kind, state_dir, spawn):
    """A storage engine pins each scan thread to one core; the RM re-pinning the task (same or
    other CPUs) leaves that placement alone while it lies inside the task's CPUs."""
    a, b = CPUS[0], CPUS[1]
    task = spawn(3, "sleep")
    scan, other = task.tids[1], task.tids[2]
    enf = make(kind, state_dir)
    try:
        enf.apply("db", [task.pid], [a, b], [0])
        os.sched_setaffinity(scan, [b])  # the engine pins its scan thread
        enf.apply("db", [task.pid], [a, b], [0])  # re-pinned, same CPUs
        assert cpus_allowed(task.pid, scan) == (b,)
        assert cpus_allowed(task.pid, other) == (a, b)
        enf.apply("db", [task.pid], [b], [0])  # shrunk around it
        assert cpus_allowed(task.pid, scan) == (b,) and cpus_allowed(task.pid, other) == (b,)
        # Grown again: the scan thread's mask is now the RM's former mask for the whole task,
        # which cannot be told from the RM's pinning, so it follows the task (the engine re-pins).
        enf.apply("db", [task.pid], [a, b], [0])
        assert cpus_allowed(task.pid, scan) == (a, b) and cpus_allowed(task.pid, other) == (a, b)
        os.sched_setaffinity(scan, [a])
        enf.apply("db", [task.pid], [b], [0])  # its core is taken: it goes where the task goes
        assert cpus_allowed(task.pid, scan) == (b,)
    finally:
        enf.close()
    assert set(thread_masks(task.pid).values()) == {allowed_list(os.getpid())}


@two_cpus
@pytest.mark.parametrize("kind", BACKENDS)
def test_a_new_thread_that_pinned_itself_keeps_its_core(kind, state_dir, spawn):
    """The fork event reaches the RM after the new thread pinned itself (a scan thread's first
    act): add_thread keeps that core instead of widening the thread to the task's CPUs."""
    a, b = CPUS[0], CPUS[1]
    task = spawn(1, "sleep")
    enf = make(kind, state_dir)
    try:
        enf.apply("db", [task.pid], [a, b], [0])
        tid = task.spawn_thread()
        os.sched_setaffinity(tid, [b])
        assert enf.add_thread("db", tid) is True
        assert cpus_allowed(task.pid, tid) == (b,)
        unpinned = task.spawn_thread()
        assert enf.add_thread("db", unpinned) is True
        assert cpus_allowed(task.pid, unpinned) == (a, b)
    finally:
        enf.close()


@two_cpus
@pytest.mark.parametrize("kind", BACKENDS)
def test_a_new_thread_inside_the_tasks_cpus_gets_no_write_at_all(kind, state_dir, spawn, monkeypatch):
    """Reading a new thread's inherited mask and then writing the task's mask raced with the
    program pinning the thread in between (a scan thread's first act), undoing its pin: a thread
    already inside the task's CPUs must get no sched_setaffinity at all."""
    a, b = CPUS[0], CPUS[1]
    task = spawn(1, "sleep")
    enf = make(kind, state_dir)
    try:
        enf.apply("db", [task.pid], [a, b], [0])
        tid = task.spawn_thread()  # inherits the task's CPUs
        writes: list[int] = []
        real = os.sched_setaffinity
        monkeypatch.setattr(os, "sched_setaffinity", lambda t, cpus: (writes.append(t), real(t, cpus))[1])
        assert enf.add_thread("db", tid) is True
        assert tid not in writes and cpus_allowed(task.pid, tid) == (a, b)
    finally:
        monkeypatch.undo()
        enf.close()


@two_cpus
@pytest.mark.parametrize("kind", BACKENDS)
def test_release_restores_each_threads_original_mask(kind, state_dir, spawn):
    task = spawn(3, "sleep")
    special = task.tids[1]
    os.sched_setaffinity(task.pid, [CPUS[1]])  # the process's own mask
    os.sched_setaffinity(special, [CPUS[0]])  # one thread differs
    before = thread_masks(task.pid)
    enf = make(kind, state_dir)
    try:
        enf.apply("db", [task.pid], CPUS, [0])
        assert set(thread_masks(task.pid).values()) == {allowed_list(os.getpid())}
        enf.release("db")
        assert thread_masks(task.pid) == before
        enf.release("db")  # idempotent
    finally:
        enf.close()


@two_cpus
@pytest.mark.parametrize("kind", BACKENDS)
def test_a_pid_applied_under_a_second_task_keeps_one_original(kind, state_dir, spawn):
    """A busy process confined as other.PID that joins an elastic group (issue 30): the second task
    takes the first one's record over, so releasing the first touches nothing, and releasing the
    second gives back the mask from before either."""
    task = spawn(3, "sleep")
    os.sched_setaffinity(task.tids[1], [CPUS[0]])  # one thread's own mask
    before = thread_masks(task.pid)
    enf = make(kind, state_dir)
    try:
        enf.apply(f"other.{task.pid}", [task.pid], [CPUS[1]], [0])
        enf.apply("group", [task.pid], [CPUS[0]], [0])
        assert set(thread_masks(task.pid).values()) == {str(CPUS[0])}
        assert enf.tasks()[f"other.{task.pid}"] == [] and enf.tasks()["group"] == [task.pid]
        enf.release(f"other.{task.pid}")
        assert set(thread_masks(task.pid).values()) == {str(CPUS[0])}, "the first task's release touched it"
        enf.release("group")
        assert thread_masks(task.pid) == before
    finally:
        enf.close()


@two_cpus
@pytest.mark.parametrize("kind", BACKENDS)
def test_pid_dropped_from_a_task_gets_its_own_mask_back(kind, state_dir, spawn):
    a, b = spawn(2, "sleep"), spawn(2, "sleep")
    before_a = thread_masks(a.pid)
    enf = make(kind, state_dir)
    try:
        enf.apply("db", [a.pid, b.pid], [CPUS[1]], [0])
        assert enf.apply("db", [b.pid], [CPUS[1]], [0]) == [b.pid]
        assert thread_masks(a.pid) == before_a
        assert set(thread_masks(b.pid).values()) == {str(CPUS[1])}
    finally:
        enf.close()


@pytest.mark.parametrize("kind", BACKENDS)
def test_exited_and_zombie_pids_are_skipped(kind, state_dir, spawn):
    live = spawn(1, "sleep")
    dead = spawn(1, "sleep")
    dead.proc.kill()
    dead.proc.wait()
    zombie = subprocess.Popen(["true"])
    while open(f"/proc/{zombie.pid}/stat").read().split(") ")[1][0] != "Z":
        pass
    enf = make(kind, state_dir)
    try:
        applied = enf.apply("db", [live.pid, dead.pid, zombie.pid], [CPUS[0]], [0])
        assert live.pid in applied and dead.pid not in applied
        enf.release("db")
    finally:
        enf.close()
        zombie.wait()


def test_kernel_thread_with_fixed_mask_is_tolerated():
    kthreads = []
    for pid in pids():
        try:
            st = read_stat(pid)
        except FileNotFoundError:
            continue
        if st.is_kernel_thread and st.comm == "ksoftirqd/0":
            kthreads.append(pid)
    if not kthreads:
        pytest.skip("no ksoftirqd/0 thread visible")
    before = os.sched_getaffinity(kthreads[0])
    assert set_thread_affinity(kthreads[0], CPUS) is (before == set(CPUS))
    assert os.sched_getaffinity(kthreads[0]) == before


@pytest.mark.parametrize("task,cpus,mems,needle", [
    ("", [0], [0], "must not be empty"),
    ("a\x00b", [0], [0], "control character"),
    ("x" * 129, [0], [0], "bytes long"),
    ("db", [], [0], "cpus is empty"),
    ("db", [0], [], "mems is empty"),
    ("db", [-1], [0], "-1"),
    ("db", ["0"], [0], "'0'"),
])
def test_bad_input_is_named(state_dir, task, cpus, mems, needle):
    with AffinityEnforcer(state_dir) as enf:
        with pytest.raises(EnforceError, match=needle.replace(".", r"\.")):
            enf.apply(task, [os.getpid()], cpus, mems)


def test_cpus_outside_the_allowed_set_are_an_error(state_dir, spawn):
    task = spawn(1, "sleep")
    with AffinityEnforcer(state_dir) as enf:
        with pytest.raises(EnforceError, match="none of them is allowed"):
            enf.apply("db", [task.pid], [max(CPUS) + 64], [0])


def test_unknown_mode_is_refused(state_dir):
    with pytest.raises(EnforceError, match="unknown enforcement mode 'fast'"):
        detect("fast", state_dir)


def test_second_enforcer_on_the_same_state_dir_is_refused(state_dir):
    with AffinityEnforcer(state_dir):
        with pytest.raises(EnforceError, match=f"in use by another COD RM \\(pid {os.getpid()}\\)"):
            AffinityEnforcer(state_dir)


def test_none_mode_changes_nothing(state_dir, spawn):
    task = spawn(2, "sleep")
    before = thread_masks(task.pid)
    enf = detect("none", state_dir)
    assert isinstance(enf, NullEnforcer)
    assert enf.apply("db", [task.pid], [CPUS[0]], [0]) == [task.pid]
    assert thread_masks(task.pid) == before
    enf.close()


def test_detect_without_root_falls_back_to_affinity(state_dir, caplog):
    with caplog.at_level("INFO", logger="cod.rm.enforce"):
        enf = detect("cpuset", state_dir, root=False)
    try:
        assert enf.name == "affinity"
        assert "needs root" in caplog.text and "falling back to affinity" in caplog.text
    finally:
        enf.close()


def test_reused_pid_is_not_touched_by_stale_cleanup(state_dir, spawn):
    task = spawn(1, "sleep")
    before = allowed_list(task.pid)
    os.makedirs(state_dir)
    start = int(open(f"/proc/{task.pid}/stat").read().rsplit(") ", 1)[1].split()[19])
    stale = {"version": 1, "tasks": {"db": {"cgroup": None, "procs": {
        str(task.pid): {"start": start - 1, "affinity": [CPUS[0]], "threads": {}, "cpuset": None}}}}}
    with open(os.path.join(state_dir, "enforce-state.json"), "w") as f:
        json.dump(stale, f)
    with AffinityEnforcer(state_dir) as enf:
        assert enf.cleanup_stale() == []
    assert allowed_list(task.pid) == before


def test_unknown_state_version_is_refused(state_dir):
    os.makedirs(state_dir)
    with open(os.path.join(state_dir, "enforce-state.json"), "w") as f:
        json.dump({"version": 99, "tasks": {}}, f)
    with pytest.raises(EnforceError, match="version 99"):
        AffinityEnforcer(state_dir)


# ---- cgroups ---------------------------------------------------------------

@needs_root()
@v1_only
def test_v1_cgroup_created_filled_and_removed(state_dir, spawn):
    task = spawn(4, "sleep")
    home = process_cgroup(task.pid, 1)
    enf = CpusetV1Enforcer(MOUNT, state_dir, parent=PARENT, memory_migrate=True)
    cg = os.path.join(MOUNT.path, PARENT, "db")
    try:
        enf.apply("db", [task.pid], [CPUS[-1]], [0])
        assert os.path.isdir(cg)
        assert open(f"{cg}/cpuset.cpus").read().strip() == str(CPUS[-1])
        assert open(f"{cg}/cpuset.mems").read().strip() == "0"
        assert open(f"{cg}/cpuset.memory_migrate").read().strip() == "1"
        assert sorted(int(t) for t in open(f"{cg}/tasks").read().split()) == sorted(task.tids)
        assert process_cgroup(task.pid, 1) == f"/{PARENT}/db"
        enf.release("db")
        assert not os.path.exists(cg)
        assert process_cgroup(task.pid, 1) == home
    finally:
        enf.close()
    assert not os.path.exists(os.path.join(MOUNT.path, PARENT))



@needs_root()
@pytest.mark.skipif(MOUNT is None, reason="no cpuset controller mounted")
def test_a_cgroup_still_busy_at_release_is_removed_later_not_forgotten(state_dir, spawn):
    """A task killed just before its release is still exiting, and its cgroup answers EBUSY until
    the exit is done (rm/enforce/leftovers.py has the figures). Here a child cgroup keeps it busy,
    for as long as the test wants: the release gives the process its cgroup back and keeps the
    busy one to remove later; the same task applied again takes it back; the next release removes
    it. Before, release raised and forgot the cgroup, and close left it behind for good."""
    task = spawn(1, "sleep")
    home = process_cgroup(task.pid, MOUNT.version)
    enf = make("cpuset", state_dir)
    cg = os.path.join(MOUNT.path, PARENT, "db")
    blocker = os.path.join(cg, "busy")
    try:
        enf.apply("db", [task.pid], [CPUS[-1]], [0])
        os.mkdir(blocker)
        enf.release("db")
        assert os.path.isdir(cg) and process_cgroup(task.pid, MOUNT.version) == home
        enf.apply("db", [task.pid], [CPUS[0]], [0])  # the busy cgroup holds the task again
        os.rmdir(blocker)
        enf.apply("other", [task.pid], [CPUS[0]], [0])  # a retry here must not take db's cgroup away
        assert os.path.isdir(cg)
        enf.release("other")
        enf.release("db")
        assert not os.path.exists(cg) and process_cgroup(task.pid, MOUNT.version) == home
        enf.apply("db", [task.pid], [CPUS[-1]], [0])
        os.mkdir(blocker)
        enf.release("db")
        assert os.path.isdir(cg)
        os.rmdir(blocker)
        enf.apply("other", [task.pid], [CPUS[0]], [0])  # the next call removes it
        assert not os.path.exists(cg)
        enf.apply("db", [task.pid], [CPUS[-1]], [0])
        os.mkdir(blocker)
        enf.release("db")
    finally:
        if os.path.isdir(blocker):
            os.rmdir(blocker)  # so that close can remove the last one
        enf.close()
    assert not os.path.exists(os.path.join(MOUNT.path, PARENT))




@needs_root()
@pytest.mark.skipif(MOUNT is None, reason="no cpuset controller mounted")
def test_a_leftover_still_busy_at_the_end_of_the_wait_is_named_and_left(caplog, monkeypatch):
    """Also: a cgroup that no task keeps busy (a child cgroup does) is kept at the first refusal;
    the 50 tries 2 ms apart that a race with a new thread needs held the event loop ~100 ms."""
    parent = os.path.join(MOUNT.path, PARENT)
    cg = os.path.join(parent, "db")
    os.makedirs(os.path.join(cg, "busy"))
    leftovers = Leftovers()
    attempts = []
    real_rmdir = os.rmdir
    monkeypatch.setattr(os, "rmdir", lambda p: (attempts.append(p), real_rmdir(p)))
    assert leftovers.remove(cg, evict_to=MOUNT.path) is False and cg in leftovers.pending
    assert len(attempts) <= 2, f"{len(attempts)} rmdir attempts on a cgroup a child keeps busy"
    monkeypatch.undo()
    with caplog.at_level(logging.WARNING, logger="cod.rm.enforce"):
        assert leftovers.drain(wait_s=0.05) == []
    assert f"left cgroup {cg} in place" in caplog.text and os.path.isdir(cg)
    os.rmdir(os.path.join(cg, "busy"))
    assert leftovers.retry() == [cg] and not os.path.exists(cg) and not leftovers.pending


def test_close_releases_every_task_when_one_fails_and_names_each_failure(state_dir, spawn):
    """Pointed at plain directories (not cgroupfs), every write 'succeeds' and no task cgroup can
    be removed (its files stay). close() still gives each process its CPUs back and reports every
    task that failed, not only the first (which used to end the loop)."""
    from cod.rm.enforce import CpusetV2Enforcer
    from cod.rm.enforce.cgroupfs import CpusetMount
    fake = os.path.join(state_dir, "cgroup")
    for d in (fake, os.path.join(fake, PARENT)):
        os.makedirs(d)
        open(os.path.join(d, "cgroup.subtree_control"), "w").close()
        with open(os.path.join(d, "cgroup.controllers"), "w") as f:
            f.write("cpuset\n")
    a, b = spawn(1, "sleep"), spawn(1, "sleep")
    before = allowed_list(a.pid), allowed_list(b.pid)
    enf = CpusetV2Enforcer(CpusetMount(2, fake), os.path.join(state_dir, "state"), parent=PARENT)
    for task, proc in (("a", a), ("b", b)):
        os.makedirs(os.path.join(fake, PARENT, task))
        for f in ("cpuset.cpus", "cpuset.mems", "cgroup.procs"):
            open(os.path.join(fake, PARENT, task, f), "w").close()
        enf.apply(task, [proc.pid], [CPUS[0]], [0])
    assert allowed_list(a.pid) == allowed_list(b.pid) == str(CPUS[0])
    with pytest.raises(EnforceError) as failed:
        enf.close()
    assert all(f"cannot remove cgroup {os.path.join(fake, PARENT, t)}" in str(failed.value) for t in ("a", "b"))
    assert (allowed_list(a.pid), allowed_list(b.pid)) == before

HOLDER = "b = bytearray(256 << 20); b[::4096] = b'x' * len(b[::4096]); print('ready', flush=True); input()"


@needs_root()
@pytest.mark.skipif(MOUNT is None, reason="no cpuset controller mounted")
def test_a_task_killed_just_before_its_release_leaves_no_cgroup(state_dir):
    """The real case: a process that holds 256 MB takes tens of ms to exit after SIGKILL, and its
    cgroup is busy all that time. The release does not wait for it (the daemon's event loop would);
    close does, and nothing is left."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    enf = make("cpuset", state_dir)
    try:
        assert holder.stdout.readline() == "ready\n"
        enf.apply("db", [holder.pid], [CPUS[-1]], [0])
        holder.kill()
        enf.release("db")
    finally:
        enf.close()
        holder.kill()
        holder.wait()
    assert not os.path.exists(os.path.join(MOUNT.path, PARENT))

def test_an_exiting_or_gone_task_is_one_that_leaves_its_cgroup_on_its_own(spawn):
    live = spawn(1, "sleep")
    gone = subprocess.Popen(["true"])
    gone.wait()
    zombie = subprocess.Popen(["true"])
    try:
        while read_stat(zombie.pid).state != "Z":
            pass
        assert not exiting(live.pid) and not exiting(os.getpid())
        assert exiting(gone.pid) and exiting(zombie.pid)
    finally:
        zombie.wait()

def other_cpusets_on_our_cpus() -> list[str]:
    """Top-level cpusets of others (other work, another test run) that hold some of our CPUs."""
    ours = set(CPUS)
    found = []
    for d in os.listdir(MOUNT.path):
        cpus = _read_or_none(os.path.join(MOUNT.path, d, "cpuset.cpus")) if d != PARENT else None
        if cpus and ours & set(parse_cpu_list(cpus)):
            found.append(d)
    return found


def _read_or_none(path: str) -> str | None:
    try:
        return open(path).read().strip()
    except OSError:  # not a cpuset, or another run's, gone meanwhile
        return None


def exclusive_enforcer(state_dir: str) -> CpusetV1Enforcer:
    """Our parent must be exclusive too, and the kernel (6.18 at least) refuses an exclusive cpuset
    that shares a CPU with any sibling, exclusive or not: while another top-level cpuset (other
    work, another test run) holds our CPUs the test cannot run, and that is not ours to change. So
    it is skipped when one is there, before or when the kernel refuses ours (two clean-clone runs
    at once refused each other's)."""
    for attempt in range(2):
        if other_cpusets_on_our_cpus():
            pytest.skip(f"other top-level cpusets hold our CPUs: {other_cpusets_on_our_cpus()}")
        try:
            return CpusetV1Enforcer(MOUNT, state_dir, parent=PARENT, exclusive=True)
        except EnforceError as err:
            assert not os.path.exists(os.path.join(MOUNT.path, PARENT)), "a refused start left its parent"
            if "cpu_exclusive" not in str(err) or attempt == 1:
                raise
    raise AssertionError("unreachable")


@needs_root()
@v1_only
def test_a_refused_exclusive_parent_leaves_no_cgroup(state_dir):
    """A refused start changes nothing: the parent it made is gone again (a run that failed here
    once left it, and the next runs' exclusive parents were refused because of it)."""
    blocker = os.path.join(MOUNT.path, f"{PARENT}-blocker")  # ours: exclusive on every CPU we have
    os.mkdir(blocker)
    try:
        for name in ("cpuset.cpus", "cpuset.mems"):
            with open(os.path.join(blocker, name), "w") as f:
                f.write(open(os.path.join(MOUNT.path, name)).read().strip())
        try:
            with open(os.path.join(blocker, "cpuset.cpu_exclusive"), "w") as f:
                f.write("1")
        except OSError as err:
            pytest.skip(f"another cpuset holds our CPUs (other work), so ours cannot be exclusive: {err}")
        with pytest.raises(EnforceError, match=rf"cannot write .* to .*/{PARENT}/cpuset\.cpu"):
            CpusetV1Enforcer(MOUNT, state_dir, parent=PARENT, exclusive=True)
        assert not os.path.exists(os.path.join(MOUNT.path, PARENT))
    finally:
        os.rmdir(blocker)


@needs_root()
@v1_only
@two_cpus
def test_v1_exclusive_cpusets_refuse_overlap(state_dir, spawn):
    a, b = spawn(1, "sleep"), spawn(1, "sleep")
    enf = exclusive_enforcer(state_dir)
    try:
        enf.apply("a", [a.pid], [CPUS[0]], [0])
        assert open(os.path.join(MOUNT.path, PARENT, "a", "cpuset.cpu_exclusive")).read().strip() == "1"
        with pytest.raises(EnforceError, match=rf"cannot write '{CPUS[0]}' to .*/b/cpuset.cpus"):
            enf.apply("b", [b.pid], [CPUS[0]], [0])  # the kernel refuses an overlapping exclusive set
        enf.apply("b", [b.pid], [CPUS[1]], [0])
    finally:
        enf.close()
    assert not os.path.exists(os.path.join(MOUNT.path, PARENT))


@needs_root()
@v2_only
def test_v2_cgroup_created_filled_and_removed(state_dir, spawn):
    from cod.rm.enforce import CpusetV2Enforcer
    task = spawn(2, "sleep")
    enf = CpusetV2Enforcer(MOUNT, state_dir, parent=PARENT)
    cg = os.path.join(MOUNT.path, PARENT, "db")
    try:
        enf.apply("db", [task.pid], [CPUS[-1]], [0])
        assert open(f"{cg}/cpuset.cpus").read().strip() == str(CPUS[-1])
        assert [int(p) for p in open(f"{cg}/cgroup.procs").read().split()] == [task.pid]
        enf.release("db")
        assert not os.path.exists(cg)
    finally:
        enf.close()


# ---- crash and restart -----------------------------------------------------

CRASHER = textwrap.dedent("""
    import os, sys, time
    from cod.rm.enforce import detect
    mode, state_dir, parent, pid, cpu = sys.argv[1:6]
    enf = detect(mode, state_dir, cgroup_parent=parent)
    enf.apply("victim", [int(pid)], [int(cpu)], [0])
    print("ready", flush=True)
    time.sleep(3600)
""")


@two_cpus
@pytest.mark.parametrize("kind", BACKENDS)
def test_next_start_after_sigkill_restores_everything(kind, state_dir, spawn):
    if kind == "cpuset" and (os.geteuid() != 0 or MOUNT is None):
        pytest.skip("needs root and a cpuset controller")
    task = spawn(4, "sleep")
    before = thread_masks(task.pid)
    rm = subprocess.Popen([sys.executable, "-c", CRASHER, kind, state_dir, PARENT, str(task.pid), str(CPUS[1])],
                          stdout=subprocess.PIPE, text=True)
    try:
        assert rm.stdout.readline().strip() == "ready"
        assert set(thread_masks(task.pid).values()) == {str(CPUS[1])}
    finally:
        rm.send_signal(signal.SIGKILL)
        rm.wait()
    cg = os.path.join(MOUNT.path, PARENT, "victim") if MOUNT else ""
    if kind == "cpuset":
        assert os.path.isdir(cg)  # left behind by the crash
    enf = make(kind, state_dir)
    try:
        done = enf.cleanup_stale()
        assert any(f"pid {task.pid}" in line for line in done)
        assert thread_masks(task.pid) == before
        if kind == "cpuset":
            assert f"removed cgroup {cg}" in done and not os.path.exists(cg)
        assert enf.cleanup_stale() == []  # nothing left the second time
    finally:
        enf.close()
    assert not os.path.exists(os.path.join(state_dir, "enforce-state.json"))
    if MOUNT is not None:
        assert not os.path.exists(os.path.join(MOUNT.path, PARENT))


@needs_root()
@v1_only
def test_affinity_run_cleans_up_after_a_crashed_cpuset_run(state_dir, spawn):
    task = spawn(2, "sleep")
    before, home = thread_masks(task.pid), process_cgroup(task.pid, 1)
    rm = subprocess.Popen([sys.executable, "-c", CRASHER, "cpuset", state_dir, PARENT, str(task.pid), str(CPUS[-1])],
                          stdout=subprocess.PIPE, text=True)
    try:
        assert rm.stdout.readline().strip() == "ready"
    finally:
        rm.send_signal(signal.SIGKILL)
        rm.wait()
    with AffinityEnforcer(state_dir, cgroup_parent=PARENT) as enf:  # the parent the crashed run used
        done = enf.cleanup_stale()
    assert f"removed cgroup {os.path.join(MOUNT.path, PARENT, 'victim')}" in done
    assert not os.path.exists(os.path.join(MOUNT.path, PARENT))
    assert thread_masks(task.pid) == before and process_cgroup(task.pid, 1) == home


@needs_root()
def test_migrate_pages_on_a_real_process(spawn):
    from cod.rm.enforce.cpuset import migrate_pages
    from cod.rm.enforce.livestate import numa_pages
    task = spawn(1, "sleep")
    nodes = sorted(numa_pages(task.pid))
    # Same nodes in and out: nothing can fail to move, so 0 pages are left behind.
    assert migrate_pages(task.pid, nodes, nodes) == 0
    task.stop()
    assert migrate_pages(task.pid, nodes, nodes) == 0  # gone: nothing to do, no error


@two_cpus
def test_a_task_whose_pid_set_shrinks_gives_the_dropped_pid_its_mask_back(state_dir, spawn):
    # The RM passes a task's current pids on every apply (its own and its children's).
    a, b = spawn(2, "sleep"), spawn(2, "sleep")
    before = {a.pid: thread_masks(a.pid), b.pid: thread_masks(b.pid)}
    with AffinityEnforcer(state_dir) as enf:
        enf.apply("db", [a.pid, b.pid], (CPUS[1],), (0,))
        assert set(thread_masks(a.pid).values()) == set(thread_masks(b.pid).values()) == {str(CPUS[1])}
        enf.apply("db", [b.pid], (CPUS[1],), (0,))
        assert thread_masks(a.pid) == before[a.pid]
        assert set(thread_masks(b.pid).values()) == {str(CPUS[1])}
        enf.release("db")
        assert thread_masks(b.pid) == before[b.pid] and enf.tasks() == {}


FORKER = textwrap.dedent("""
    import subprocess, sys
    sys.stdin.readline()
    child = subprocess.Popen(["sleep", "60"])
    print(child.pid, flush=True)
    sys.stdin.readline()
    child.kill()
""")


@two_cpus
@pytest.mark.parametrize("kind", BACKENDS)
def test_children_forked_after_pinning_are_freed_on_release(kind: str, state_dir: str) -> None:
    parent = subprocess.Popen([sys.executable, "-c", FORKER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    enf = make(kind, state_dir)
    try:
        original = cpus_allowed(parent.pid)
        enf.apply("forker", [parent.pid], [CPUS[1]], [0])
        parent.stdin.write("fork\n")
        parent.stdin.flush()
        child = int(parent.stdout.readline())
        assert cpus_allowed(child) == (CPUS[1],)  # inherited from the pinned parent
        assert enf.add_thread("forker", child)  # what the RM does on the fork event
        recorded = json.load(open(os.path.join(state_dir, "enforce-state.json")))
        assert str(child) in recorded["tasks"]["forker"]["children"]
        enf.release("forker")
        assert cpus_allowed(child) == original
        assert cpus_allowed(parent.pid) == original
    finally:
        enf.close()
        parent.stdin.write("done\n")
        parent.stdin.flush()
        parent.wait(10)


@pytest.mark.parametrize("name, directory", [
    ("db", "db"), ("pg-main", "pg-main"), ("duckdb.worker-1", "duckdb.worker-1"), ("other.1234", "other.1234"),
])
def test_plain_task_names_are_their_own_cgroup_directory(name, directory):
    from cod.rm.enforce.cpuset import cgroup_dir_name
    assert cgroup_dir_name(name) == directory


def test_any_other_name_gets_an_escaped_directory_that_never_collides():
    from cod.rm.enforce.cpuset import cgroup_dir_name
    names = ["PostgreSQL 16", "Zürich", "a/b", "..", ".", "~x", "x" * 128, "é" * 64, "a b", "a  b", "../etc"]
    dirs = [cgroup_dir_name(n) for n in names]
    assert len(set(dirs)) == len(names)
    for d in dirs:
        assert "/" not in d and d not in (".", "..") and 0 < len(d.encode()) <= 255
        assert d.startswith("~") or d in names


@pytest.mark.parametrize("arch, number", [("x86_64", 256), ("aarch64", 238), ("ppc64le", 258), ("s390x", 287)])
def test_migrate_pages_has_its_number_on_each_architecture(arch, number):
    from cod.rm.enforce.cpuset import migrate_pages_number
    assert migrate_pages_number(arch) == number


def test_an_unknown_architecture_is_said_not_guessed():
    from cod.rm.enforce.cpuset import migrate_pages_number
    with pytest.raises(EnforceError, match="not supported on vax"):
        migrate_pages_number("vax")

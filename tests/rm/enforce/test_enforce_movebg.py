"""Page moves run off apply()'s thread (rm/enforce/movequeue.py): apply() returns once the CPUs
are enforced, a newer apply of the task supersedes its move, release() and close() cancel it.

Real processes and the real enforcer and mover; the move is held still by the mover's
``before_pid`` hook (set by tests only), which waits on the test's gate on the worker thread
before each pid's pages are moved, so "still moving" is a state, not a duration."""

from __future__ import annotations

import os
import threading
import time

import pytest

from cod.rm.enforce import AffinityEnforcer, CpusetV1Enforcer, CpusetV2Enforcer
from cod.rm.enforce.cgroupfs import find_cpuset_mount, process_cgroup
from cod.rm.enforce.movequeue import MoveJob
from cod.rm.enforce.pagemove import PageMover
from cod.facts.procfs import numa_ranges
from helpers.procs import allowed_list, needs_root, spawn, spinner_cmd  # noqa: F401 (fixtures)

CPUS = sorted(os.sched_getaffinity(0))
MOUNT = find_cpuset_mount()
SLOW = 60.0  # seconds: generous bounds on the host's shared load, never a measured duration


class Gate:
    """The mover's hook: records each (job, pid) and holds the worker until opened (or the job
    is cancelled)."""

    def __init__(self) -> None:
        self.opened = threading.Event()
        self.entered = threading.Event()
        self.seen: list[tuple[MoveJob, int]] = []

    def __call__(self, job: MoveJob, pid: int) -> None:
        self.seen.append((job, pid))
        self.entered.set()
        deadline = time.monotonic() + SLOW
        while not (self.opened.is_set() or job.cancelled) and time.monotonic() < deadline:
            time.sleep(0.005)


@pytest.fixture
def enf(tmp_path):
    e = AffinityEnforcer(str(tmp_path / "state"), memory_migrate=True)
    yield e
    e.close()


@pytest.fixture
def gate(enf):
    g = Gate()
    enf.background.before_pid = g
    yield g
    g.opened.set()


def test_apply_returns_while_the_move_is_held_and_others_are_served(enf, gate, spawn):
    db, other = spawn(1, "sleep"), spawn(1, "sleep")
    assert enf.apply("db", [db.pid], [CPUS[-1]], [0]) == [db.pid]
    assert gate.entered.wait(SLOW), "the worker did not start the move"
    assert enf.moving("db") and "db" not in enf.moves  # returned, the move not done
    assert allowed_list(db.pid, db.pid) == str(CPUS[-1])  # the CPUs are enforced already
    # Another client's task while db's move is held: its apply returns too, its move waits in line.
    assert enf.apply("other", [other.pid], [CPUS[0]], [0]) == [other.pid]
    assert enf.moving("other") and allowed_list(other.pid, other.pid) == str(CPUS[0])
    gate.opened.set()
    assert enf.wait_moves(SLOW)
    assert not enf.moving("db") and not enf.moving("other")
    assert [r.pid for r in enf.moves["db"]] == [db.pid] and [r.pid for r in enf.moves["other"]] == [other.pid]
    assert [pid for _, pid in gate.seen] == [db.pid, other.pid]


def test_a_newer_apply_of_the_task_supersedes_its_move(enf, gate, spawn):
    a, b = spawn(1, "sleep"), spawn(1, "sleep")
    enf.apply("db", [a.pid], [CPUS[0]], [0])
    assert gate.entered.wait(SLOW)
    enf.apply("db", [a.pid, b.pid], [CPUS[0]], [0])  # b joins: a new move of both
    gate.opened.set()
    assert enf.wait_moves(SLOW)
    first, second = gate.seen[0][0], gate.seen[-1][0]
    assert first.cancelled and first.pids == (a.pid,)
    assert not second.cancelled and second.pids == (a.pid, b.pid)
    assert sorted(r.pid for r in enf.moves["db"]) == sorted([a.pid, b.pid])  # the newer one's reports
    # Applied again with nothing new: the pages are there, no move is queued.
    enf.apply("db", [a.pid, b.pid], [CPUS[0]], [0])
    assert not enf.moving("db") and len(gate.seen) == 3


def test_the_same_apply_again_leaves_the_move_under_way(enf, gate, spawn):
    a = spawn(1, "sleep")
    enf.apply("db", [a.pid], [CPUS[0]], [0])
    assert gate.entered.wait(SLOW)
    enf.apply("db", [a.pid], [CPUS[-1]], [0])  # new CPUs, same nodes and pids: a re-pin
    (job, _), = gate.seen
    assert not job.cancelled and enf.moving("db")
    gate.opened.set()
    assert enf.wait_moves(SLOW) and [r.pid for r in enf.moves["db"]] == [a.pid]


def test_release_cancels_the_move(enf, gate, spawn):
    a = spawn(1, "sleep")
    before = allowed_list(a.pid, a.pid)
    enf.apply("db", [a.pid], [CPUS[0]], [0])
    assert gate.entered.wait(SLOW)
    enf.release("db")
    (job, _), = gate.seen
    assert job.cancelled and not enf.moving("db")
    assert allowed_list(a.pid, a.pid) == before
    assert enf.wait_moves(SLOW) and "db" not in enf.moves  # the cancelled move recorded nothing


def test_close_cancels_the_move_and_stops_the_worker(tmp_path, spawn):
    enf = AffinityEnforcer(str(tmp_path / "state"), memory_migrate=True)
    gate = Gate()
    enf.background.before_pid = gate
    a = spawn(1, "sleep")
    enf.apply("db", [a.pid], [CPUS[0]], [0])
    assert gate.entered.wait(SLOW)
    worker = enf.background._thread
    enf.close()
    assert gate.seen[0][0].cancelled and worker is not None and not worker.is_alive()


def test_without_memory_migration_nothing_is_queued(tmp_path, spawn):
    enf = AffinityEnforcer(str(tmp_path / "state"))
    try:
        a = spawn(1, "sleep")
        enf.apply("db", [a.pid], [CPUS[0]], [0])
        assert not enf.moving("db") and enf.background._thread is None
    finally:
        enf.close()


def test_a_cancelled_move_stops_before_its_next_call(spawn):
    """Every page of a process off the target (a node past those holding its pages): a cancelled
    move makes no call at all and says it was cancelled."""
    a = spawn(1, "sleep")
    beyond = max(n for r in numa_ranges(a.pid) for n in r.pages) + 1
    report = PageMover().move(a.pid, [beyond], cancelled=lambda: True)
    assert report.cancelled and report.calls == 0 and report.moved == 0


@needs_root()
@pytest.mark.skipif(MOUNT is None, reason="no cpuset controller mounted")
def test_cpuset_mode_enforces_the_cpus_at_once_and_a_released_tasks_move_touches_nothing(tmp_path, spawn):
    """In a cgroup per task: apply() returns with the process in its cgroup on its CPUs while the
    move is held; released meanwhile, the cgroup is gone and the cancelled move does not write it."""
    cls = CpusetV1Enforcer if MOUNT.version == 1 else CpusetV2Enforcer
    parent = f"cod-movebg-{os.getpid()}"
    enf = cls(MOUNT, str(tmp_path / "state"), parent=parent, memory_migrate=True)
    gate = Gate()
    enf.background.before_pid = gate
    cg = os.path.join(MOUNT.path, parent, "db")
    a = spawn(1, "sleep")
    try:
        enf.apply("db", [a.pid], [CPUS[-1]], [0])
        assert gate.entered.wait(SLOW) and enf.moving("db")
        assert process_cgroup(a.pid, MOUNT.version) == f"/{parent}/db"
        assert open(f"{cg}/cpuset.cpus").read().strip() == str(CPUS[-1])
        enf.release("db")
        assert gate.seen[0][0].cancelled and not os.path.exists(cg)
        gate.opened.set()
        assert enf.wait_moves(SLOW) and not os.path.exists(cg) and "db" not in enf.moves
        enf.apply("db", [a.pid], [CPUS[0]], [0])  # again, to its end: the cpuset has the task's node
        gate.opened.set()
        assert enf.wait_moves(SLOW) and [r.pid for r in enf.moves["db"]] == [a.pid]
        assert open(f"{cg}/cpuset.mems").read().strip() == "0"
    finally:
        enf.close()
    assert not os.path.exists(os.path.join(MOUNT.path, parent))

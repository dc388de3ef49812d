"""Where unregistered busy processes go (issue 18): the newcomer moves, the database stays.

A registered task holds one CPU (min_cores = max_cores = 1); an unregistered CPU hog starts on that
very CPU.  The allocator keeps CPUs for the hog with the objective of every task: a registered
task's move costs more than the newcomer's, so while a free CPU exists the hog is confined there
and the task never moves.  Run 20 times with a real enforcing daemon and real processes."""

from __future__ import annotations

import os
import time

import pytest

from helpers.procs import needs_root, spawn, spinner_cmd  # noqa: F401 (fixtures)
from test_integration_rm import (  # noqa: F401 (no_cgroup_left_behind: an autouse fixture)
    ALL, enforcing_daemon, no_cgroup_left_behind, others_of, register, two_cpus, wait_until)
from helpers.rm_support import RawConn

RUNS = 20


def upcalls_of(conn: RawConn, task: str, wait_s: float) -> list[dict]:
    """Every allocation upcall for ``task`` arriving within ``wait_s`` (and those already queued)."""
    got = [m["params"] for m in conn.inbox if m.get("method") == "allocation_changed"
           and m["params"].get("task") == task]
    conn.inbox.clear()
    deadline = time.monotonic() + wait_s
    while (left := deadline - time.monotonic()) > 0:
        conn.sock.settimeout(left)
        try:
            msg = conn.recv()
        except OSError:
            break
        if msg and msg.get("method") == "allocation_changed" and msg["params"].get("task") == task:
            got.append(msg["params"])
    conn.sock.settimeout(10)
    return got


def db_on_one_cpu(daemon, spawn):
    """A sleeping process registered as task db with exactly one CPU: (process, connection, its CPU)."""
    db = spawn(1, "sleep")
    c = RawConn(daemon.path)
    c.hello("newcomer")
    home = register(c, "db", db.pid, min_cores=1, max_cores=1)["allocation"]["cores"]
    assert len(home) == 1
    return db, c, home


@two_cpus
@needs_root()
def test_the_newcomer_moves_and_the_registered_task_stays(tmp_path, spawn):
    d, _ = enforcing_daemon(tmp_path, "affinity", "--busy-window", "2")
    try:
        db, c, home = db_on_one_cpu(d, spawn)
        moves = []
        for run in range(RUNS):
            # It happens to run on db's CPU: it starts there, for pinning it after its start raced
            # with the daemon, which confined it first on a loaded machine (session 7).
            hog = spawn(1, "spin", cpus=home)
            wait_until(lambda: hog.pid in others_of(c), 10, f"run {run}: the hog recorded as other_task")
            free = [x for x in ALL if x not in home]
            # The hog is confined to a free CPU...
            try:
                wait_until(lambda: all(set(os.sched_getaffinity(t)) <= set(free) for t in hog.tids), 5,
                           f"run {run}: the hog confined away from db's CPU {home}")
            except AssertionError as err:  # once at load 8 (session 15), its log lost: keep what it says
                tail = "\n".join(d.log_text().splitlines()[-25:])
                raise AssertionError(f"{err}; others {others_of(c)}; the daemon's log ends:\n{tail}") from None
            assert others_of(c)[hog.pid]["cpus"] == free[:1]
            # ... and db was never moved.
            ups = upcalls_of(c, "db", 0.3)
            moves += [u for u in ups if u["cores"] != home]
            assert sorted(os.sched_getaffinity(db.pid)) == home
            assert [t["cores"] for t in c.call("list_tasks")["result"]["tasks"]] == [home]
            hog.stop()
            wait_until(lambda: hog.pid not in others_of(c), 5, f"run {run}: the hog forgotten")
        assert moves == [], f"db was moved {len(moves)} times in {RUNS} runs: {moves}"
    finally:
        d.stop()

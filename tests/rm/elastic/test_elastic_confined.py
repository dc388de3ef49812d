"""Issue 30, item 1: a group registered on a process the busy detector had already confined.

The busy detector confines an unregistered spinner to one CPU; `register_unmanaged` then makes it an
elastic group on the other CPU.  Before the fix, the busy record was dropped after the group had pinned
the process, and dropping it restored the mask recorded before the confinement: every thread back on
every CPU while the group held one, and the group's own record held the confinement as the "original".
Both CPU orders (confined to CPU 1, group on CPU 0, and the other way round).

A real daemon (affinity backend, own state directory, busy scope limited to this test's descendants),
a real C spinner: its main thread is pinned to the CPU it should be confined to (the detector keeps a
busy process where it runs, and /proc/PID/stat says where the main thread ran), its spinning thread may
run anywhere; those are the original masks the removal must give back.  Every wait is on a state.
"""

from __future__ import annotations

import os
import signal

import pytest

from cod.client import Client
from helpers.procs import allowed_list, spinner_cmd, start_spinner  # noqa: F401 (fixture)
from helpers.waiting import wait_until
from test_elastic_daemon import ALL, DEMAND, cpus_text, elastic_daemon, group_cores, groups, masks, state_file

pytestmark = pytest.mark.skipif(len(ALL) != 2, reason="the two CPU orders of a 2-CPU machine")


def thread_masks(pid: int) -> dict[int, str]:
    return {int(t): allowed_list(pid, int(t)) for t in os.listdir(f"/proc/{pid}/task")}


def busy_pids(c: Client) -> set[int]:
    return {o["pid"] for o in c.call("list_tasks")["other_tasks"]}


@pytest.mark.parametrize("confined_cpu", [1, 0], ids=["confined-to-1-group-on-0", "confined-to-0-group-on-1"])
def test_a_group_registered_on_a_confined_busy_process_keeps_adapting(tmp_path, spinner_cmd, confined_cpu):
    group_cpu = 1 - confined_cpu
    d = elastic_daemon(tmp_path)
    # Born on the CPU it should be confined to: the main thread (waiting on stdin) never runs
    # elsewhere, so /proc/PID/stat names that CPU; the spinning worker is then let run anywhere.
    sp = start_spinner(["taskset", "-c", str(confined_cpu), *spinner_cmd], 1, "spin")
    try:
        for tid in sp.tids[1:]:
            os.sched_setaffinity(tid, ALL)
        original = thread_masks(sp.pid)
        assert original[sp.pid] == str(confined_cpu) and set(original.values()) == {str(confined_cpu), cpus_text(ALL)}
        with Client(str(d.path), app="confined") as c:
            wait_until(lambda: f"confined busy process {sp.pid} (spinner) to CPUs {confined_cpu}" in d.log_text(),
                       30, f"the busy detector to confine the spinner to CPU {confined_cpu}")
            assert masks(sp.pid) == {str(confined_cpu)}
            g = c.register_unmanaged(pid=sp.pid, name="spin", **DEMAND)
            assert g["cores"] == [group_cpu], "the group starts on the CPU the busy process did not hold"
            # A member of a group is no busy stranger: the detector forgets it, and forgetting it must
            # not touch the masks the group gave it.
            wait_until(lambda: sp.pid not in busy_pids(c), 10, "the spinner no longer a busy process")
            assert f"other.{sp.pid}" not in state_file(tmp_path).get("tasks", {})
            # It spins on one CPU: the net grants the other one, and every thread follows.
            wait_until(lambda: group_cores(c, "spin") == ALL, 15, "the busy group to grow to every CPU")
            wait_until(lambda: masks(sp.pid) == {cpus_text(ALL)}, 5, "its threads on every CPU")
            # Stopped: the net releases down to one CPU and every thread is confined there.
            os.kill(sp.pid, signal.SIGSTOP)
            wait_until(lambda: len(group_cores(c, "spin") or ()) == 1, 15, "the idle group down to one CPU")
            one = group_cores(c, "spin")
            wait_until(lambda: masks(sp.pid) == {cpus_text(one)}, 5, "its threads on that one CPU")
            os.kill(sp.pid, signal.SIGCONT)
            wait_until(lambda: group_cores(c, "spin") == ALL, 15, "the busy group back on every CPU")
            # Removed: each thread gets the mask it had before the daemon touched it (not the
            # confinement, not the group's CPUs).
            out = c.call("deregister_unmanaged", {"name": "spin"})
            assert out["reason"] == "deregistered"
            assert groups(c) == {}
        assert thread_masks(sp.pid) == original
        assert "spin" not in state_file(tmp_path).get("tasks", {})
    finally:
        if sp.proc.poll() is None:
            os.kill(sp.pid, signal.SIGCONT)
        sp.stop()
        d.stop()
    log = d.log_text()
    fired = [line for line in log.splitlines() if "elastic group spin:" in line and " at " in line]
    assert any("allocate" in line for line in fired) and any("release" in line for line in fired), fired



def test_a_busy_process_keeps_its_cpu_apart_from_a_group(tmp_path, spinner_cmd):
    """The decision of docs/elastic.md (*Other busy processes beside a group*): an unregistered busy
    process (a client such as pgbench) is kept on a CPU of its own, and the group does not grow into
    it, even overloaded (t6: nothing left to give); once it is gone the group grows there."""
    d = elastic_daemon(tmp_path)
    stranger = start_spinner(["taskset", "-c", "1", *spinner_cmd], 1, "spin")
    group = start_spinner(spinner_cmd, 3, "spin")  # two spinning workers: demand for both CPUs
    try:
        for tid in stranger.tids[1:]:
            os.sched_setaffinity(tid, ALL)
        with Client(str(d.path), app="beside") as c:
            wait_until(lambda: f"confined busy process {stranger.pid} (spinner) to CPUs 1" in d.log_text(), 30,
                       "the busy detector to confine the stranger to CPU 1")
            c.register_unmanaged(pid=group.pid, name="spin", **DEMAND)
            wait_until(lambda: c.execute_query("elastic_transition(spin, t6, _)", all_solutions=False), 15,
                       "the overloaded group at its cap (t6)")
            assert group_cores(c, "spin") == [0] and stranger.pid in busy_pids(c)
            assert masks(group.pid) == {"0"} and masks(stranger.pid) == {"1"}
            stranger.stop()
            wait_until(lambda: group_cores(c, "spin") == ALL, 15, "the group to grow into the CPU left free")
            wait_until(lambda: masks(group.pid) == {cpus_text(ALL)}, 5, "its threads on every CPU")
    finally:
        stranger.stop()
        group.stop()
        d.stop()

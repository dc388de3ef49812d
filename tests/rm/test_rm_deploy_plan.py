"""The RM enforces a query-plan deployment (issue 17, "Enforcing a deployment"): deploy_plan sets the
task's min_cores to the plan's core count, the global allocator places it, and each named operator
thread (by name or TID) is pinned to its cluster's CPU inside the task's CPUs, also when it appears
later.  Real daemon, real threads (tests/helpers/opthreads.c), this machine's CPUs."""

from __future__ import annotations

import os
import subprocess

import pytest

from cod.client import AdmissionRefused, Client, InvalidRequest
from cod.rm.deployment import match_threads
from cod.facts.procfs import format_cpu_list
from helpers import opthreads
from helpers.procs import allowed_list
from test_integration_rm import enforcing_daemon, no_cgroup_left_behind, wait_until  # noqa: F401 (autouse fixture)

N_CPUS = len(os.sched_getaffinity(0))
pytestmark = pytest.mark.skipif(N_CPUS < 2, reason="needs two CPUs")


# ---- the pure matching ----------------------------------------------------------------------------
@pytest.mark.parametrize("placement,threads,targets,unmatched", [
    ({"scan0": 0, "join": 1}, {10: "scan0", 11: "join", 12: "main"}, {10: 0, 11: 1}, ()),
    ({"scan0": 0, "join": 1}, {10: "scan0"}, {10: 0}, ("join",)),
    # names longer than 15 bytes match what the kernel keeps of them
    ({"a_very_long_operator_name": 3}, {7: "a_very_long_ope"}, {7: 3}, ()),
    # an id that is a TID names that thread, whatever its name
    ({"12": 1, "scan": 0}, {12: "worker", 13: "scan"}, {12: 1, 13: 0}, ()),
    # several threads of one name all go to the operator's CPU
    ({"scan": 2}, {20: "scan", 21: "scan"}, {20: 2, 21: 2}, ()),
    ({}, {1: "x"}, {}, ()),
])
def test_match_threads(placement, threads, targets, unmatched):
    m = match_threads(placement, threads)
    assert m.targets == targets and m.unmatched == unmatched


# ---- the daemon -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def exe(tmp_path_factory):
    return opthreads.build(str(tmp_path_factory.mktemp("opthreads")))


@pytest.fixture
def daemon(tmp_path):
    d, _ = enforcing_daemon(tmp_path, "affinity")
    yield d
    d.stop()


def graph(utils: dict[str, float]) -> dict:
    return {"operators": [{"id": k, "cpu_util": v, "mem_bw": 1e8} for k, v in utils.items()], "edges": []}


def cpus_of(pid: int, tid: int) -> str:
    return allowed_list(pid, tid)


DUTIES = {"op_a": 0.3, "op_b": 0.3, "op_c": 0.3, "op_d": 0.3}


def test_deploy_plan_sets_min_cores_and_pins_each_named_thread(daemon, exe):
    ops = opthreads.start(exe, DUTIES, seconds=60, units_per_ms=1000)  # waits for "go": idle threads
    try:
        with Client(str(daemon.path), app="engine") as c:
            c.register_task("plan", pid=ops.pid, min_cores=1)
            reply = c.call("deploy_plan", {"task": "plan", "graph": graph(DUTIES)})
            # 4 x 0.3 of a core: FFD needs 2 cores; balanced 0.6 / 0.6.
            assert reply["min_cores"] == 2 and reply["cores"] == 2
            assert reply["unmatched"] == [] and reply["problem"] is None
            task = next(t for t in c.call("list_tasks")["tasks"] if t["task"] == "plan")
            assert task["properties"]["min_cores"] == 2 and len(task["cores"]) == 2
            placement = reply["placement"]
            assert set(placement) == set(DUTIES) and set(placement.values()) <= set(task["cores"])
            assert sorted(list(placement.values()).count(c) for c in set(placement.values())) == [2, 2]
            for name, tid in ops.tids.items():
                assert reply["threads"][str(tid)] == placement[name]
                assert cpus_of(ops.pid, tid) == str(placement[name])
            # The main thread is no operator: it keeps the task's whole allocation.
            assert cpus_of(ops.pid, ops.pid) == format_cpu_list(task["cores"])
            c.deregister_task("plan")
            # Released: every thread gets its original mask back.
            original = allowed_list(os.getpid())
            wait_until(lambda: all(cpus_of(ops.pid, t) == original for t in ops.tids.values()),
                       what="threads restored")
    finally:
        ops.stop()


def test_threads_named_later_and_threads_by_tid(daemon, exe):
    # A shell that becomes the engine on a line from the test: the task is registered and the plan
    # deployed before any operator thread exists.
    args = [exe, "10", "60", "1000", *(f"{k}:{v}" for k, v in DUTIES.items())]
    proc = subprocess.Popen(["sh", "-c", 'read line; exec "$@"', "sh", *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        with Client(str(daemon.path), app="engine2") as c:
            c.register_task("late", pid=proc.pid, min_cores=1)
            g = graph(DUTIES)
            # One operator named by the shell's own TID (its main thread, once it is the engine).
            g["operators"].append({"id": str(proc.pid), "cpu_util": 0.05, "mem_bw": 1e8})
            reply = c.call("deploy_plan", {"graph": g})
            assert sorted(reply["unmatched"]) == sorted(DUTIES)  # no such thread yet
            assert reply["threads"] == {str(proc.pid): reply["placement"][str(proc.pid)]}
            proc.stdin.write("start\n")
            proc.stdin.flush()
            line = proc.stdout.readline().split()
            assert line and line[0] == "ready", line
            tids = dict(zip(DUTIES, map(int, line[2:])))
            placement = reply["placement"]
            wait_until(lambda: all(cpus_of(proc.pid, tids[k]) == str(placement[k]) for k in DUTIES),
                       timeout=5.0, what="threads named after deploy_plan pinned to their CPUs")
            assert cpus_of(proc.pid, proc.pid) == str(placement[str(proc.pid)])
    finally:
        proc.kill()
        proc.wait()


def test_a_refused_deployment_changes_nothing(daemon, exe):
    ops = opthreads.start(exe, DUTIES, seconds=60, units_per_ms=1000)
    try:
        with Client(str(daemon.path), app="engine3") as c:
            c.register_task("keep", pid=ops.pid, min_cores=1, max_cores=1)
            before = c.call("list_tasks")["tasks"]
            with pytest.raises(InvalidRequest, match="graph: 'operators' must be a non-empty list"):
                c.call("deploy_plan", {"graph": {"operators": []}})
            with pytest.raises(InvalidRequest, match="cpu_util"):
                c.call("deploy_plan", {"graph": graph({"x": 1.5})})
            # Two cores needed, max_cores 1: refused with the numbers.
            with pytest.raises(AdmissionRefused, match="the plan needs 2 cores; task 'keep' has max_cores 1"):
                c.call("deploy_plan", {"graph": graph(DUTIES)})
            # More cores than the machine has.
            c.update_task("keep", max_cores=N_CPUS)
            before = c.call("list_tasks")["tasks"]
            with pytest.raises(AdmissionRefused):
                c.call("deploy_plan", {"graph": graph({f"t{i}": 0.9 for i in range(N_CPUS + 1)})})
            assert c.call("list_tasks")["tasks"] == before
            # No thread was narrowed: each holds the task's whole allocation.
            whole = format_cpu_list(before[0]["cores"])
            assert {cpus_of(ops.pid, t) for t in [ops.pid, *ops.tids.values()]} == {whole}
    finally:
        ops.stop()


def test_deploy_plan_needs_the_callers_task(daemon, exe):
    ops = opthreads.start(exe, {"solo": 0.1}, seconds=60, units_per_ms=1000)
    try:
        with Client(str(daemon.path), app="a1") as c:
            with pytest.raises(InvalidRequest, match="give 'task'"):
                c.call("deploy_plan", {"graph": graph({"solo": 0.1})})
            c.register_task("solo", pid=ops.pid)
            with pytest.raises(InvalidRequest, match="unknown parameter"):
                c.call("deploy_plan", {"graph": graph({"solo": 0.1}), "bogus": 1})
            reply = c.call("deploy_plan", {"graph": graph({"solo": 0.1})})
            assert reply["min_cores"] == 1 and reply["threads"] == {str(ops.tids["solo"]): reply["placement"]["solo"]}
    finally:
        ops.stop()

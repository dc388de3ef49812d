"""The co-design loop (issue "The co-design loop"): properties derived from the database's own stored
procedures, constraints inside the SKB, and condition notifications, end to end with a live daemon."""

from __future__ import annotations

import os
import queue
import time
from pathlib import Path

import pytest

from cod.client import Client, InvalidRequest, KnowledgeBaseError, UnsafeGoal
from helpers.paths import REPO
from helpers.procs import spawn, spinner_cmd  # noqa: F401 (fixtures)
from helpers.rm_support import start_daemon

COST_FN = (REPO / "stored_procedures" / "examples" / "cscs_cost_fn.pl").read_text()
DATASET = ["db_ntuple(30000000)", "db_tsize(315)", "db_nquery(2048)", "db_nupdate(0)"]
N = {"query": "dbos_cost_function(_, N, _)", "var": "N"}
P = {"query": "dbos_cost_function(_, _, P)", "var": "P"}


def upcalls_of(q: queue.Queue, pred, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        assert left > 0, "no matching upcall in time"
        event = q.get(timeout=left)
        if pred(event):
            return event


@pytest.fixture
def magny(tmp_path):
    d = start_daemon(tmp_path, "--machine", "magnycours", "--revoke-deadline", "0.2")
    yield d
    d.stop()


# ---- derived task properties: the paper's Listing 1 as one call, then the SLA moves -------------
def test_listing1_in_one_call_follows_the_sla_by_itself(magny, spawn):
    cscs = spawn(1, "sleep")
    got: queue.Queue = queue.Queue()
    with Client(str(magny.path), app="cscs") as c:
        r = c.register_task("cscs", pid=cscs.pid, min_cores=N, max_cores=N, working_set_bytes=P,
                            bound="cpu", sensitive=["cache", "numa"],
                            facts=DATASET + ["db_rtime(2000)"], procedures=[COST_FN], on_allocation=got.put)
        # Table 3, MagnyCours: 2 s -> 8 cores (partitions of 1 GB); 4 s -> 4; 8 s -> 2.
        assert r["properties"]["min_cores"] == 8 and r["derived"]["min_cores"] == N
        assert len(r["allocation"]["cores"]) == 8
        assert r["properties"]["working_set_bytes"] == 1181250000
        for sla, cores in [(4000, 4), (8000, 2), (2000, 8)]:
            c.remove_facts("db_rtime(_)")
            c.add_facts([f"db_rtime({sla})"])
            up = upcalls_of(got, lambda e: len(e["cores"]) == cores)
            assert "derived properties of cscs changed" in up["reason"]
            c.ack_allocation(epoch=up["epoch"])
        [task] = c.list_tasks()
        assert task["properties"]["min_cores"] == N  # as given: the query, not a number


def test_a_procedure_change_is_followed_too(magny, spawn):
    p = spawn(1, "sleep")
    got: queue.Queue = queue.Queue()
    with Client(str(magny.path), app="cscs2") as c:
        c.register_task("t", pid=p.pid, min_cores=N, max_cores=N, facts=DATASET + ["db_rtime(2000)"],
                        procedures=[COST_FN], on_allocation=got.put)
        c.add_procedure(COST_FN.replace("3750000 * RTimeMs", "7500000 * RTimeMs"))  # twice as fast a scan
        assert len(upcalls_of(got, lambda e: len(e["cores"]) == 4)["cores"]) == 4


def test_a_derivation_that_fails_at_registration_is_refused_with_its_own_error(magny, spawn):
    p = spawn(1, "sleep")
    with Client(str(magny.path), app="broken") as c:
        with pytest.raises(KnowledgeBaseError) as err:
            c.register_task("t", pid=p.pid, min_cores=N, facts=DATASET)  # no cost function
        assert "derived min_cores" in err.value.message and err.value.skb_code == "existence"
        with pytest.raises(InvalidRequest) as err:
            c.register_task("t", pid=p.pid, min_cores={"query": "N = 1, fail", "var": "N"})
        assert "no solution" in err.value.message
        with pytest.raises(UnsafeGoal):
            c.register_task("t", pid=p.pid, min_cores={"query": "shell(ls, N)", "var": "N"})
        with pytest.raises(InvalidRequest) as err:
            c.register_task("t", pid=p.pid, bound={"query": "X = cpu", "var": "X"})
        assert "cannot be derived" in err.value.message
        assert c.list_tasks() == []


def test_a_derivation_that_later_fails_keeps_the_last_values_and_warns(magny, spawn):
    p = spawn(1, "sleep")
    warnings: queue.Queue = queue.Queue()
    with Client(str(magny.path), app="fragile") as c:
        c.subscribe("task_warning", {"task": "t"}, warnings.put)
        c.register_task("t", pid=p.pid, min_cores=N, max_cores=N, facts=DATASET + ["db_rtime(4000)"],
                        procedures=[COST_FN])
        c.remove_facts("db_ntuple(_)")
        w = upcalls_of(warnings, lambda e: e["task"] == "t")
        assert "min_cores" in w["reason"] and w["kept"]["min_cores"] == 4
        assert c.get_allocation("t")["cores"] and len(c.get_allocation("t")["cores"]) == 4


# ---- constraints inside the SKB ------------------------------------------------------------------
def test_a_stored_procedure_can_use_clpfd_under_the_limits(magny):
    with Client(str(magny.path), app="clp") as c:
        c.add_procedure("""
            split(Tuples, Cores, Parts) :-
                length(Parts, Cores), Parts ins 0..Tuples, sum(Parts, #=, Tuples),
                chain(Parts, #>=), last(Parts, Min), labeling([max(Min)], Parts).""")
        assert c.execute_query("split(10, 3, P)", all_solutions=False) == [{"P": [4, 3, 3]}]
        with pytest.raises(KnowledgeBaseError) as err:  # a search too big for its time limit stops there
            c.execute_query("length(L, 40), L ins 0..1000, sum(L, #=, 20000), labeling([ff], L)", timeout_s=0.5)
        assert err.value.skb_code in ("timeout", "resource")
        with pytest.raises(UnsafeGoal):
            c.execute_query("put_attr(X, clpfd, x)")


# ---- condition notifications -----------------------------------------------------------------------
def test_conditions_turn_true_and_false_on_the_apps_own_facts(magny):
    events: queue.Queue = queue.Queue()
    with Client(str(magny.path), app="watcher") as c:
        c.add_facts(["queue_length(10)"])
        sub = c.subscribe("condition", {"goal": "queue_length(L), L > 100"}, events.put)
        c.remove_facts("queue_length(_)")
        c.add_facts(["queue_length(500)"])
        e = upcalls_of(events, lambda e: e["state"] is True)
        assert e["bindings"] == {"L": 500} and e["subscription"] == sub
        c.remove_facts("queue_length(_)")
        c.add_facts(["queue_length(5)"])
        assert upcalls_of(events, lambda e: True)["state"] is False
        c.unsubscribe(sub)
        c.remove_facts("queue_length(_)")
        c.add_facts(["queue_length(900)"])
        time.sleep(0.5)
        assert events.empty()


def test_a_hostile_condition_is_refused_or_dropped_and_the_daemon_serves_on(magny):
    dropped: queue.Queue = queue.Queue()
    with Client(str(magny.path), app="hostile") as c:
        with pytest.raises(UnsafeGoal):
            c.subscribe("condition", {"goal": "shell(ls)"}, dropped.put)
        with pytest.raises(KnowledgeBaseError):  # over its small time limit at once
            c.subscribe("condition", {"goal": "repeat, sleep(0.01), fail"}, dropped.put)
        c.add_facts(["divisor(1)"])
        c.subscribe("condition", {"goal": "divisor(D), X is 1 / D, X > 0"}, dropped.put)
        c.remove_facts("divisor(_)")
        c.add_facts(["divisor(0)"])  # from now on every evaluation is an error
        for i in range(6):
            c.add_facts([f"noise({i})"])
            time.sleep(0.05)
        # The drop notice comes on the subscription itself, saying why.
        e = upcalls_of(dropped, lambda e: e.get("event") == "subscription_dropped")
        assert "failed 5 times" in e["reason"] and "divisor" in e["goal"]
        assert "epoch" in c.call("get_allocation", {})  # the daemon serves on


def spinner_share_percent(pid: int, seconds: float = 2.0) -> float:
    """The share of one CPU a process gets here now, measured (percent)."""
    from cod.facts.procfs import cpu_seconds

    def used() -> float:
        got = cpu_seconds(pid)
        assert got is not None, f"process {pid} is gone"
        return got

    cpu0, t0 = used(), time.monotonic()
    time.sleep(seconds)
    return 100 * (used() - cpu0) / (time.monotonic() - t0)


@pytest.mark.slow
def test_a_condition_follows_the_live_load_of_a_real_spinner(tmp_path, spawn):
    # On the spinner's own CPU use (task_cpu_use/2), not on a CPU's load: other work on the
    # machine may keep any CPU busy after the spinner is gone.  The threshold is half of what
    # the spinner gets here, measured: on a quiet machine its whole CPU (so 40), on one with
    # six CPU-bound processes a CPU (two clean-clone runs, a spinner and a guest) a fifth of it.
    d = start_daemon(tmp_path, "--enforce", "affinity", "--state-dir", str(tmp_path / "state"),
                     "--no-busy-detect", "--refresh-interval", "0.2")
    try:
        events: queue.Queue = queue.Queue()
        with Client(str(d.path), app="load") as c:
            hog = spawn(1, "spin", cpus=[0])  # measured on one CPU, as it will run registered
            threshold = max(5, min(40, round(spinner_share_percent(hog.pid) / 2)))
            # Subscribed first: the upcall is the condition's change from false to true.
            c.subscribe("condition", {"goal": f"task_cpu_use(spinner, U), U > {threshold}"}, events.put)
            c.register_task("spinner", pid=hog.pid, min_cores=1, max_cores=1)
            assert upcalls_of(events, lambda e: e["state"] is True, 10)["bindings"]["U"] > threshold
            hog.stop()  # the task departs with its process: the fact goes, the condition is false
            assert upcalls_of(events, lambda e: e["state"] is False, 10)
    finally:
        d.stop()

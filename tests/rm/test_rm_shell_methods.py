"""The daemon methods the shell uses (issue "An interactive shell"): cancel, list_procedures,
list_predicates, explain_task, get_topology, against a real daemon and SKB."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path

import pytest

from cod.client import Client, InvalidRequest, NotFound, PermissionDenied, QueryCancelled
from cod.facts.model import Machine
from helpers.procs import spawn, spinner_cmd  # noqa: F401 (fixtures)
from helpers.rm_support import as_user, start_daemon

NOBODY = 65534

# Slow per inference (length/2 builds the list in C), so its time limit comes before its inference limit.
SPIN = "spin :- repeat, length(_, 200000), fail."


@pytest.fixture(scope="module")
def daemon():
    # A directory every user may enter: one test connects as another user.
    with tempfile.TemporaryDirectory(prefix="cod-shellm-") as tmp:
        os.chmod(tmp, 0o755)
        d = start_daemon(Path(tmp), "--machine", "magnycours")
        yield d
        d.stop()


def _run_and_cancel(c: Client, canceller: Client) -> tuple[BaseException | None, float, dict]:
    """Start `spin` (10 s limit) on c in a thread, cancel it from `canceller`; what the query raised."""
    outcome: dict[str, BaseException | None] = {"err": None}

    def run() -> None:
        try:
            c.execute_query("spin", timeout_s=10)
        except BaseException as err:  # noqa: BLE001 - the test inspects it
            outcome["err"] = err

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.4)
    t0 = time.monotonic()
    reply = canceller.call("cancel", {})
    t.join(10)
    assert not t.is_alive()
    return outcome["err"], time.monotonic() - t0, reply


@pytest.mark.parametrize("direct", [True, False], ids=["direct channel", "through the daemon"])
def test_cancel_stops_the_running_query_at_once(daemon, direct):
    with Client(str(daemon.path), app="canceller") as c:
        if not direct:
            c.direct_queries = False
            c._drop_direct(c._direct)
        assert c.direct == direct
        c.add_procedure(SPIN)
        # The cancel goes on the same connection as the query (the shell's Ctrl-C).
        err, waited, reply = _run_and_cancel(c, c)
        assert isinstance(err, QueryCancelled), err
        assert err.skb_code == "cancelled" and "cancelled" in err.message
        assert reply == {"cancelled": 1}
        assert waited < 2.0, f"the query ran on for {waited:.2f} s after cancel"
        # The connection and its namespace are fine afterwards.
        assert c.execute_query("X = 1") == [{"X": 1}]


def test_cancel_stops_only_the_callers_queries(daemon):
    with Client(str(daemon.path), app="busy1") as a, Client(str(daemon.path), app="busy2") as b:
        a.add_procedure(SPIN)
        b.add_procedure(SPIN)
        errors: dict[str, BaseException | None] = {}

        def run(name: str, c: Client, timeout: float) -> None:
            try:
                c.execute_query("spin", timeout_s=timeout)
                errors[name] = None
            except BaseException as err:  # noqa: BLE001
                errors[name] = err

        tb = threading.Thread(target=run, args=("b", b, 1.5))
        tb.start()
        time.sleep(0.2)
        err, _, reply = _run_and_cancel(a, a)
        assert isinstance(err, QueryCancelled)
        tb.join(10)
        # b's query was not cancelled: it ran until its own time limit.
        assert errors["b"] is not None and errors["b"].skb_code == "timeout", errors["b"]
        # Nothing running: a cancel stops nothing and changes nothing.
        assert a.call("cancel", {}) == {"cancelled": 0}


def test_cancel_takes_no_parameters(daemon):
    with Client(str(daemon.path)) as c:
        with pytest.raises(InvalidRequest, match="unknown parameter"):
            c.call("cancel", {"id": 3})


def test_list_procedures_shows_clauses_persistence_and_fact_counts(daemon):
    with Client(str(daemon.path), app="lister") as c:
        c.add_procedure("double(X, Y) :- Y is 2 * X.\ndouble(_, 0) :- fail.")
        c.add_procedure("keep(a).", persistent=True)
        c.add_facts(["row(1)", "row(2)", "row(3)", "col(x)"])
        got = c.call("list_procedures", {})
        assert got["app"] == "lister"
        procs = {p["predicate"]: p for p in got["procedures"]}
        assert set(procs) == {"double/2", "keep/1"}
        assert len(procs["double/2"]["clauses"]) == 2
        assert procs["double/2"]["clauses"][0].startswith("double(A, B) :-")
        assert procs["double/2"]["persistent"] is False and procs["keep/1"]["persistent"] is True
        assert {f["predicate"]: f["count"] for f in got["facts"]} == {"row/1": 3, "col/1": 1}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a client as another user")
def test_list_procedures_of_another_users_app_is_refused(daemon):
    with Client(str(daemon.path), app="rootapp") as c:
        c.add_procedure("mine(1).", persistent=True)

    def peek(path):
        with Client(str(path), app="nobodyapp") as other:
            with pytest.raises(PermissionDenied, match="application namespace 'rootapp' belongs to uid 0"):
                other.call("list_procedures", {"app": "rootapp"})
            assert other.call("list_procedures", {}) == {"app": "nobodyapp", "procedures": [], "facts": []}

    assert as_user(NOBODY, peek, daemon.path) == 0


@pytest.mark.parametrize("kind,expect_in,expect_out", [
    ("system", ("get_nr_cores", 1), ("double", 2)),
    ("library", None, ("get_nr_cores", 1)),
    ("app", ("double", 2), ("get_nr_cores", 1)),
])
def test_list_predicates_by_kind(daemon, kind, expect_in, expect_out):
    with Client(str(daemon.path), app="preds") as c:
        c.add_procedure("double(X, Y) :- Y is 2 * X.")
        rows = c.call("list_predicates", {"kind": kind})["predicates"]
        names = {(r["name"], r["arity"]) for r in rows}
        assert rows and all(r["kind"] == kind for r in rows)
        if expect_in:
            assert expect_in in names
        assert expect_out not in names
        assert all(not r["name"].startswith("cod_sys_") for r in rows)


def test_list_predicates_refuses_an_unknown_kind(daemon):
    with Client(str(daemon.path)) as c:
        with pytest.raises(InvalidRequest, match="kind must be one of system, library, app, all"):
            c.call("list_predicates", {"kind": "secret"})


def test_get_topology_is_the_machine_the_daemon_allocates(daemon):
    with Client(str(daemon.path)) as c:
        topology = c.call("get_topology")
        m = Machine.from_dict(topology["machine"])
        assert len(m.cpu_ids()) == 48 and len(m.numa_nodes) == 8
        assert topology["enforcement"] == {"mode": "none", "in_force": "none"}  # planning for another machine
        assert c.execute_query("get_nr_cores(N)") == [{"N": 48}]


def test_explain_task_gives_the_binding_with_evidence(daemon, spawn):
    gib = 1 << 30
    with Client(str(daemon.path), app="explainer") as c:
        a = spawn(1)
        b = spawn(1)
        c.register_task("wide", pid=a.pid, min_cores=2, max_cores=4)
        # magnycours: 6 CPUs and 16 GiB per node; 6 GiB per CPU fits twice a node, never thrice.
        c.register_task("greedy", pid=b.pid, min_cores=1, working_set_bytes=6 * gib)
        try:
            wide = c.call("explain_task", {"task": "wide"})
            assert wide["task"] == "wide" and len(wide["cores"]) == 4
            assert wide["binding"] == ["max"]
            assert wide["constraints"] == [{"binding": "max", "kind": "max_cores", "max_cores": 4, "held": 4,
                                            "text": "holds its max_cores (4)"}]
            greedy = c.call("explain_task", {"task": "greedy"})
            assert len(greedy["cores"]) == 16
            memory = [k for k in greedy["constraints"] if k["kind"] == "memory"]
            # Every node but those where wide's CPUs leave greedy fewer than 2 is bound by memory.
            assert len(memory) >= 6, greedy
            for k in memory:
                assert k["working_set_bytes"] == 6 * gib and k["free_bytes"] == 16 * gib
                assert k["needed_bytes"] == 12 * gib
                assert k["binding"] == f"memory of node {k['node']}"
            for k in greedy["constraints"]:
                if k["kind"] == "exclusive":
                    assert k["task"] == "wide" and k["cpus"] == wide["cores"]
            assert greedy["plan"]["solver"] in ("cpsat", "greedy")
        finally:
            c.deregister_task("wide")
            c.deregister_task("greedy")


def test_explain_task_of_an_unknown_task(daemon):
    with Client(str(daemon.path)) as c:
        with pytest.raises(NotFound, match="no task named 'ghost'"):
            c.call("explain_task", {"task": "ghost"})


def test_hello_lists_the_new_methods(daemon):
    with Client(str(daemon.path)) as c:
        assert {"cancel", "list_procedures", "list_predicates", "explain_task",
                "get_topology"} <= set(c.server_info["methods"])



# ---- the evidence, as a pure function (cod.rm.reasons) ------------------------------------------
def test_constraints_records_per_binding_entry():
    from cod.facts import machines
    from cod.rm.allocator.model import TaskSpec
    from cod.rm.reasons import constraints

    m = machines.load("magnycours")  # 6 CPUs and 16 GiB per node
    gib = 1 << 30
    specs = {"a": TaskSpec("a", 2, 4, working_set_bytes=6 * gib), "b": TaskSpec("b", 1, 1)}
    cores = {"a": (6, 7), "b": (0,)}
    got = constraints("a", ["min", "exclusive neighbour b", "memory of node 1", "reserved for other.77",
                            "unavailable CPUs", "something new"],
                      specs, cores, (47,), m, {"other.77": (47,)})
    assert [g["kind"] for g in got] == ["min_cores", "exclusive", "memory", "reserved", "unavailable", "other"]
    assert got[1]["task"] == "b" and got[1]["cpus"] == [0]
    assert got[2]["needed_bytes"] == 12 * gib and got[2]["free_bytes"] == 16 * gib
    assert got[3] == {"binding": "reserved for other.77", "kind": "reserved", "pid": 77, "cpus": [47],
                      "text": "CPUs 47 are kept for unregistered busy process 77"}
    assert got[4]["cpus"] == [47] and got[5]["text"] == "something new"

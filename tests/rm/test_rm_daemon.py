"""The daemon end to end over its real socket: lifecycle, methods, events, permissions, cleanup."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from cod.protocol import jsonrpc as rpc
from helpers.rm_support import COD, NOBODY, RawConn, as_user, magny, shared_dir, start_daemon  # noqa: F401  (magny is a fixture)



# ---- lifecycle ------------------------------------------------------------------------------
def test_stale_socket_is_replaced_and_a_live_one_refused(tmp_path):
    path = tmp_path / "rm.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(path))
    stale.close()  # a socket file nobody listens on: what a crashed daemon leaves
    d = start_daemon(tmp_path, "--machine", "barcelona")
    try:
        second = subprocess.run(COD + ["rm", "--socket", str(path), "--machine", "barcelona"],
                                capture_output=True, text=True, timeout=30)
        assert second.returncode != 0
        assert "already serving" in second.stderr and str(path) in second.stderr
        assert second.stderr.count("\n") == 1  # one line, no traceback
        c = RawConn(path)
        assert c.hello()["machine"] == "barcelona"  # the first daemon still serves
        c.close()
    finally:
        d.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_cleanly_tells_clients_and_removes_the_socket(tmp_path, sig):
    d = start_daemon(tmp_path, "--machine", "shanghai")
    c = RawConn(d.path)
    c.hello()
    assert d.stop(sig) == 0
    assert c.recv() == {"jsonrpc": "2.0", "method": "shutdown", "params": {"event": "shutdown",
                                                                           "reason": signal.Signals(sig).name}}
    assert c.recv() is None
    assert not d.path.exists()


def test_a_signal_during_the_start_stops_the_daemon_cleanly_once_started(tmp_path):
    """The handlers were installed after the start: a SIGTERM while the engine started (or just after
    the socket began to accept) killed the daemon by the default action (-15), closing nothing."""
    log = tmp_path / "rm.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(COD + ["rm", "--socket", str(tmp_path / "rm.sock"), "--machine", "shanghai"],
                                stdout=out, stderr=out)
    try:
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
        deadline = time.monotonic() + 60.0
        while not children.read_text().split():  # the SKB engine is being started: the daemon is in start()
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "SIGTERM: shutting down" in log.read_text() and not (tmp_path / "rm.sock").exists()


def test_unknown_machine_is_a_one_line_error(tmp_path):
    r = subprocess.run(COD + ["rm", "--socket", str(tmp_path / "s"), "--machine", "vax"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "unknown machine 'vax'" in r.stderr and "Traceback" not in r.stderr


# ---- session --------------------------------------------------------------------------------
def test_hello_comes_first_and_is_versioned(magny):
    c = RawConn(magny.path)
    r = c.call("list_tasks")
    assert r["error"]["code"] == rpc.HELLO_REQUIRED
    r = c.call("hello", {"version": 99})
    assert r["error"]["code"] == rpc.UNSUPPORTED_VERSION and r["error"]["data"]["supported"] == [1]
    info = c.hello("cscs")
    assert info["protocol"] == 1 and info["machine"] == "magnycours" and info["enforce"] is False
    assert info["peer"]["pid"] == os.getpid()
    assert {"register_task", "subscribe", "ack_allocation", "execute_query"} <= set(info["methods"])


# ---- tasks and allocation -------------------------------------------------------------------
def test_registration_allocates_and_writes_the_skb(magny):
    c = RawConn(magny.path)
    c.hello("cscs")
    r = c.call("register_task", {"name": "cscs", "properties": {"min_cores": 2, "max_cores": 6,
                                                                "sensitive": ["numa"]}})["result"]
    alloc = r["allocation"]
    assert len(alloc["cores"]) == 6 and alloc["epoch"] >= 1
    upcall = c.recv()  # the task's own allocation upcall, sent before the reply
    assert upcall["method"] == "allocation_changed" and upcall["params"]["cores"] == alloc["cores"]
    assert upcall["params"]["added"] == alloc["cores"] and upcall["params"]["subscription"] == r["subscription"]
    sols = c.call("execute_query", {"goal": "findall(C, allocated(cscs, C), Cs), allocation_epoch(E)"})
    sol = sols["result"]["solutions"][0]
    assert sorted(sol["Cs"]) == alloc["cores"] and sol["E"] == alloc["epoch"]
    props = c.call("execute_query", {"goal": "task_property(cscs, max_cores, M), task(cscs, P, A)"})
    assert props["result"]["solutions"] == [{"M": 6, "P": os.getpid(), "A": "cscs"}]
    again = c.call("request_allocation")["result"]
    assert again["cores"] == alloc["cores"] and again["numa_nodes"] == alloc["numa_nodes"]


@pytest.mark.parametrize("machine, first, second, free", [("magnycours", 40, 10, 8), ("shanghai", 16, 1, 0),
                                                          ("nehalem-ex", 30, 3, 2)])
def test_admission_refuses_what_cannot_be_met_and_says_how_much_is_free(tmp_path, machine, first, second, free):
    d = start_daemon(tmp_path, "--machine", machine)
    try:
        c = RawConn(d.path)
        c.hello()
        assert "result" in c.call("register_task", {"name": "big", "properties": {"min_cores": first}})
        r = c.call("register_task", {"name": "late", "properties": {"min_cores": second}})
        assert r["error"]["code"] == rpc.ADMISSION_REFUSED
        assert r["error"]["data"]["requested"] == second and r["error"]["data"]["free"] == free
        assert f"at least {second} cores" in r["error"]["message"]
        tasks = c.call("list_tasks")["result"]["tasks"]
        assert [t["task"] for t in tasks] == ["big"]
        # Raising a registered task's minimum past the machine is refused the same way.
        r = c.call("update_task", {"task": "big", "properties": {"min_cores": 1000, "max_cores": 1000}})
        assert r["error"]["code"] == rpc.ADMISSION_REFUSED
    finally:
        d.stop()


@pytest.mark.parametrize("props, needle", [({"min_cores": 0}, "min_cores"), ({"bound": "gpu"}, "bound"),
                                           ({"sensitive": "numa"}, "sensitive"), ({"colour": 1}, "colour"),
                                           ({"min_cores": 4, "max_cores": 2}, "max_cores")])
def test_bad_task_properties_are_named(magny, props, needle):
    c = RawConn(magny.path)
    c.hello()
    r = c.call("register_task", {"name": "t", "properties": props})
    assert r["error"]["code"] == rpc.INVALID_PARAMS and needle in r["error"]["message"]


def test_a_departing_client_loses_its_tasks_and_facts_and_the_others_are_told(magny):
    a, b = RawConn(magny.path), RawConn(magny.path)
    a.hello("dba")
    b.hello("dbb")
    b.call("add_facts", {"facts": ["keep(1)"]})
    assert "result" in b.call("register_task", {"name": "tb", "properties": {"max_cores": 40}})
    b.recv()  # tb's first allocation
    sid = b.call("subscribe", {"event": "task_left"})["result"]["subscription"]
    assert "result" in a.call("register_task", {"name": "ta", "properties": {"min_cores": 20}})
    a.call("add_facts", {"facts": ["mine(1)"]})
    shrink = b.recv()["params"]  # tb gives cores to ta
    assert shrink["removed"] and shrink["deadline_s"] > 0
    b.call("ack_allocation", {"epoch": shrink["epoch"]})
    a.close()
    left = b.recv()
    assert left["method"] == "task_left" and left["params"]["task"] == "ta"
    assert left["params"]["subscription"] == sid and left["params"]["reason"] == "client disconnected"
    grow = b.recv()["params"]
    assert len(grow["cores"]) == 40 and set(shrink["removed"]) <= set(grow["added"])
    assert b.call("execute_query", {"goal": "keep(X)"})["result"]["solutions"] == [{"X": 1}]
    assert [t["task"] for t in b.call("list_tasks")["result"]["tasks"]] == ["tb"]
    a2 = RawConn(magny.path)
    a2.hello("dba")  # the same application again: its old facts went with its connection
    r = a2.call("execute_query", {"goal": "mine(X)"})
    assert r.get("result", {}).get("solutions", []) == [] or r["error"]["data"]["skb_code"] == "existence"


def test_persistent_facts_outlive_the_connection(magny):
    a = RawConn(magny.path)
    a.hello("keeper")
    a.call("add_facts", {"facts": ["kept(1)"], "persistent": True})
    a.call("add_facts", {"facts": ["dropped(1)"]})
    a.close()
    time.sleep(0.2)
    b = RawConn(magny.path)
    b.hello("keeper")
    assert b.call("execute_query", {"goal": "kept(X)"})["result"]["solutions"] == [{"X": 1}]
    r = b.call("execute_query", {"goal": "dropped(X)"})
    assert r.get("result", {}).get("solutions", []) == [] or r["error"]["data"]["skb_code"] == "existence"


def test_facts_changed_is_filtered_by_predicate(magny):
    c = RawConn(magny.path)
    c.hello("app")
    sid = c.call("subscribe", {"event": "facts_changed", "filter": {"predicate": "db_rtime"}})["result"]["subscription"]
    c.call("add_facts", {"facts": ["db_ntuple(5)"]})
    c.call("add_facts", {"facts": ["db_rtime(2000)", "db_tsize(3)"]})
    ev = c.recv()
    assert ev["method"] == "facts_changed" and ev["params"]["subscription"] == sid
    assert ev["params"]["predicates"] == ["db_rtime", "db_tsize"] and ev["params"]["op"] == "add"
    assert c.call("unsubscribe", {"subscription": sid})["result"] == {"subscription": sid}
    assert c.call("unsubscribe", {"subscription": sid})["error"]["code"] == rpc.NOT_FOUND


def test_subscribe_refuses_unknown_events_and_filter_keys(magny):
    c = RawConn(magny.path)
    c.hello()
    assert c.call("subscribe", {"event": "weather"})["error"]["code"] == rpc.INVALID_PARAMS
    r = c.call("subscribe", {"event": "task_left", "filter": {"colour": "red"}})
    assert r["error"]["code"] == rpc.INVALID_PARAMS and "colour" in r["error"]["message"]


# ---- revocation -----------------------------------------------------------------------------
# Long enough that the checks between the take and the ack finish well inside it on a loaded
# machine (with 0.5 s the SKB query below sometimes ran after the deadline had moved the cores).
REVOKE_DEADLINE_S = 4.0


@pytest.mark.parametrize("acknowledge", [True, False])
def test_taken_cores_move_on_ack_or_at_the_deadline(tmp_path, acknowledge):
    magny = start_daemon(tmp_path, "--machine", "magnycours", "--revoke-deadline", str(REVOKE_DEADLINE_S))
    try:
        a, b = RawConn(magny.path), RawConn(magny.path)
        a.hello("olda")
        b.hello("newb")
        a.call("register_task", {"name": "holder", "properties": {"min_cores": 1}})  # max: whole machine
        assert len(a.recv()["params"]["cores"]) == 48
        t0 = time.monotonic()
        r = b.call("register_task", {"name": "newcomer", "properties": {"min_cores": 8, "max_cores": 8}})["result"]
        # The newcomer gets nothing the holder has not given back yet.
        assert r["allocation"]["cores"] == []
        take = a.recv()["params"]
        assert len(take["removed"]) == 8 and len(take["cores"]) == 40
        assert 0 < take["deadline_s"] <= REVOKE_DEADLINE_S
        facts = b.call("execute_query", {"goal": "findall(C, allocated(holder, C), L)"})["result"]["solutions"][0]
        assert time.monotonic() - t0 < REVOKE_DEADLINE_S, "the checks took longer than the deadline"
        assert len(facts["L"]) == 48  # the holder still runs there until it lets go
        if acknowledge:
            assert sorted(a.call("ack_allocation", {"epoch": take["epoch"]})["result"]["released"]) == take["removed"]
        give = None
        while give is None or not give["params"].get("cores"):
            give = b.recv()
        waited = time.monotonic() - t0
        assert give["params"]["cores"] == take["removed"] and give["params"]["epoch"] > take["epoch"]
        if acknowledge:  # the ack moved them, not the deadline
            assert waited < REVOKE_DEADLINE_S and "deadline" not in give["params"]["reason"]
        else:
            assert waited >= REVOKE_DEADLINE_S * 0.9 and "deadline" in give["params"]["reason"]
    finally:
        magny.stop()


# ---- permissions ----------------------------------------------------------------------------
def _unprivileged_client(path):
    c = RawConn(path)
    info = c.hello("nobodyapp")
    assert info["privileged"] is False and info["peer"]["uid"] == NOBODY
    r = c.call("register_task", {"name": "steal", "pid": 1})
    assert r["error"]["code"] == rpc.PERMISSION_DENIED and "belongs to uid 0" in r["error"]["message"], r
    r = c.call("add_facts", {"facts": ["other_task(1, x, [0])"], "scope": "system"})
    assert r["error"]["code"] == rpc.PERMISSION_DENIED, r
    r = c.call("update_task", {"task": "roots", "properties": {"max_cores": 1}})
    assert r["error"]["code"] == rpc.PERMISSION_DENIED, r
    r = c.call("register_task", {"name": "mine", "properties": {"max_cores": 2}})
    assert "result" in r and r["result"]["pid"] == os.getpid(), r
    c2 = RawConn(path)
    r = c2.call("hello", {"version": 1, "app": "rootapp"})
    assert r["error"]["code"] == rpc.PERMISSION_DENIED, r  # another user's namespace


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_peer_credentials_limit_what_a_client_may_do():
    # pytest's tmp_path is private to root: the other user needs a directory it can enter.
    with shared_dir("cod-rm-test-") as tmp:
        d = start_daemon(tmp, "--machine", "magnycours")
        try:
            root = RawConn(d.path)
            root.hello("rootapp")
            assert "result" in root.call("register_task", {"name": "roots", "properties": {"max_cores": 4}})
            assert as_user(NOBODY, _unprivileged_client, d.path) == 0
            r = root.call("add_facts", {"facts": ["other_task(1, x, [0])"], "scope": "system"})
            assert r["result"]["added"] == 1
        finally:
            d.stop()


# ---- batching -------------------------------------------------------------------------------
def test_batch_runs_in_order_and_stops_at_the_first_error(magny):
    c = RawConn(magny.path)
    c.hello()
    r = c.call("batch", {"calls": [
        {"method": "add_facts", "params": {"facts": ["n(1)", "n(2)"]}},
        {"method": "execute_query", "params": {"goal": "findall(X, n(X), L)"}},
        {"method": "execute_query", "params": {"goal": "foo("}},
        {"method": "add_facts", "params": {"facts": ["n(3)"]}},
    ]})["result"]["results"]
    assert r[0] == {"result": {"added": 2}}
    assert r[1]["result"]["solutions"][0]["L"] == [1, 2]
    assert r[2]["error"]["code"] == -32040 and len(r) == 3


@pytest.mark.parametrize("interval, runs", [(None, 0), ("0.2", 3)])
def test_recompute_interval_s_recomputes_without_a_change(tmp_path, interval, runs):
    extra = ["--set", f"recompute_interval_s={interval}"] if interval else []
    d = start_daemon(tmp_path, "--machine", "magnycours", "--log-level", "debug", *extra)
    try:
        c = RawConn(d.path)
        c.hello("periodic")
        assert "result" in c.call("register_task", {"name": "t", "pid": os.getpid(), "properties": {"min_cores": 2}})
        time.sleep(1.2)  # nothing changes meanwhile
        periodic = d.log_text().count("recomputing the allocation: periodic recomputation")
        assert periodic >= runs if runs else periodic == 0, periodic
        assert c.call("get_allocation", {"task": "t"})["result"]["cores"]  # the task keeps being served
    finally:
        d.stop()

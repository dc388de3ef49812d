"""Regression tests of what a local attacker could do through the daemon's socket (issue "Security
first"): each item is refused with a clear error, bounded, or undone, and everyone else is served."""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from cod.client import Client, QuotaExceeded
from cod.protocol import jsonrpc as rpc
from helpers.rm_support import NOBODY, RawConn, as_user, shared_dir, start_daemon

ROOT = os.geteuid() == 0


def daemon(tmp_path: Path, *settings: str, machine: str = "magnycours"):
    args = ["--machine", machine]
    for s in settings:
        args += ["--set", s]
    return start_daemon(tmp_path, *args)


@pytest.fixture
def open_daemon():
    """A daemon in a directory every user may enter (the socket is 0666, as by default)."""
    with shared_dir("cod-sec-") as tmp:
        started = []

        def start(*settings: str, machine: str = "magnycours"):
            d = daemon(tmp, *settings, machine=machine)
            started.append(d)
            return d

        yield start
        for d in started:
            d.stop()


def engine_pid(d) -> int:
    children = Path(f"/proc/{d.proc.pid}/task/{d.proc.pid}/children").read_text().split()
    return int(children[0])


# ---- item 4: quotas, and all-or-nothing ---------------------------------------------------------
def test_fact_and_procedure_quotas_refuse_with_a_clear_error_and_change_nothing(tmp_path):
    d = daemon(tmp_path, "app_max_facts=50", "app_max_fact_bytes=4000", "app_max_clauses=3")
    try:
        with Client(str(d.path), app="greedy") as c:
            c.add_facts([f"f({i})" for i in range(40)])
            with pytest.raises(QuotaExceeded) as err:
                c.add_facts([f"g({i})" for i in range(20)])  # 60 facts > 50: refused whole
            assert "quota exceeded" in err.value.message and "50" in err.value.message
            assert c.execute_query("aggregate_all(count, f(_), N)") == [{"N": 40}]
            with pytest.raises(QuotaExceeded):
                c.add_facts(["big('" + "x" * 5000 + "')"])
            c.add_procedure("p(1). p(2).")
            with pytest.raises(QuotaExceeded):
                c.add_procedure("q(1). q(2).")  # 4 clauses > 3
            assert c.execute_query("p(X)") == [{"X": 1}, {"X": 2}]
            # Other applications are not affected by one application's quota.
            with Client(str(d.path), app="modest") as other:
                assert other.add_facts(["m(1)"]) == 1
    finally:
        d.stop()


@pytest.mark.skipif(not ROOT, reason="needs root to become another user")
def test_quotas_hold_per_uid_over_all_its_applications(open_daemon):
    d = open_daemon("uid_max_facts=30")

    def fill(path):
        with Client(str(path), app="one") as a, Client(str(path), app="two") as b:
            a.add_facts([f"a({i})" for i in range(20)])
            try:
                b.add_facts([f"b({i})" for i in range(20)])
            except QuotaExceeded:
                return
            raise AssertionError("the uid's quota was passed")

    assert as_user(NOBODY, fill, d.path) == 0


# ---- item 5: an oversized answer -----------------------------------------------------------------
def test_an_answer_too_large_is_an_error_for_its_caller_only(tmp_path):
    d = daemon(tmp_path)
    try:
        with Client(str(d.path), app="big") as c, Client(str(d.path), app="calm") as other:
            for direct in (True, False):
                c.direct_queries = direct
                if not direct and c._direct is not None:
                    c._drop_direct(c._direct)
                with pytest.raises(Exception) as err:
                    # 64 MB of answer, made quickly (doubling), well within the time limit.
                    c.execute_query("format(atom(K0), '~*c', [1000, 0'x]), atom_concat(K0, K0, K1), atom_concat(K1, K1, K2), atom_concat(K2, K2, K3), atom_concat(K3, K3, K4), atom_concat(K4, K4, K5), atom_concat(K5, K5, K6), atom_concat(K6, K6, K7), atom_concat(K7, K7, K8), atom_concat(K8, K8, K9), atom_concat(K9, K9, K10), A0 = K10, atom_concat(A0, A0, A1), atom_concat(A1, A1, A2), atom_concat(A2, A2, A3), atom_concat(A3, A3, A4), atom_concat(A4, A4, A5), atom_concat(A5, A5, A6), A = A6")
                assert "too large" in str(err.value) or "resource" in str(err.value), err.value
                assert "xxxxxxxx" not in str(err.value)
                assert other.execute_query("get_nr_cores(N)") == [{"N": 48}]
                assert c.execute_query("X = 1") == [{"X": 1}]
    finally:
        d.stop()


# ---- item 6: no restart at will ------------------------------------------------------------------
@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -1.0, 0.0])
def test_bad_time_limits_are_refused(tmp_path, timeout):
    d = daemon(tmp_path)
    try:
        c = RawConn(d.path)
        c.hello("t")
        # NaN and infinities are not JSON: a client writing them sends these tokens anyway.
        body = json.dumps({"jsonrpc": "2.0", "id": 5, "method": "execute_query",
                           "params": {"goal": "X = 1", "timeout_s": timeout}}).encode()
        c.sock.sendall(struct.pack(">I", len(body)) + body)
        r = c.recv()
        assert r["error"]["code"] == rpc.INVALID_PARAMS and "finite positive" in r["error"]["message"], r
    finally:
        d.stop()


def test_abort_and_uncatchable_limits_do_not_restart_the_engine(tmp_path):
    d = daemon(tmp_path)
    try:
        pid = engine_pid(d)
        with Client(str(d.path), app="attacker") as c:
            for goal in ("abort", "catch(sleep(100), _, sleep(100))", "catch(sleep(100), E, true)"):
                with pytest.raises(Exception) as err:
                    c.execute_query(goal, timeout_s=1)
                assert "unsafe" in str(err.value).lower() or "not allowed" in str(err.value), err.value
            t0 = time.monotonic()
            with pytest.raises(Exception) as err:
                c.execute_query("catch(sleep(100), error(_, _), sleep(100))", timeout_s=0.5)
            assert "time limit" in str(err.value)
            assert time.monotonic() - t0 < 3
        assert engine_pid(d) == pid
    finally:
        d.stop()


# ---- item 7: one application cannot monopolise the engine ----------------------------------------
def test_runaway_queries_of_one_application_do_not_make_another_wait(tmp_path):
    d = daemon(tmp_path)
    try:
        stop = threading.Event()

        def hog():
            with Client(str(d.path), app="hog") as h:
                while not stop.is_set():
                    try:
                        h.execute_query("repeat, fail", timeout_s=5)
                    except Exception:
                        pass

        hogs = [threading.Thread(target=hog, daemon=True) for _ in range(4)]
        for t in hogs:
            t.start()
        time.sleep(1.0)  # four runaway queries hold the hog's slots
        with Client(str(d.path), app="victim") as v:
            times = []
            for _ in range(20):
                t0 = time.monotonic()
                assert v.execute_query("get_nr_cores(N)") == [{"N": 48}]
                times.append(time.monotonic() - t0)
        stop.set()
        assert max(times) < 1.0, times  # today: 19-20 s
    finally:
        d.stop()


# ---- item 8: connection exhaustion ---------------------------------------------------------------
def test_a_connection_without_hello_is_closed_after_the_deadline(tmp_path):
    d = daemon(tmp_path, "hello_timeout_s=0.5")
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(str(d.path))
        s.settimeout(5)
        t0 = time.monotonic()
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        assert 0.4 < time.monotonic() - t0 < 3
        assert b"no hello within" in data
    finally:
        d.stop()


def test_a_slow_writer_is_cut_off(tmp_path):
    d = daemon(tmp_path, "frame_timeout_s=0.5")
    try:
        c = RawConn(d.path)
        c.hello("slow")
        c.sock.sendall(struct.pack(">I", 100) + b"{")  # a frame begun, then 1 byte and silence
        r = c.recv()
        assert r["error"]["code"] == rpc.TIMED_OUT and "not completed" in r["error"]["message"]
        assert c.recv() is None
    finally:
        d.stop()


@pytest.mark.skipif(not ROOT, reason="needs root to become another user")
def test_a_uid_cannot_lock_out_root(open_daemon):
    d = open_daemon("max_connections_per_uid=20", "max_connections=40", "reserved_privileged_connections=10",
                    "hello_timeout_s=30")
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the attacker: as many silent connections as it can get, held open
        code = 1
        try:
            os.close(ready_r)
            os.close(done_w)
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            held, accepted = [], 0
            for _ in range(60):
                s = socket.socket(socket.AF_UNIX)
                s.connect(str(d.path))
                s.settimeout(0.2)
                held.append(s)
                try:
                    refused = bool(s.recv(4096))
                except socket.timeout:
                    refused = False
                accepted += not refused
            os.write(ready_w, str(accepted).encode())
            os.read(done_r, 1)  # hold them until root has connected
            code = 0
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(done_r)
    accepted = int(os.read(ready_r, 16))
    assert accepted == 20  # its per-uid cap; the others were refused at once
    c = RawConn(d.path)
    assert c.hello("rootapp")["privileged"] is True
    os.write(done_w, b"x")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


# ---- item 10: squatting --------------------------------------------------------------------------
@pytest.mark.skipif(not ROOT, reason="needs root to become another user")
def test_names_and_reservations_of_an_unprivileged_uid_are_bounded(open_daemon):
    d = open_daemon("unprivileged_max_cores=8")

    def squat(path):
        c = RawConn(path)
        info = c.hello("cscs")
        assert info["privileged"] is False
        r = c.call("add_facts", {"facts": ["mine(1)"], "persistent": True})
        assert "result" in r, r
        c2 = RawConn(path)
        r = c2.call("hello", {"version": 1, "app": "uid0.pid1"})  # another uid's default name
        assert r["error"]["code"] == rpc.PERMISSION_DENIED and "reserved for uid 0" in r["error"]["message"], r
        for props, needle in [({"min_cores": 48}, "at most 8"), ({"priority": 10 ** 30}, "outside"),
                              ({"priority": 50}, "unprivileged")]:
            r = c.call("register_task", {"name": "big", "properties": props})
            assert r["error"]["code"] in (rpc.PERMISSION_DENIED, rpc.INVALID_PARAMS), r
            assert needle in r["error"]["message"], r
        r = c.call("register_task", {"name": "fair", "properties": {"min_cores": 8, "priority": 0}})
        assert "result" in r, r

    assert as_user(NOBODY, squat, d.path) == 0
    root = RawConn(d.path)
    r = root.call("hello", {"version": 1, "app": "cscs"})
    assert "result" in r  # root may always use a name (it administers them)
    # The name is held by nobody's persistent fact; it is released with that state.
    r = root.call("remove_facts", {"patterns": ["mine(_)"]})
    assert r["result"]["removed"] == 1


# ---- item 11: a leaving connection removes exactly its own facts ---------------------------------
def test_a_leaving_connection_removes_exactly_what_it_added(tmp_path):
    d = daemon(tmp_path)
    try:
        with Client(str(d.path), app="shared") as a:
            a.add_facts(["cfg(1)", "cfg(2)"])
            with Client(str(d.path), app="shared") as b:
                b.add_facts(["cfg(3)", "cfg(1)"])  # cfg(1) is now held by both
                with pytest.raises(Exception) as err:
                    b.add_facts(["cfg(_)"])
                assert "ground" in str(err.value)
            # B's cleanup runs when the daemon sees it leave.
            deadline = time.monotonic() + 5
            while sorted(s["X"] for s in a.execute_query("cfg(X)")) != [1, 2]:
                assert time.monotonic() < deadline, a.execute_query("cfg(X)")
                time.sleep(0.02)
    finally:
        d.stop()


# ---- item 13: unhandled paths --------------------------------------------------------------------
def test_json_nested_too_deep_gets_a_parse_error_reply(tmp_path):
    d = daemon(tmp_path)
    try:
        c = RawConn(d.path)
        c.hello("deep")
        body = (b'{"jsonrpc":"2.0","id":1,"method":"execute_query","params":{"goal":' + b"[" * 1000
                + b"]" * 1000 + b"}}")
        c.sock.sendall(struct.pack(">I", len(body)) + body)
        r = c.recv()
        assert r["error"]["code"] == rpc.PARSE_ERROR and "deeper" in r["error"]["message"], r
        assert "result" in c.call("list_tasks")
    finally:
        d.stop()


@pytest.mark.parametrize("goal, needle", [
    ("length(O, 10000), maplist(=(0'[), O), length(C, 10000), maplist(=(0']), C), append(O, [0'x|C], Cs), "
     "atom_codes(S, Cs), term_to_atom(T, S)", "nested"),
    ("X is 7 ** 20000", None),
])
def test_awkward_answers_are_delivered_or_refused_cleanly(tmp_path, goal, needle):
    d = daemon(tmp_path)
    try:
        with Client(str(d.path), app="odd") as c:
            for direct in (True, False):
                if not direct and c._direct is not None:
                    c._drop_direct(c._direct)
                c.direct_queries = direct
                if needle is None:
                    [answer] = c.execute_query(goal)
                    assert answer["X"] == 7 ** 20000
                else:
                    with pytest.raises(Exception) as err:
                        c.execute_query(goal)
                    assert needle in str(err.value) and "-32603" not in str(err.value), err.value
    finally:
        d.stop()


def test_an_unpaired_surrogate_is_an_invalid_request(tmp_path):
    d = daemon(tmp_path)
    try:
        c = RawConn(d.path)
        c.hello("sur")
        body = b'{"jsonrpc":"2.0","id":3,"method":"execute_query","params":{"goal":"X = \'\\ud800\'"}}'
        c.sock.sendall(struct.pack(">I", len(body)) + body)
        r = c.recv()
        assert r["error"]["code"] == rpc.INVALID_REQUEST and "surrogate" in r["error"]["message"], r
        assert r["id"] == 3
    finally:
        d.stop()


def test_a_batch_is_bounded_before_it_acts(tmp_path):
    d = daemon(tmp_path, "max_batch_calls=10")
    try:
        c = RawConn(d.path)
        c.hello("batcher")
        calls = [{"method": "subscribe", "params": {"event": "task_left"}} for _ in range(11)]
        r = c.call("batch", {"calls": calls})
        assert r["error"]["code"] == rpc.INVALID_PARAMS and "at most 10" in r["error"]["message"]
        r = c.call("batch", {"calls": calls[:10]})
        assert len(r["result"]["results"]) == 10
        subs = [x["result"]["subscription"] for x in r["result"]["results"]]
        assert len(set(subs)) == 10  # only the accepted batch acted
    finally:
        d.stop()


def test_subscriptions_per_connection_are_bounded(tmp_path):
    d = daemon(tmp_path, "max_subscriptions_per_connection=5")
    try:
        c = RawConn(d.path)
        c.hello("subs")
        for _ in range(5):
            assert "result" in c.call("subscribe", {"event": "task_left"})
        r = c.call("subscribe", {"event": "task_left"})
        assert r["error"]["code"] == rpc.QUOTA_EXCEEDED
    finally:
        d.stop()

"""Queries in one hop (issue "The SKB as a concurrent server"): the direct channel to the SKB server
and the path through the daemon answer every case alike, capabilities end with their connection,
and readers never see half a write."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from cod.client import Client, CodError, KnowledgeBaseError, PermissionDenied
from helpers.procs import spawn, spinner_cmd  # noqa: F401 (fixtures)
from helpers.rm_support import start_daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = start_daemon(tmp_path_factory.mktemp("direct"), "--machine", "magnycours")
    with Client(str(d.path), app="victim") as v:
        v.add_facts(["secret(hunter2)"], persistent=True)
    yield d
    d.stop()


def client(d, direct: bool, app: str = "paths") -> Client:
    c = Client(str(d.path), app=app)
    if not direct:
        c.direct_queries = False
        if c._direct is not None:
            c._drop_direct(c._direct)
    assert c.direct == direct, "the daemon offers the direct channel"
    return c


# (goal, extra params, expected solutions or (error class, skb_code, text in the message))
CASES = [
    ("get_nr_cores(N)", {}, [{"N": 48}]),
    ("X = \"a string\", Y = 'an atom', Z = f(1, [2])", {},
     [{"X": "a string", "Y": "an atom", "Z": {"functor": "f", "args": [1, [2]]}}]),
    ("between(1, 100, X)", {"max_solutions": 3}, [{"X": 1}, {"X": 2}, {"X": 3}]),
    ("member(X, [a, b])", {"all_solutions": False}, [{"X": "a"}]),
    ("fail", {}, []),
    ("secret(S)", {}, (KnowledgeBaseError, "existence", "unknown procedure secret/1")),
    ("app_victim:secret(S)", {}, (KnowledgeBaseError, "unsafe", "module-qualified")),
    ("G =.. [(:), app_victim, secret(S)], clause(G, true)", {}, (KnowledgeBaseError, "unsafe", "clause/2")),
    ("shell(ls)", {}, (KnowledgeBaseError, "unsafe", "shell")),
    ("use_module('dev/shm/x')", {}, (KnowledgeBaseError, "unsafe", "load files")),
    ("set_prolog_flag(prefer_rationals, true)", {}, (KnowledgeBaseError, "unsafe", "set_prolog_flag/2")),
    ("X = ", {}, (KnowledgeBaseError, "syntax_error", "syntax error")),
    ("repeat, sleep(0.01), fail", {"timeout_s": 0.3}, (KnowledgeBaseError, "timeout", "time limit")),
    ("repeat, fail", {}, (KnowledgeBaseError, "resource", "inference limit")),
    ("numlist(1, 300000, L)", {}, (KnowledgeBaseError, "resource", "too large")),  # over the 1 MB frame
]


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "through-rm"])
@pytest.mark.parametrize("goal, params, expected", CASES, ids=[c[0][:40] for c in CASES])
def test_both_paths_answer_alike(daemon, direct, goal, params, expected):
    with client(daemon, direct) as c:
        if isinstance(expected, list):
            assert c.execute_query(goal, **params) == expected
        else:
            cls, code, text = expected
            with pytest.raises(cls) as err:
                c.execute_query(goal, **params)
            assert err.value.skb_code == code and text in err.value.message, err.value
        assert c.direct == direct  # an error on the direct channel does not drop it


def raw_direct(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.settimeout(5)
    return s


def rpc(s: socket.socket, method: str, params: dict, rid: int = 1) -> dict:
    body = json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode()
    s.sendall(struct.pack(">I", len(body)) + body)
    (n,) = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))
    return json.loads(s.recv(n, socket.MSG_WAITALL))


def test_a_capability_ends_with_its_connection_to_the_rm(daemon):
    c = client(daemon, True, app="captain")
    offer = c.server_info["skb"]
    s = raw_direct(offer["socket"])
    assert rpc(s, "hello", {"version": 1, "token": offer["token"]})["result"]["app"] == "captain"
    assert rpc(s, "execute_query", {"goal": "X = 1"}, 2)["result"]["solutions"] == [{"X": 1}]
    c.close()
    deadline = time.monotonic() + 5
    while True:  # the daemon revokes it when it sees the connection go
        try:
            r = rpc(s, "execute_query", {"goal": "X = 1"}, 3)
        except (ConnectionError, OSError, struct.error):
            break  # closed by the SKB: as good as refused
        if "error" in r:
            assert r["error"]["code"] == -32010, r
            break
        assert time.monotonic() < deadline, "the capability outlived its connection"
        time.sleep(0.05)
    # Reused later on a new connection: refused.
    s2 = raw_direct(offer["socket"])
    r = rpc(s2, "hello", {"version": 1, "token": offer["token"]})
    assert r["error"]["code"] == -32010 and "not valid" in r["error"]["message"]


def test_a_revocation_ends_a_connection_waiting_inside_a_frame(daemon):
    """The engine's thread waits in the frame reader (C, cod_frames.c) for the rest of a frame: the
    revocation still reaches it there, and the connection closes long before frame_timeout (10 s)."""
    c = client(daemon, True, app="midframe")
    offer = c.server_info["skb"]
    s = raw_direct(offer["socket"])
    assert "result" in rpc(s, "hello", {"version": 1, "token": offer["token"]})
    s.sendall(struct.pack(">I", 100) + b'{"jsonrpc"')  # 10 of the 100 bytes announced
    time.sleep(0.3)
    t0 = time.monotonic()
    c.close()
    s.settimeout(9)
    assert s.recv(4096) == b""  # closed by the SKB, with nothing sent
    assert time.monotonic() - t0 < 5


def test_a_forged_capability_is_refused(daemon):
    with client(daemon, True) as c:
        s = raw_direct(c.server_info["skb"]["socket"])
        for token in ("0" * 32, c.server_info["skb"]["token"][:-1] + "x", "", 7):
            r = rpc(s, "hello", {"version": 1, "token": token})
            assert r["error"]["code"] == -32010, r
        r = rpc(s, "execute_query", {"goal": "X = 1"})
        assert r["error"]["code"] == -32000  # still no hello


def rpc_text(s: socket.socket, text: str) -> dict:
    body = text.encode()
    s.sendall(struct.pack(">I", len(body)) + body)
    (n,) = struct.unpack(">I", s.recv(4, socket.MSG_WAITALL))
    return json.loads(s.recv(n, socket.MSG_WAITALL))


QUERY = '{"jsonrpc":"2.0","id":2,"method":"execute_query","params":{"goal":%s}}'


# Request texts the engine's C frame reader takes itself, and texts it leaves to library(http/json)
# (skb/prolog/cod_frames.pl): each answered as before, and an escaped surrogate pair read as JSON says.
@pytest.mark.parametrize("text, expected", [
    (QUERY % json.dumps("atom_length('\u00e9\U0001F600', N)", ensure_ascii=False), {"N": 2}),  # raw UTF-8
    (QUERY % json.dumps("atom_length('\u00e9\U0001F600', N)"), {"N": 2}),  # a surrogate pair escaped
    (QUERY % json.dumps('X = "a\\\\b\\n\\"\\u00e9"'), {"X": 'a\\b\n"\u00e9'}),  # escapes
    ('{"jsonrpc":"2.0","id":2,"method":"execute_query","params":{"goal":"X = 1","goal":"X = 2"}}',
     -32700),  # a duplicate key: refused by the library, as before
    ('{"jsonrpc":"2.0","id":2,"method":"execute_query","params":{"goal":"X = 1"}} {}',
     {"X": 1}),  # trailing text: the library reads the first value, as before
], ids=["utf8", "surrogate-escape", "escapes", "duplicate-key", "trailing-text"])
def test_frames_the_c_reader_takes_or_leaves_are_answered_alike(daemon, text, expected):
    with client(daemon, True) as c:
        s = raw_direct(c.server_info["skb"]["socket"])
        assert "result" in rpc(s, "hello", {"version": 1, "token": c.server_info["skb"]["token"]})
        r = rpc_text(s, text)
        if isinstance(expected, int):
            assert r["error"]["code"] == expected, r
        else:
            assert r["result"]["solutions"] == [expected], r
        assert rpc(s, "ping", {}, 3)["result"] == "pong"  # the connection goes on


def test_a_direct_query_waits_no_longer_than_the_call_timeout(daemon):
    # The direct socket blocks under the kernel's timeouts (clients/python/direct.py): an answer
    # that comes after call_timeout_s is not waited for, on the direct channel or on the road
    # through the daemon taken after it; and a later, longer timeout is the one that holds.
    with Client(str(daemon.path), app="patient", call_timeout_s=0.5) as c:
        assert c.direct
        t0 = time.monotonic()
        with pytest.raises(CodError) as err:
            c.execute_query("sleep(2), X = 1")
        took = time.monotonic() - t0
        assert 0.45 < took < 1.8, (took, err.value)
        c.call_timeout_s = 10.0
        time.sleep(0.5)  # the direct channel is tried again 0.5 s after it was dropped
        assert c.direct
        assert c.execute_query("sleep(0.8), X = 1") == [{"X": 1}]
        assert c.direct


def test_the_direct_channel_survives_an_skb_restart(tmp_path):
    d = start_daemon(tmp_path, "--machine", "shanghai")
    try:
        with Client(str(d.path), app="survivor") as c:
            c.add_facts(["kept(1)"])
            assert c.direct
            children = Path(f"/proc/{d.proc.pid}/task/{d.proc.pid}/children").read_text().split()
            engine = int(children[0])
            slow = {}

            def query():
                try:
                    slow["answer"] = c.execute_query("sleep(2), X = 1")
                except Exception as err:  # a clean error is fine: the engine died under it
                    slow["error"] = err

            t = threading.Thread(target=query)
            t.start()
            time.sleep(0.3)
            os.kill(engine, signal.SIGKILL)  # mid-query
            t.join(20)
            assert not t.is_alive()
            if "error" in slow:
                assert "Traceback" not in str(slow["error"])
            deadline = time.monotonic() + 20
            while True:
                try:
                    if c.execute_query("kept(X)") == [{"X": 1}]:
                        break
                except Exception:
                    pass
                assert time.monotonic() < deadline
                time.sleep(0.1)
            for _ in range(10):
                assert c.execute_query("kept(X)") == [{"X": 1}]
            assert c.direct  # reconnected by itself
    finally:
        d.stop()


def test_no_reader_sees_half_an_allocation(tmp_path, spawn):
    d = start_daemon(tmp_path, "--machine", "magnycours", "--revoke-deadline", "0.05")
    try:
        stop = threading.Event()

        def republish():
            with Client(str(d.path), app="writer") as w:
                pids = [spawn(1, "sleep").pid for _ in range(3)]
                for i, pid in enumerate(pids):
                    w.register_task(f"t{i}", pid=pid, min_cores=1, max_cores=16)
                n = 0
                while not stop.is_set():
                    w.update_task(f"t{n % 3}", max_cores=1 + (n * 7) % 16)
                    n += 1

        t = threading.Thread(target=republish, daemon=True)
        t.start()
        seen: dict[int, list] = {}
        with Client(str(d.path), app="reader") as r:
            assert r.direct
            for _ in range(10_000):
                [a] = r.execute_query("allocation_epoch(E), findall(T-C, allocated(T, C), L)") or [None]
                if a is None:
                    continue
                cpus = [p["args"][1] for p in a["L"]]
                assert len(cpus) == len(set(cpus)), a  # no CPU held by two tasks
                assert seen.setdefault(a["E"], a["L"]) == a["L"], a  # one epoch, one allocation
        stop.set()
        t.join(10)
        assert len(seen) > 10, "the allocation was republished while the reader read"
    finally:
        d.stop()


# ---- issue 23: an application's exception is written as a term, never formatted ------------------
@pytest.mark.parametrize("direct", [True, False], ids=["direct", "through-rm"])
def test_an_exception_is_written_not_formatted_on_both_paths(daemon, tmp_path, direct):
    marker = tmp_path / "pwned"
    with client(daemon, direct) as c:
        for goal in (f"throw(format(\"~@\", [shell('id > {marker}')]))",
                     f"throw(error(foo, context(bar, format(\"~@\", [shell('id > {marker}')]))))"):
            with pytest.raises(KnowledgeBaseError) as err:
                c.execute_query(goal)
            assert err.value.skb_code == "engine" and "format(\"~@\",[shell(" in err.value.message, err.value
        assert c.direct == direct
    assert not marker.exists()


def test_a_conditions_exception_is_not_formatted(daemon, tmp_path):
    marker = tmp_path / "pwned"
    with Client(str(daemon.path), app="cond") as c:
        c.add_facts(["tick(0)"])
        c.subscribe("condition", {"goal": f"tick(N), N > 0, throw(format(\"~@\", [shell('id > {marker}')]))"},
                    lambda _event: None)
        for i in range(1, 4):  # the condition is evaluated again after every change of the app's facts
            c.add_facts([f"tick({i})"])
            time.sleep(0.1)
        assert c.execute_query("tick(3)") == [{}]
    assert not marker.exists()

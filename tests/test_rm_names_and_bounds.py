"""Issue 23's items in the RM: look-alike names, a cap on a uid's application names, a full state
directory, and replies bounded whatever a request held.  Each refusal is clear and changes nothing."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time

import pytest

from cod.protocol import jsonrpc as rpc
from test_rm_support import NOBODY, RawConn, as_user, shared_dir, start_daemon

ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = start_daemon(tmp_path_factory.mktemp("names"), "--machine", "magnycours")
    yield d
    d.stop()


def raw_reply(conn: RawConn, body: bytes) -> bytes:
    """Send one frame; the next frame's body as bytes (not decoded: it may hold what json refuses)."""
    conn.sock.sendall(struct.pack(">I", len(body)) + body)
    head = b""
    while len(head) < 4:
        head += conn.sock.recv(4 - len(head))
    (n,) = struct.unpack(">I", head)
    data = b""
    while len(data) < n:
        data += conn.sock.recv(n - len(data))
    return data


# ---- names that look like others ------------------------------------------------------------------
@pytest.mark.parametrize("name, needle", [
    ("vic\u200btim", "U+200B (ZERO WIDTH SPACE)"),
    ("\u202emitciv", "U+202E (RIGHT-TO-LEFT OVERRIDE), which is a bidirectional control"),
    ("vic\u2066tim", "U+2066"),
    ("vic\u200dtim", "U+200D"),
    ("vic\ufefftim", "U+FEFF"),
    ("vic\u00a0tim", "U+00A0 (NO-BREAK SPACE)"),
    ("\u3164victim", "U+3164 (HANGUL FILLER)"),
    ("victim\ufe0f", "U+FE0F"),
    ("Zu\u0308rich", "NFC"),
])
def test_look_alike_names_are_refused_with_the_character_named(daemon, name, needle):
    c = RawConn(daemon.path)
    try:
        r = c.call("hello", {"version": 1, "app": name})
        assert r["error"]["code"] == rpc.INVALID_PARAMS and needle in r["error"]["message"], r
        c.hello("honest")  # the refused hello changed nothing: this connection may still say hello
        r = c.call("register_task", {"name": name, "properties": {"min_cores": 1}})
        assert r["error"]["code"] == rpc.INVALID_PARAMS and needle in r["error"]["message"], r
        assert c.call("list_tasks")["result"]["tasks"] == []
    finally:
        c.close()


@pytest.mark.parametrize("name", ["Zürich", "PostgreSQL 16", "pg-main", "duckdb.worker-1", "数据库", "Ελλάδα"])
def test_visible_names_are_still_accepted(daemon, name):
    c = RawConn(daemon.path)
    try:
        assert c.hello(name)["app"] == name
    finally:
        c.close()


# ---- application names per uid ----------------------------------------------------------------------
@pytest.mark.skipif(not ROOT, reason="needs root to become another user")
def test_a_uid_holds_at_most_max_apps_per_uid_names_persistent_ones_included():
    with shared_dir("cod-names-") as tmp:
        d = start_daemon(tmp, "--machine", "magnycours", "--set", "max_apps_per_uid=3")
        try:
            def nobody() -> None:
                for i in range(3):  # three names keep persistent facts after their connection goes
                    c = RawConn(d.path)
                    c.hello(f"keep{i}")
                    assert "result" in c.call("add_facts", {"facts": [f"kept({i})"], "persistent": True})
                    c.close()
                c = RawConn(d.path)
                r = c.call("hello", {"version": 1, "app": "one_more"})
                assert r["error"]["code"] == rpc.QUOTA_EXCEEDED, r
                assert "3 application names" in r["error"]["message"] and "max_apps_per_uid" in r["error"]["message"]
                assert c.hello("keep1")["app"] == "keep1"  # a name it holds is still its own
                assert c.call("execute_query", {"goal": "kept(X)"})["result"]["solutions"] == [{"X": 1}]
                c.close()

            assert as_user(NOBODY, nobody) == 0
            roots = [RawConn(d.path) for _ in range(5)]  # root is not bounded
            assert [r.hello(f"root{i}")["app"] for i, r in enumerate(roots)] == [f"root{i}" for i in range(5)]
            for r in roots:
                r.close()
        finally:
            d.stop()


# ---- replies bounded whatever the request held -----------------------------------------------------
def test_a_request_id_of_5000_digits_is_refused_not_echoed(daemon):
    c = RawConn(daemon.path)
    try:
        body = b'{"jsonrpc": "2.0", "id": ' + b"9" * 5000 + b', "method": "hello", "params": {"version": 1}}'
        reply = json.loads(raw_reply(c, body))
        assert reply["id"] is None and reply["error"]["code"] == rpc.INVALID_REQUEST
        assert "5000-digit number" in reply["error"]["message"] and len(json.dumps(reply)) < 400
        reply = json.loads(raw_reply(c, json.dumps({"jsonrpc": "2.0", "id": "x" * 10_000, "method": "hello",
                                                     "params": {"version": 1}}).encode()))
        assert reply["id"] is None and "10000 characters" in reply["error"]["message"]
        assert c.hello("after_big_ids")["app"] == "after_big_ids"  # and the connection carries on
    finally:
        c.close()


def test_a_refused_min_cores_of_5000_digits_is_not_repeated_whole(daemon):
    c = RawConn(daemon.path)
    try:
        c.hello("hugeapp")
        big = b"9" * 5000
        body = (b'{"jsonrpc": "2.0", "id": 7, "method": "register_task", "params": {"name": "huge", '
                b'"properties": {"min_cores": ' + big + b"}}}")
        data = raw_reply(c, body)
        assert len(data) < 1500 and b"9" * 30 not in data, data[:300]
        reply = json.loads(data)
        assert reply["id"] == 7 and reply["error"]["code"] == rpc.ADMISSION_REFUSED
        assert "a 5000-digit number of cores" in reply["error"]["message"]
        assert reply["error"]["data"]["requested"] == "a 5000-digit number"
        assert c.call("list_tasks")["result"]["tasks"] == []
    finally:
        c.close()


# ---- a full state directory --------------------------------------------------------------------------
def test_a_full_state_directory_refuses_a_registration_clearly_and_changes_nothing(tmp_path):
    state = tmp_path / "state"
    d = start_daemon(tmp_path, "--enforce", "affinity", "--state-dir", str(state), "--busy-scope",
                     f"descendants:{os.getpid()}")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        before = os.sched_getaffinity(child.pid)
        deadline = time.monotonic() + 10
        while not (state / "lock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        (state / "enforce-state.json.tmp").symlink_to("/dev/full")  # every write of the state file: ENOSPC
        c = RawConn(d.path)
        c.hello("fullapp")
        r = c.call("register_task", {"name": "t", "pid": child.pid, "properties": {"min_cores": 1, "max_cores": 1},
                                     "facts": ["marker(1)"]})
        err = r["error"]
        assert err["code"] == rpc.ADMISSION_REFUSED, r
        assert f"state directory {state} is full" in err["message"] and "nothing was changed" in err["message"]
        assert err["data"]["state_dir"] == str(state)
        # Nothing changed: no task, no facts, the process's affinity as it was.
        assert c.call("list_tasks")["result"]["tasks"] == []
        missing = c.call("execute_query", {"goal": "marker(X)"})
        assert "unknown procedure" in missing["error"]["message"].lower() or missing.get("result", {}).get("solutions") == [], missing
        assert c.call("execute_query", {"goal": "task(T, _, _)"})["result"]["solutions"] == []
        assert os.sched_getaffinity(child.pid) == before
        # Space again: the same registration is admitted.
        (state / "enforce-state.json.tmp").unlink()
        r = c.call("register_task", {"name": "t", "pid": child.pid, "properties": {"min_cores": 1, "max_cores": 1}})
        assert "result" in r, r
        c.close()
    finally:
        child.kill()
        child.wait()
        d.stop()

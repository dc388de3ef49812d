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
from helpers.rm_support import NOBODY, RawConn, as_user, shared_dir, start_daemon

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


# ---- names that would pass for one in use (issue 47, item 8) ----------------------------------------
# Beside "db1": (name, error code, what the message says).  Another case, another script's letters
# or fullwidth ones look like db1 and are refused naming it; a space at an end, mixed scripts and
# invisible characters are refused on their own.
DB1_LOOK_ALIKES = [
    ("DB1", rpc.ALREADY_EXISTS, "looks like 'db1'"),
    ("Db1", rpc.ALREADY_EXISTS, "looks like 'db1'"),
    ("dbl", rpc.ALREADY_EXISTS, "looks like 'db1'"),
    ("\uff44\uff42\uff11", rpc.ALREADY_EXISTS, "looks like 'db1'"),  # fullwidth
    ("\u0501\u042c1", rpc.ALREADY_EXISTS, "looks like 'db1'"),  # Cyrillic, all of it
    ("db1 ", rpc.INVALID_PARAMS, "ends with a space"),
    (" db1", rpc.INVALID_PARAMS, "begins with a space"),
    ("d\u042c1", rpc.INVALID_PARAMS, "mixes scripts ('d' is Latin, 'Ь' (U+042C CYRILLIC CAPITAL LETTER SOFT SIGN)"),
    ("db\u200d1", rpc.INVALID_PARAMS, "U+200D (ZERO WIDTH JOINER)"),
]


def assert_refused(reply: dict, name: str, code: int, needle: str) -> None:
    err = reply.get("error")
    assert err is not None and err["code"] == code and needle in err["message"], (name, reply)
    if code == rpc.ALREADY_EXISTS:
        assert err["data"] == {"looks_like": "db1"}, err


@pytest.mark.parametrize("name, code, needle", DB1_LOOK_ALIKES, ids=[ascii(n) for n, _, _ in DB1_LOOK_ALIKES])
def test_an_application_name_that_looks_like_one_in_use_is_refused_naming_it(daemon, name, code, needle):
    first = RawConn(daemon.path)
    c = RawConn(daemon.path)
    try:
        assert first.hello("db1")["app"] == "db1"
        assert_refused(c.call("hello", {"version": 1, "app": name}), name, code, needle)
        assert c.hello("db2")["app"] == "db2"  # the refused hello changed nothing
        again = RawConn(daemon.path)
        assert again.hello("db1")["app"] == "db1"  # and the name itself is joined as before
        again.close()
    finally:
        c.close()
        first.close()


def test_a_task_name_that_looks_like_one_registered_is_refused_naming_it(daemon):
    owner, other = RawConn(daemon.path), RawConn(daemon.path)
    try:
        owner.hello("lookalike_tasks")
        other.hello("lookalike_others")  # task names are unique on the daemon: another application too
        assert owner.call("register_task", {"name": "db1", "properties": {"min_cores": 1}})["result"]["task"] == "db1"
        for conn in (owner, other):
            for name, code, needle in DB1_LOOK_ALIKES:
                r = conn.call("register_task", {"name": name, "properties": {"min_cores": 1}})
                assert_refused(r, name, code, needle)
        r = owner.call("register_task", {"name": "other.l23", "properties": {"min_cores": 1}})
        assert r["error"]["code"] == rpc.INVALID_PARAMS and "look like them" in r["error"]["message"], r
        assert [t["task"] for t in owner.call("list_tasks")["result"]["tasks"]] == ["db1"]
        assert "result" in other.call("register_task", {"name": "db2", "properties": {"min_cores": 1}})
    finally:
        other.close()
        owner.close()


@pytest.mark.skipif(not ROOT, reason="needs root to become another user")
def test_an_unprivileged_uid_cannot_take_a_look_alike_of_another_uids_name():
    with shared_dir("cod-lookalike-") as tmp:
        d = start_daemon(tmp, "--machine", "magnycours")
        try:
            roots = RawConn(d.path)
            roots.hello("db1")

            def nobody() -> None:
                c = RawConn(d.path)
                assert_refused(c.call("hello", {"version": 1, "app": "DB1"}), "DB1", rpc.ALREADY_EXISTS, "looks like")
                # uid 0's default names uid0.pid<PID>: a look-alike would keep them out
                r = c.call("hello", {"version": 1, "app": "UID0.pid1"})
                assert r["error"]["code"] == rpc.PERMISSION_DENIED and "reserved for uid 0" in r["error"]["message"], r
                assert c.hello("mine")["app"] == "mine"
                c.close()

            assert as_user(NOBODY, nobody) == 0
            roots.close()
        finally:
            d.stop()


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
def _fill(directory) -> object:
    """Write a file in ``directory`` until its file system has no space left; the file, to free it."""
    ballast = directory / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    return ballast


@pytest.mark.skipif(not ROOT, reason="needs root to mount the small file system the state directory is full on")
def test_a_full_state_directory_refuses_a_registration_clearly_and_changes_nothing(tmp_path):
    # A state directory of its own on a 64 KiB tmpfs, filled once the daemon holds its lock. (The state
    # file is written with O_NOFOLLOW since issue 47, so a symbolic link to /dev/full, this test's way
    # before, is refused as a link, not as a full disk.)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "cod-test-state", str(state)], check=True)
    try:
        _full_state_directory(tmp_path, state)
    finally:
        subprocess.run(["umount", "-l", str(state)], check=False)


def _full_state_directory(tmp_path, state) -> None:
    d = start_daemon(tmp_path, "--enforce", "affinity", "--state-dir", str(state), "--busy-scope",
                     f"descendants:{os.getpid()}")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        before = os.sched_getaffinity(child.pid)
        deadline = time.monotonic() + 10
        while not (state / "lock").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        ballast = _fill(state)  # every write of the state file: ENOSPC
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
        ballast.unlink()
        r = c.call("register_task", {"name": "t", "pid": child.pid, "properties": {"min_cores": 1, "max_cores": 1}})
        assert "result" in r, r
        c.close()
    finally:
        child.kill()
        child.wait()
        d.stop()

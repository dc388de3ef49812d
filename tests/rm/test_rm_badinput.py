"""Bad input on the wire: each gets a clear error or a clean disconnect; the daemon and its other clients carry on."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time

import pytest

from cod.protocol import jsonrpc as rpc
from helpers.rm_support import RawConn, start_daemon


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = start_daemon(tmp_path_factory.mktemp("bad"), "--machine", "magnycours")
    yield d
    d.stop()


@pytest.fixture
def bystander(daemon):
    """A well-behaved client whose calls must keep working whatever the others send."""
    c = RawConn(daemon.path)
    c.hello("bystander")
    c.call("add_facts", {"facts": ["alive(1)"]})
    yield c
    assert c.call("execute_query", {"goal": "alive(X)"})["result"]["solutions"] == [{"X": 1}]
    c.close()


def raw(daemon) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.connect(str(daemon.path))
    s.settimeout(10)
    return s


def read_all(s: socket.socket) -> list[dict]:
    """Every frame the daemon sends until it hangs up."""
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    out = []
    while len(data) >= 4:
        (n,) = struct.unpack(">I", data[:4])
        out.append(json.loads(data[4 : 4 + n]))
        data = data[4 + n :]
    return out


@pytest.mark.parametrize(
    "payload, needle",
    [
        (struct.pack(">I", 2 << 30), "exceeds the limit"),           # a 2 GiB length prefix
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "exceeds the limit"),  # garbage read as a huge length
        (struct.pack(">I", 0xFFFFFFFF) + b"x" * 100, "exceeds the limit"),
    ],
)
def test_unframeable_stream_gets_one_error_then_a_hang_up(daemon, bystander, payload, needle):
    s = raw(daemon)
    s.sendall(payload)
    msgs = read_all(s)  # returns: the daemon hung up
    assert len(msgs) == 1 and msgs[0]["id"] is None
    assert msgs[0]["error"]["code"] == rpc.INVALID_REQUEST and needle in msgs[0]["error"]["message"]


@pytest.mark.parametrize(
    "body, code, needle",
    [
        (b"\x00\xff garbage", rpc.PARSE_ERROR, "UTF-8 JSON"),
        (b'{"jsonrpc": "2.0", "id": 1, "method": ', rpc.PARSE_ERROR, "JSON"),
        (b"[]", rpc.INVALID_REQUEST, "object"),
        (b'{"jsonrpc": "2.0", "id": 3, "method": "frobnicate"}', rpc.METHOD_NOT_FOUND, "frobnicate"),
        (b'{"jsonrpc": "2.0", "id": 4, "method": "register_task", "params": {}}', rpc.INVALID_PARAMS, "'name'"),
        (b'{"jsonrpc": "2.0", "id": 5, "method": "register_task", "params": {"name": 5}}', rpc.INVALID_PARAMS,
         "must be a string"),
        (b'{"jsonrpc": "2.0", "id": 6, "method": "execute_query", "params": {"goal": ["x"]}}', rpc.INVALID_PARAMS,
         "'goal'"),
        (b'{"jsonrpc": "2.0", "id": 7, "method": "add_facts", "params": {"facts": "x(1)"}}', rpc.INVALID_PARAMS,
         "list of strings"),
        (b'{"jsonrpc": "2.0", "id": 8, "method": "hello", "params": [1]}', rpc.INVALID_REQUEST, "params"),
        (b'{"jsonrpc": "2.0", "id": 9, "method": "register_task", "params": {"name": "bad\\u0007name"}}',
         rpc.INVALID_PARAMS, "control character U+0007"),
        (b'{"jsonrpc": "2.0", "id": 10, "method": "register_task", "params": {"name": ""}}',
         rpc.INVALID_PARAMS, "must not be empty"),
    ],
)
def test_bad_messages_get_a_clear_error_and_the_connection_stays_usable(daemon, bystander, body, code, needle):
    c = RawConn(daemon.path)
    c.hello()
    c.sock.sendall(struct.pack(">I", len(body)) + body)
    reply = c.recv()
    assert reply["error"]["code"] == code and needle in reply["error"]["message"], reply
    assert "result" in c.call("list_tasks")  # still in step with the daemon
    c.close()


@pytest.mark.parametrize(
    "goal, skb_code",
    [("repeat, fail", ("timeout", "resource")),  # stopped by the time or the inference limit
     ("shell('rm -rf /')", ("unsafe",)), ("open('/etc/shadow', read, S)", ("unsafe",)), ("foo(", ("syntax_error",))],
)
def test_bad_queries_are_refused_or_stopped(daemon, bystander, goal, skb_code):
    c = RawConn(daemon.path)
    c.hello()
    r = c.call("execute_query", {"goal": goal, "timeout_s": 0.5})
    assert r["error"]["data"]["skb_code"] in skb_code, r
    assert r["error"]["code"] == rpc.skb_error_code(r["error"]["data"]["skb_code"])


def test_a_query_that_never_ends_does_not_stall_other_clients(daemon, bystander):
    looping = RawConn(daemon.path)
    looping.hello("looper")
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(
        looping.call("execute_query", {"goal": "repeat, fail", "timeout_s": 1.0})))
    t.start()
    time.sleep(0.1)
    # Calls that need no SKB answer at once; SKB calls wait at most for the query limit.
    worst = 0.0
    for _ in range(20):
        t0 = time.perf_counter()
        assert "result" in bystander.call("list_tasks")
        worst = max(worst, time.perf_counter() - t0)
    assert worst < 0.1
    t0 = time.perf_counter()
    assert bystander.call("execute_query", {"goal": "alive(X)"})["result"]["solutions"] == [{"X": 1}]
    assert time.perf_counter() - t0 < 2.0
    t.join()
    assert result["error"]["data"]["skb_code"] in ("timeout", "resource")  # time or inference limit


@pytest.mark.parametrize("cut", [2, 4, 20])
def test_a_client_that_sends_half_a_frame_and_dies_is_forgotten(daemon, bystander, cut):
    c = RawConn(daemon.path)
    c.hello("halfway")
    c.call("register_task", {"name": "halfway", "properties": {"max_cores": 2}})
    frame = struct.pack(">I", 100) + b'{"jsonrpc": "2.0", "id": 9, "method": "list_tasks"'
    c.sock.sendall(frame[:cut])
    c.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        tasks = bystander.call("list_tasks")["result"]["tasks"]
        if all(t["task"] != "halfway" for t in tasks):
            break
        time.sleep(0.05)
    assert all(t["task"] != "halfway" for t in tasks)


def test_a_thousand_connections_opened_and_dropped_leave_memory_bounded(daemon, bystander):
    def churn(n: int, with_hello: bool) -> None:
        for i in range(n):
            s = raw(daemon)
            if with_hello and i % 2:
                body = b'{"jsonrpc": "2.0", "id": 1, "method": "hello", "params": {"version": 1}}'
                s.sendall(struct.pack(">I", len(body)) + body)
            s.close()

    churn(200, True)  # warm up allocator arenas before measuring
    time.sleep(0.3)
    before = daemon.rss_kib()
    churn(1000, True)
    assert "result" in bystander.call("list_tasks")
    time.sleep(0.5)
    after = daemon.rss_kib()
    assert after - before < 16 * 1024, (before, after)
    hellos = bystander.call("hello", {"version": 1, "app": "bystander"})["result"]
    assert hellos["app"] == "bystander"


def test_a_client_that_never_reads_is_throttled_not_buffered(daemon, bystander):
    s = raw(daemon)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "hello", "params": {"version": 1}}).encode()
    req = json.dumps({"jsonrpc": "2.0", "id": 2, "method": "list_tasks"}).encode()
    s.sendall(struct.pack(">I", len(body)) + body)
    s.setblocking(False)
    sent = 0
    before = daemon.rss_kib()
    frame = struct.pack(">I", len(req)) + req
    t0 = time.monotonic()
    try:  # send until the daemon stops reading (its queue and our buffers are full)
        while time.monotonic() - t0 < 3:
            s.send(frame)
            sent += 1
    except BlockingIOError:
        pass
    assert sent < 500_000  # blocked: the daemon does not read what it cannot answer
    assert "result" in bystander.call("list_tasks")
    assert daemon.rss_kib() - before < 64 * 1024
    s.close()

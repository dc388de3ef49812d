"""Issue 23 (security, round 2), the SKB server's query pool and direct channel: one uid cannot stop
or fill the pool, a pool that stops serving is restarted, and the direct channel bounds each uid's
connections and idle ones.  Real daemon, real engine, real connections, attackers as other uids."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
import threading
import time
from pathlib import Path

import pytest

from cod.client import Client
from cod.client.errors import QueryTimeout
from cod.protocol import jsonrpc as rpc
from cod.skb import AsyncSKB, EngineConfig, SKBError
from helpers.rm_support import NOBODY, RawConn, as_user, shared_dir, start_daemon

ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="needs root to become another user")


@pytest.fixture
def open_daemon():
    """A daemon in a directory every user may enter (the sockets are 0666, as by default)."""
    with shared_dir("cod-pool-") as tmp:
        started = []

        def start(*settings: str):
            args = ["--machine", "magnycours"]
            for s in settings:
                args += ["--set", s]
            d = start_daemon(tmp, *args)
            started.append(d)
            return d

        yield start
        for d in started:
            d.stop()


def through_daemon(c: Client) -> Client:
    """Queries of ``c`` go through the daemon (the pool's threads), not the direct channel."""
    c.direct_queries = False
    if c._direct is not None:
        c._drop_direct(c._direct)
    assert not c.direct
    return c


def direct_rpc(s: socket.socket, method: str, params: dict, rid: int = 1) -> dict:
    body = json.dumps({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}).encode()
    s.sendall(struct.pack(">I", len(body)) + body)
    return direct_recv(s)


def direct_recv(s: socket.socket) -> dict:
    head = s.recv(4, socket.MSG_WAITALL)
    if len(head) < 4:
        raise ConnectionError("closed")
    (n,) = struct.unpack(">I", head)
    return json.loads(s.recv(n, socket.MSG_WAITALL))


def direct_socket(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.settimeout(10)
    return s


# ---- item 3: a worker that dies is counted out, and its slots released --------------------------
# Goals that ended their worker thread on the main of issue 23 ('$aborted' may not be caught, but
# it could be thrown); whether a later change refuses them or not, nobody may lose the pool.
WORKER_KILLERS = [
    "throw('$aborted')",
    "X = '$aborted', throw(X)",
    "atom_codes(X, \"$aborted\"), throw(X)",
]


@needs_root
@pytest.mark.parametrize("direct", [False, True], ids=["through-rm", "direct"])
@pytest.mark.parametrize("goal", WORKER_KILLERS)
def test_workers_killed_by_one_uid_leave_every_read_served(open_daemon, goal, direct):
    """Issue 23 item 3: each throw killed a worker; after 4 an application's slots were gone for good,
    after max_threads every read of every uid failed while pings were still answered."""
    d = open_daemon("skb_max_threads=8")

    def attacker() -> None:
        with Client(str(d.path), app="killer") as c:
            if not direct:
                through_daemon(c)
            for _ in range(12):  # more than the pool's threads and the application's 4 slots
                t0 = time.monotonic()
                try:
                    c.execute_query(goal)
                except Exception:  # refused, or the worker's death reported: both are answers
                    pass
                assert time.monotonic() - t0 < 3.0, "the call got no answer"
            assert c.execute_query("X = 1") == [{"X": 1}]  # its own application is served again

    assert as_user(NOBODY, attacker) == 0
    with Client(str(d.path), app="rootapp") as root:
        assert root.direct and root.execute_query("X = 2", timeout_s=2.0) == [{"X": 2}]
        through_daemon(root)
        assert root.execute_query("X = 3", timeout_s=2.0) == [{"X": 3}]


# ---- the health check: a pool that stops serving is restarted -------------------------------------
class _StallConfig(EngineConfig):
    """The engine with a short pool_stall_s, so that one blocked worker is a stalled pool."""

    def command(self) -> list[str]:
        return super().command() + ["--pool-stall-s", "0.5"]


def test_an_engine_whose_pool_stopped_serving_fails_its_ping_and_is_restarted():
    """Issue 23: reads stopped but pings were answered, so the engine was never restarted."""
    async def scenario() -> tuple[bool, int]:
        cfg = _StallConfig(load_library=False, max_threads=1)
        engine = await AsyncSKB.start(cfg)
        try:
            await engine.ping()  # a pool that serves: pong
            blocker = asyncio.ensure_future(engine.execute_query("a", "sleep(4)", timeout_s=5.0))
            await asyncio.sleep(0.3)
            stuck = asyncio.ensure_future(engine.execute_query("b", "X = 1", timeout_s=0.5))
            await asyncio.sleep(1.0)  # the only worker has taken nothing for pool_stall_s
            with pytest.raises(SKBError) as err:
                await engine.ping()
            refused = err.value.code == "resource"
            # The caller that waits in vain times out, the health check pings, and restarts it.
            with pytest.raises(SKBError):
                await stuck
            for _ in range(100):
                if engine.restarts:
                    break
                await asyncio.sleep(0.05)
            await asyncio.gather(blocker, return_exceptions=True)
            assert await engine.execute_query("c", "X = 3") == [{"X": 3}]
            return refused, engine.restarts
        finally:
            await engine.close()

    refused, restarts = asyncio.run(scenario())
    assert refused and restarts == 1


# ---- item 7: per-uid shares of the pool ----------------------------------------------------------
@needs_root
def test_uids_filling_the_pool_leave_root_its_threads(open_daemon):
    """Issue 23 item 7: 4 uids x 64 connections looping sleep(5) filled the pool (cap 256) and root's
    queries waited up to 1 s.  Here, at a smaller scale: 3 uids x 8 connections sleeping, 16 threads
    (the reserve is at most half the pool: 8 threads for unprivileged uids, 8 for root)."""
    d = open_daemon("skb_max_threads=16")
    stop = time.monotonic() + 6.0

    def sleeper(uid: int) -> None:
        def loop(i: int, errors: list) -> None:
            try:
                with Client(str(d.path), app=f"s{uid}c{i}") as c:
                    through_daemon(c)  # the pool's threads
                    while time.monotonic() < stop:
                        c.execute_query("sleep(1.5)")
            except Exception as err:
                errors.append(err)
        errors: list = []
        threads = [threading.Thread(target=loop, args=(i, errors)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors  # the excess waits its turn; nothing is refused

    attackers = []
    for uid in (NOBODY, NOBODY - 1, NOBODY - 2):
        t = threading.Thread(target=lambda u=uid: attackers.append(as_user(u, sleeper, u)))
        t.start()
    time.sleep(2.0)  # every sleeper has its queries running or waiting
    slowest = 0.0
    with Client(str(d.path), app="rootapp") as root:
        through_daemon(root)
        for _ in range(10):
            t0 = time.monotonic()
            assert root.execute_query("X = 1") == [{"X": 1}]
            slowest = max(slowest, time.monotonic() - t0)
            time.sleep(0.2)
    while len(attackers) < 3:
        time.sleep(0.1)
    assert attackers == [0, 0, 0]
    assert slowest < 0.5, f"root waited {slowest:.2f} s for a thread"


# ---- item 6: the direct channel's connections per uid, idle ones ---------------------------------
@needs_root
def test_one_uid_cannot_take_every_direct_connection(open_daemon):
    """Issue 23 item 6: one uid held 491 idle direct connections and every other client, root included,
    got ConnectionResetError there."""
    d = open_daemon()  # the defaults: 64 direct connections per unprivileged uid
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the attacker: as many greeted direct connections as it can get, held open
        code = 1
        try:
            os.close(ready_r)
            os.close(done_w)
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            main = RawConn(d.path)
            offer = main.hello("hog")["skb"]
            held, accepted, refusals = [], 0, set()
            for _ in range(100):
                s = direct_socket(offer["socket"])
                held.append(s)
                r = direct_rpc(s, "hello", {"version": 1, "token": offer["token"]})
                if "result" in r:
                    accepted += 1
                else:
                    refusals.add((r["error"]["code"], "max_connections_per_uid" in r["error"]["message"]))
            os.write(ready_w, json.dumps([accepted, sorted(refusals)]).encode())
            os.read(done_r, 1)  # hold them until root has been served
            code = 0
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(done_r)
    accepted, refusals = json.loads(os.read(ready_r, 4096))
    try:
        assert accepted == 64  # its per-uid cap; the others were told why, then closed
        assert refusals == [[rpc.TOO_BUSY, True]]
        with Client(str(d.path), app="rootapp") as root:
            assert root.direct
            for _ in range(3):
                assert root.execute_query("X = 1") == [{"X": 1}]
            assert root.direct  # served on the direct channel, not by a fall-back
    finally:
        os.write(done_w, b"x")
        _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_direct_connections_that_send_nothing_are_closed_with_a_reason(tmp_path):
    d = start_daemon(tmp_path, "--machine", "magnycours", "--set", "direct_idle_timeout_s=1",
                     "--set", "direct_max_pending=3")
    try:
        main = RawConn(d.path)
        offer = main.hello("idler")["skb"]
        greeted = direct_socket(offer["socket"])
        assert "result" in direct_rpc(greeted, "hello", {"version": 1, "token": offer["token"]})
        # Before hello: at most direct_max_pending wait; a new one closes the oldest.
        waiting = [direct_socket(offer["socket"]) for _ in range(3)]
        time.sleep(0.3)
        newest = direct_socket(offer["socket"])
        r = direct_recv(waiting[0])
        assert r["error"]["code"] == rpc.HELLO_REQUIRED and "no hello yet" in r["error"]["message"], r
        assert waiting[0].recv(1) == b""
        assert "result" in direct_rpc(newest, "hello", {"version": 1, "token": offer["token"]}, 2)
        # After hello: silent for direct_idle_timeout_s, then told and closed; one in use is not idle.
        answers: list = []

        def busy() -> None:
            for i in range(8):
                time.sleep(0.3)
                answers.append(direct_rpc(newest, "ping", {}, 3 + i).get("result"))

        user = threading.Thread(target=busy)
        user.start()
        t0 = time.monotonic()
        r = direct_recv(greeted)
        assert r["error"]["code"] == rpc.TIMED_OUT and "idle_timeout" in r["error"]["message"], r
        assert 0.5 < time.monotonic() - t0 < 3.0
        assert greeted.recv(1) == b""
        user.join()
        assert answers == ["pong"] * 8
    finally:
        d.stop()


# ---- item 4 (last part): clients that never read their large answers ------------------------------
# A ~0.8 MB answer, as in the issue: S alone (_L is not reported; with L the answer was 3 MB and refused
# as too large after it was built, and 72 such builds at once took the engine past its 4 GiB address space).
BIG_ANSWER = "length(_L, 800000), maplist(=(0'x), _L), string_codes(S, _L)"


def _frame(obj: dict) -> bytes:
    body = json.dumps(obj).encode()
    return struct.pack(">I", len(body)) + body


def _never_reading(d, uid: int, channel: str, hold_s: float) -> None:
    """63 connections of ``uid``, each pipelining 32 queries with large answers, never reading."""
    held = []
    for i in range(63):
        main = RawConn(d.path)
        offer = main.hello(f"flood{uid}c{i}")["skb"]
        held.append(main)
        s = main.sock
        if channel == "direct":
            s = direct_socket(offer["socket"])
            s.sendall(_frame({"jsonrpc": "2.0", "id": 0, "method": "hello",
                              "params": {"version": 1, "token": offer["token"]}}))
            held.append(s)
        s.setblocking(False)
        try:
            s.sendall(b"".join(_frame({"jsonrpc": "2.0", "id": k + 1, "method": "execute_query",
                                       "params": {"goal": BIG_ANSWER}}) for k in range(32)))
        except BlockingIOError:
            pass  # as much as the socket takes
    time.sleep(hold_s)


def _status_mb(pid: int, field: str) -> int:
    """A ``/proc/PID/status`` size (VmRSS, VmPeak) in MB; 0 once the process is gone (the engine was
    restarted: the test fails on the log)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return 0
    for line in status.splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) // 1024
    return 0


@needs_root
@pytest.mark.slow
@pytest.mark.parametrize("channel", ["through-rm", "direct"])
def test_clients_that_never_read_large_answers_restart_nothing(open_daemon, channel):
    """Issue 23 item 4: 4 uids x 63 connections pipelining 32 queries with ~0.8 MB answers and never
    reading caused 2 engine restarts in 20 s (a pong waited behind the large answers for over 30 s).
    Each restart fails every request in flight and revokes every direct-channel capability. Later,
    with the pong fixed, 64 such queries running at once still took the engine past its 4 GiB address
    space (VmPeak 4.19 GB, 72 threads), and it exited (CI, and 1 run in 1 here; on the direct channel
    1 in 4): the stack grants (skb/prolog/cod_grants.pl) bound what they hold together."""
    d = open_daemon()
    engine = int(Path(f"/proc/{d.proc.pid}/task/{d.proc.pid}/children").read_text().split()[0])
    results: list[int] = []
    attackers = [threading.Thread(target=lambda u=uid: results.append(as_user(u, _never_reading, d, u, channel, 20.0)))
                 for uid in (NOBODY, NOBODY - 1, NOBODY - 2, NOBODY - 3)]
    for t in attackers:
        t.start()
    peak = 0
    deadline = time.monotonic() + 20.0
    while time.monotonic() < deadline:
        peak = max(peak, _status_mb(engine, "VmRSS"))
        time.sleep(0.5)
    for t in attackers:
        t.join()
    log = d.log.read_text()
    assert "SKB engine restart" not in log, (peak, log[-2000:])
    assert len(results) == 4  # (an attacker's own hello may time out on a loaded machine: not the point)
    assert peak < 3 << 10, f"engine peak {peak} MB"  # its address space limit is 4 GiB
    address_space = _status_mb(engine, "VmPeak")
    assert 0 < address_space < 1536, f"engine address space peaked at {address_space} MB"  # 280-500 MB
    # How fast others are served meanwhile is the kernel's sharing of 2 CPUs among the queries (the
    # threat model's open items; the engine still finishes the attackers' queries it had accepted);
    # afterwards the same engine serves root.
    with Client(str(d.path), app="rootapp") as root:
        deadline = time.monotonic() + 60.0
        while True:
            try:
                assert root.execute_query("X = 1") == [{"X": 1}]
                break
            except QueryTimeout:
                assert time.monotonic() < deadline, "root was not served within a minute of the flood"
    assert int(Path(f"/proc/{d.proc.pid}/task/{d.proc.pid}/children").read_text().split()[0]) == engine


def test_a_direct_connection_that_reads_no_answer_is_closed(tmp_path):
    """Its thread blocked for ever in a write, holding the answer (item 4, on the direct channel)."""
    d = start_daemon(tmp_path, "--machine", "magnycours", "--set", "write_timeout_s=1")
    try:
        main = RawConn(d.path)
        offer = main.hello("slowreader")["skb"]
        s = direct_socket(offer["socket"])
        assert "result" in direct_rpc(s, "hello", {"version": 1, "token": offer["token"]})
        # A ~590 KB answer that is quick to make, then waits for a reader that never comes.
        s.sendall(_frame({"jsonrpc": "2.0", "id": 2, "method": "execute_query",
                          "params": {"goal": "numlist(1, 100000, L)"}}))
        time.sleep(10.0)  # reading earlier would let a write that began late go through (a loaded machine)
        got, data = 0, b"x"
        while data:
            data = s.recv(1 << 16)
            got += len(data)
        assert 0 < got < 500_000, got  # what the socket held when the SKB gave up, then end of stream
        # Others are served, the RM connection included.
        assert main.call("execute_query", {"goal": "X = 1"})["result"]["solutions"] == [{"X": 1}]
    finally:
        d.stop()

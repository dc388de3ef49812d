"""Loads on the daemon's upcalls (issue 47, items 5 and 6), for tests/rm/test_rm_upcall_bounds.py and
bench/upcall_bench.py: another uid holding many subscriptions or many slow conditions, and what a
well-behaved client measures meanwhile (a registration, a condition's upcall)."""

from __future__ import annotations

import os
import select
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from helpers.rm_support import RawConn  # noqa: E402

# A condition that keeps a CPU busy for about 10 ms and stays false: the attacker's, 400 times
# over.  Run under condition_timeout_s = 0.5 (SLOW_SETTINGS): on a loaded machine it takes longer,
# and must not end in errors (the daemon drops a condition that keeps failing).
SLOW_GOAL = "tick(_), \\+ (between(1, 50000, Y), Y < 0), X = {i}"
SLOW_SETTINGS = ("condition_timeout_s=0.5",)
# Uids that hold subscriptions: four, each at its default cap (4 x 4 connections x 1,024).
SUBSCRIBER_UIDS = (65534, 65533, 65532, 65531)


class AsUser:
    """``setup(*args)`` in a forked child running as ``uid``; the child holds what it made (its
    threads go on) until :meth:`stop`.  Setup's failure is reported by :meth:`wait_ready`."""

    def __init__(self, uid: int, setup: Callable[..., Any], *args: Any) -> None:
        ready_r, ready_w = os.pipe()
        stop_r, stop_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            code = 1
            try:
                os.close(ready_r)
                os.close(stop_w)
                os.setgid(uid)
                os.setuid(uid)
                held = setup(*args)  # noqa: F841  (kept referenced until the child exits)
                os.write(ready_w, b"ok")
                os.read(stop_r, 1)
                code = 0
            except BaseException as err:  # report, then exit without running the parent's teardown
                os.write(ready_w, f"{type(err).__name__}: {err}".encode()[:4000])
            finally:
                os._exit(code)
        os.close(ready_w)
        os.close(stop_r)
        self._ready, self._stop = ready_r, stop_w

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        if not select.select([self._ready], [], [], timeout_s)[0]:
            raise TimeoutError(f"the child did not set up within {timeout_s:.0f} s")
        said = os.read(self._ready, 4096).decode()
        if said != "ok":
            raise RuntimeError(f"the child's setup failed: {said}")

    def stop(self) -> None:
        try:
            os.write(self._stop, b"x")
        except OSError:
            pass
        os.waitpid(self.pid, 0)
        os.close(self._ready)
        os.close(self._stop)


def _reading(conn: RawConn) -> None:
    """Read (and drop) everything ``conn`` receives, on a thread of its own."""
    def loop() -> None:
        try:
            while conn.recv() is not None:
                pass
        except OSError:
            pass
    threading.Thread(target=loop, daemon=True).start()


def pipelined(conn: RawConn, calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Send every call, then collect their replies (upcalls meanwhile are dropped)."""
    first = conn.next_id
    for method, params in calls:
        conn.send({"jsonrpc": "2.0", "id": conn.next_id, "method": method, "params": params})
        conn.next_id += 1
    replies: dict[int, dict[str, Any]] = {}
    while len(replies) < len(calls):
        msg = conn.recv()
        if msg is None:
            raise ConnectionError("the daemon closed the connection")
        if msg.get("id") is not None:
            replies[msg["id"]] = msg
    return [replies[i] for i in range(first, first + len(calls))]


def hold_subscriptions(path: Path, connections: int, per_connection: int, event: str,
                       filters: Callable[[int], dict[str, Any]], read: bool = True) -> list[RawConn]:
    """``connections`` x ``per_connection`` subscriptions to ``event`` (filter ``filters(i)``)."""
    held = []
    for c in range(connections):
        conn = RawConn(path)
        conn.sock.settimeout(120)
        conn.hello(f"subscriber{os.getuid()}.{c}")
        calls = [("subscribe", {"event": event, "filter": filters(c * per_connection + i)})
                 for i in range(per_connection)]
        for reply in pipelined(conn, calls):
            if "result" not in reply:
                raise RuntimeError(f"subscribe refused: {reply}")
        if read:
            _reading(conn)
        held.append(conn)
    return held


def slow_conditions(path: Path, count: int, tick_s: float = 0.2) -> list[Any]:
    """An application with ``count`` slow conditions, whose facts change every ``tick_s`` (so
    that they are evaluated again and again)."""
    conn = RawConn(path)
    conn.sock.settimeout(120)
    conn.hello("slowconds")
    [added] = pipelined(conn, [("add_facts", {"facts": ["tick(0)"]})])
    assert "result" in added, added
    calls = [("subscribe", {"event": "condition", "filter": {"goal": SLOW_GOAL.format(i=i)}}) for i in range(count)]
    for reply in pipelined(conn, calls):
        if "result" not in reply:
            raise RuntimeError(f"subscribe refused: {reply}")
    _reading(conn)
    ticker = RawConn(path)
    ticker.hello("slowconds")

    def tick() -> None:
        i = 0
        try:
            while True:
                i += 1
                ticker.call("add_facts", {"facts": [f"tick({i})"]})
                time.sleep(tick_s)
        except OSError:
            pass
    threading.Thread(target=tick, daemon=True).start()
    return [conn, ticker]


def register_seconds(conn: RawConn, name: str) -> float:
    """How long registering task ``name`` takes (then it is deregistered)."""
    t0 = time.perf_counter()
    reply = conn.call("register_task", {"name": name, "properties": {"min_cores": 1, "max_cores": 2}})
    took = time.perf_counter() - t0
    assert "result" in reply, reply
    gone = conn.call("deregister_task", {"task": name})
    assert "result" in gone, gone
    conn.inbox.clear()  # its allocation upcalls
    return took


class ConditionWatcher:
    """A client with one fast condition on its own fact: how long from the change to the upcall."""

    def __init__(self, path: Path, app: str = "victim") -> None:
        self.conn = RawConn(path)
        self.conn.sock.settimeout(60)
        self.conn.hello(app)
        assert "result" in self.conn.call("add_facts", {"facts": ["flag(0)"]})
        reply = self.conn.call("subscribe", {"event": "condition", "filter": {"goal": "flag(X), X > 0"}})
        assert "result" in reply, reply
        assert self._upcall()["state"] is False
        self._n = 0

    def _upcall(self) -> dict[str, Any]:
        while True:
            msg = self.conn.recv()
            if msg is None:
                raise ConnectionError("the daemon closed the connection")
            if msg.get("method") == "condition":
                return msg["params"]

    def seconds(self) -> float:
        """The condition turns true: seconds from sending the fact to its upcall (then false again)."""
        self._n += 1
        t0 = time.monotonic()
        self.conn.send({"jsonrpc": "2.0", "method": "add_facts", "params": {"facts": [f"flag({self._n})"]}})
        event = self._upcall()
        took = time.monotonic() - t0
        assert event["state"] is True, event
        self.conn.send({"jsonrpc": "2.0", "method": "remove_facts", "params": {"patterns": [f"flag({self._n})"]}})
        assert self._upcall()["state"] is False
        return took

    def close(self) -> None:
        self.conn.close()


def cpu_seconds(pid: int) -> float:
    """User and system time of process ``pid`` (not its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

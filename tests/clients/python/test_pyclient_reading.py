"""The Python client reads its own replies (clients/python/reading.py, turns.py), against a real daemon.

A call through the daemon reads the socket itself while no other thread does; other callers wait to
be handed their reply or the turn to read; the reader thread reads while nobody calls.  These tests
hold that to what the reader thread alone used to guarantee: every call gets its own reply with
many threads calling while upcalls arrive, a timed-out call leaves the others whole (whether or not
it was the one reading), and a daemon that goes away mid-call fails the calls in flight, then the
client reconnects (or, without reconnection, closes).
"""

from __future__ import annotations

import signal
import threading
import time

import pytest

from cod.client import CallTimeout, Client, CodError, ConnectionLost, QueryTimeout, ShuttingDown
from helpers.rm_support import magny, start_daemon  # noqa: F401  (magny is a fixture)
from helpers.waiting import wait_until

NEVER_ENDS = "numlist(1, 50000, L), repeat, msort(L, _), fail"  # runs until its time limit (few inferences)


def through_daemon(c: Client) -> Client:
    """Queries of `c` take the daemon's road (the direct channel has its own reader: the caller)."""
    c.direct_queries = False
    return c


def idle(c: Client) -> bool:
    """Nobody holds the read turn and no call is left pending: a turn passed on, never lost (a turn
    lost would leave the token taken for good, and every later call would wait for nothing)."""
    return not c._turns._leading and not c._pending


@pytest.mark.parametrize("threads, calls, tasks", [(2, 200, 10), (16, 40, 20)])
def test_many_threads_each_get_their_own_reply_while_upcalls_arrive(magny, threads, calls, tasks):
    events: list[dict] = []
    with through_daemon(Client.connect(str(magny.path), app="many")) as c, \
            Client.connect(str(magny.path), app="churn") as other:
        c.add_facts([f"mine({k}, {k * 1000 + i})" for k in range(threads) for i in range(3)])
        c.subscribe("task_arrived", None, events.append)
        c.subscribe("task_left", None, events.append)
        errors: list[BaseException] = []
        start = threading.Barrier(threads + 1)

        def work(k: int) -> None:
            try:
                start.wait()
                for i in range(calls):
                    j = i % 3
                    got = c.execute_query(f"mine({k}, X), X mod 1000 =:= {j}")
                    assert got == [{"X": k * 1000 + j}], (k, i, got)
            except BaseException as err:  # noqa: BLE001
                errors.append(err)

        workers = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
        for t in workers:
            t.start()
        start.wait()
        for n in range(tasks):  # upcalls to `c` while its threads call
            other.register_task(f"churn{n}", max_cores=1)
            other.deregister_task(f"churn{n}")
        for t in workers:
            t.join()
        assert errors == []
        wait_until(lambda: len(events) == 2 * tasks, 10, "every task_arrived and task_left upcall")
        assert [e["task"] for e in events if "reason" not in e] == [f"churn{n}" for n in range(tasks)]
        # The reader thread may hold the token a moment longer (an upcall, or the turn handed back).
        wait_until(lambda: idle(c), 10, "the token free and no call pending")


def test_a_lone_caller_reads_its_own_reply_and_the_reader_thread_reads_the_rest(magny):
    """No hand-off: the reply to a call made while nobody holds the read turn is read on the
    calling thread, an upcall with no call in flight on the reader thread (the old client read
    every frame on the reader thread).  The caller takes the turn before it sends: a reply that came
    before the caller waited for it (the caller descheduled after its send, on a loaded machine)
    went to the reader thread, which read it and handed it over (a clean-clone run beside a
    spinner: the 8th of 20 queries)."""
    got = threading.Event()
    with through_daemon(Client.connect(str(magny.path))) as c, Client.connect(str(magny.path)) as other:
        readers: list[tuple[str, int]] = []
        hand_on = c._on_message

        def watched(msg: dict) -> None:  # observes, then does what the client does
            readers.append(("reply" if "id" in msg else msg["method"], threading.get_ident()))
            hand_on(msg)

        def alone() -> None:
            # A reader thread woken by the last reply steps aside, and gets the turn back once the
            # caller is done: it keeps it a moment (one empty read). A call then would be its own
            # reader's; the design hands it the reply, so each call here starts once it is free.
            wait_until(lambda: idle(c), 10, "the read turn free")

        c._on_message = watched  # type: ignore[method-assign]
        alone()
        c.subscribe("task_left", None, lambda e: got.set())
        for _ in range(20):
            alone()
            assert c.execute_query("true") == [{}]
        other.register_task("seen", max_cores=1)
        other.deregister_task("seen")
        assert got.wait(10)
        me = threading.get_ident()
        replies = [t for kind, t in readers if kind == "reply"]
        assert replies == [me] * 21
        assert [(kind, t) for kind, t in readers if kind != "reply"] == [("task_left", c._reader_ident)]


class _SlowAfterSend:
    """The client's socket, with a pause after each send: the caller is away when its reply comes."""

    def __init__(self, sock, pause_s: float) -> None:
        self._sock, self._pause_s = sock, pause_s

    def sendall(self, data: bytes) -> None:
        self._sock.sendall(data)
        time.sleep(self._pause_s)

    def __getattr__(self, name: str):
        return getattr(self._sock, name)


def test_a_reply_that_comes_before_its_caller_waits_is_still_read_by_the_caller(magny):
    """The caller holds the read turn from before its send: the reader thread, the only thread in
    the epoll set when the reply comes, wakes and steps aside instead of reading the reply and
    handing it over (it did, when the caller took the turn after sending)."""
    with through_daemon(Client.connect(str(magny.path))) as c:
        readers: list[int] = []
        hand_on = c._on_message

        def watched(msg: dict) -> None:
            if "id" in msg:
                readers.append(threading.get_ident())
            hand_on(msg)

        c._on_message = watched  # type: ignore[method-assign]
        c._sock = _SlowAfterSend(c._sock, 0.2)  # type: ignore[assignment]
        for _ in range(3):
            wait_until(lambda: idle(c), 10, "the read turn free")
            assert c.execute_query("true") == [{}]
        assert readers == [threading.get_ident()] * 3
        wait_until(lambda: idle(c), 10, "the read turn free")


def test_upcalls_arrive_while_the_application_calls_nothing(magny):
    got: list[dict] = []
    with through_daemon(Client.connect(str(magny.path))) as c, Client.connect(str(magny.path)) as other:
        c.subscribe("task_left", None, got.append)
        assert c.execute_query("true") == [{}]  # a caller read last; the turn must be back with the reader
        other.register_task("quiet", max_cores=1)
        other.deregister_task("quiet")
        wait_until(lambda: got, 10, "the task_left upcall with no call in flight")
        assert got[0]["task"] == "quiet"


@pytest.mark.parametrize("short_first", [True, False], ids=["the-timed-out-call-was-reading",
                                                               "the-timed-out-call-was-waiting"])
def test_a_timeout_while_another_thread_reads_leaves_the_other_call_whole(magny, short_first):
    with through_daemon(Client.connect(str(magny.path), app="slow")) as c:
        outcome: dict[str, object] = {}

        def long_call() -> None:
            try:
                c.execute_query(NEVER_ENDS, timeout_s=2.0)  # the daemon answers QueryTimeout after 2 s
            except BaseException as err:  # noqa: BLE001
                outcome["long"] = err
            outcome["long_done"] = time.monotonic()

        def short_call() -> None:
            try:
                c.call("execute_query", {"goal": NEVER_ENDS, "timeout_s": 2.0}, timeout_s=0.3)
            except BaseException as err:  # noqa: BLE001
                outcome["short"] = err
            outcome["short_done"] = time.monotonic()

        first, second = (short_call, long_call) if short_first else (long_call, short_call)
        a = threading.Thread(target=first)
        a.start()
        wait_until(lambda: c._turns._leading, 5, "the first call reading its socket")
        b = threading.Thread(target=second)
        b.start()
        a.join(30)
        b.join(30)
        short, long_ = outcome["short"], outcome["long"]
        assert type(short) is CallTimeout and "no reply within 0.3 s" in str(short)
        assert isinstance(long_, QueryTimeout)  # its own reply, read after the other gave up
        assert outcome["short_done"] < outcome["long_done"]
        # The late reply of the timed-out call is dropped; the client goes on as before.
        assert c.execute_query("X = 1") == [{"X": 1}]
        wait_until(lambda: idle(c), 10, "the abandoned call forgotten and the turn back with the reader")


@pytest.mark.parametrize("reconnect, callers", [(True, 1), (True, 4), (False, 1), (False, 4)])
def test_the_daemon_closing_mid_call_fails_the_calls_in_flight(tmp_path, reconnect, callers):
    d = start_daemon(tmp_path, "--machine", "magnycours")
    try:
        c = through_daemon(Client.connect(str(d.path), app="closing", reconnect=reconnect,
                                          # the daemon's stop and new start may take over 20 s at
                                          # six CPU-bound processes a CPU (a clean-clone run)
                                          reconnect_timeout_s=120))
        c.add_facts(["kept(1)"])
        failures: list[BaseException] = []

        def in_flight() -> None:
            try:
                c.execute_query(NEVER_ENDS, timeout_s=30.0)
            except BaseException as err:  # noqa: BLE001
                failures.append(err)

        workers = [threading.Thread(target=in_flight) for _ in range(callers)]
        for t in workers:
            t.start()
        wait_until(lambda: len(c._pending) == callers and c._turns._leading, 10, "the calls in flight")
        began = time.monotonic()
        d.stop(signal.SIGTERM)
        for t in workers:
            t.join(30)
        assert len(failures) == callers
        assert all(isinstance(f, (ConnectionLost, ShuttingDown)) for f in failures), failures
        assert time.monotonic() - began < 15  # failed when the daemon went, not at the query's 30 s
        if reconnect:
            d.start()
            assert wait_until(lambda: _answers(c), 30, "the client reconnected") == [{}]
            assert c.execute_query("kept(1)") == [{}]  # replayed
            wait_until(lambda: idle(c), 10, "the token free and no call pending")
        else:
            wait_until(lambda: c._closed, 10, "the client closed by the server")
            with pytest.raises(CodError, match="client is closed"):
                c.execute_query("true")
        c.close()
    finally:
        d.stop()


def _answers(c: Client) -> list[dict] | None:
    try:
        return c.execute_query("true")
    except (ConnectionLost, CodError):
        return None

"""The Python client against a real daemon: calls, typed errors, upcalls in both handler modes, reconnection."""

from __future__ import annotations

import os
import select
import threading

import pytest

from cod.client import (
    AdmissionRefused,
    Client,
    InvalidRequest,
    NotConnected,
    KnowledgeBaseError,
    UnsafeGoal,
    rsmgr_client_connect,
    rsmgr_register_fn,
    skb_add_fact,
    skb_add_fn,
    skb_execute_query,
)
from helpers.rm_support import magny, start_daemon  # noqa: F401  (magny is a fixture)
from helpers.waiting import wait_until


def test_facts_queries_and_procedures(magny):
    with Client.connect(str(magny.path), app="shop") as c:
        assert c.add_facts(["price(apple, 3)", "price(pear, 5)", "price(fig, 9)"]) == 3
        assert c.add_procedure("cheap(X) :- price(X, P), P < 6.") == ["cheap/1"]
        assert c.execute_query("cheap(X)") == [{"X": "apple"}, {"X": "pear"}]
        assert c.execute_query("cheap(X)", all_solutions=False) == [{"X": "apple"}]
        assert c.remove_facts("price(pear, _)") == 1
        assert c.execute_query("cheap(X)") == [{"X": "apple"}]
        assert c.execute_query("get_nr_cores(N)") == [{"N": 48}]


def test_errors_are_typed_and_carry_the_servers_code(magny, tmp_path):
    with Client.connect(str(magny.path)) as c:
        with pytest.raises(KnowledgeBaseError) as err:
            c.execute_query("foo(")
        assert err.value.code == -32040 and err.value.skb_code == "syntax_error"
        with pytest.raises(UnsafeGoal):
            c.execute_query("shell(ls)")
        with pytest.raises(InvalidRequest) as err:
            c.call("frobnicate")
        assert err.value.code == -32601 and "frobnicate" in err.value.message
        c.register_task("hog", min_cores=44)
        with pytest.raises(AdmissionRefused) as err:
            c.register_task("late", min_cores=10)
        assert (err.value.requested, err.value.free) == (10, 4)
    with pytest.raises(NotConnected, match="no COD daemon answers"):
        Client.connect(str(tmp_path / "nothing.sock"))


@pytest.fixture
def acking(tmp_path):
    """magny with a revocation deadline no test reaches: these tests assert what an ack releases,
    so the revocation must still be open when they ack. With magny's 0.5 s a loaded machine (a
    spinning shell beside make test) let it expire first, and the ack released [] (session 5)."""
    d = start_daemon(tmp_path, "--machine", "magnycours", "--log-level", "debug", "--revoke-deadline", "60")
    yield d
    d.stop()


def test_register_request_and_upcalls_on_the_handler_thread(acking):
    seen: list[dict] = []
    arrived: list[dict] = []
    threads: set[threading.Thread] = set()

    def on_allocation(event: dict) -> None:
        threads.add(threading.current_thread())
        seen.append(event)

    with Client.connect(str(acking.path), app="dbx") as a, Client.connect(str(acking.path), app="dby") as b:
        sub = b.subscribe("task_arrived", None, arrived.append)
        a.register_task("scan", max_cores=12, sensitive=["numa"], on_allocation=on_allocation)
        assert wait_until(lambda: seen and arrived)
        # Handlers run on the client's handler thread, never on the caller's.
        assert len(threads) == 1 and threading.current_thread() not in threads
        assert arrived[0]["task"] == "scan" and arrived[0]["subscription"] == sub
        alloc = a.request_allocation()
        assert set(alloc) >= {"epoch", "cores", "numa_nodes", "memory_nodes"}
        assert alloc["cores"] == seen[-1]["cores"] and len(alloc["cores"]) == 12
        assert a.allocation() == a.allocation("scan") and a.allocation()["epoch"] == alloc["epoch"]
        a.update_task(max_cores=6)
        assert wait_until(lambda: len(seen[-1]["cores"]) == 6)
        assert len(seen[-1]["removed"]) == 6 and seen[-1]["epoch"] > alloc["epoch"]
        assert a.ack_allocation(epoch=seen[-1]["epoch"]) == seen[-1]["removed"]
        b.unsubscribe(sub)
        a.deregister_task()
        assert b.list_tasks() == []


def test_on_allocation_receives_the_tasks_first_allocation_too(magny):
    """docs/pyclient.md: the reply's allocation also comes as an upcall, same epoch, nothing removed."""
    seen: list[dict] = []
    with Client.connect(str(magny.path), app="first") as c:
        reply = c.register_task("scan", max_cores=4, on_allocation=seen.append)
        assert wait_until(lambda: seen)
        first = reply["allocation"]
        assert seen[0]["epoch"] == first["epoch"] and seen[0]["cores"] == first["cores"]
        assert seen[0]["removed"] == []


def test_manual_dispatch_for_callers_with_their_own_loop(magny):
    got: list[dict] = []
    with Client.connect(str(magny.path), handlers="manual") as c, Client.connect(str(magny.path)) as other:
        c.subscribe("task_left", {"task": "brief"}, got.append)
        other.register_task("brief", max_cores=1)
        other.deregister_task("brief")
        ready, _, _ = select.select([c.fileno()], [], [], 5.0)
        assert ready and got == []  # nothing runs until we dispatch
        assert c.dispatch() == 1
        assert got[0]["task"] == "brief" and got[0]["reason"] == "deregistered"
        assert c.dispatch() == 0


def test_many_threads_share_one_client(magny):
    with Client.connect(str(magny.path)) as c:
        c.add_facts([f"n({i})" for i in range(50)])
        errors: list[BaseException] = []

        def work(k: int) -> None:
            try:
                for i in range(100):
                    j = (k * 7 + i) % 50
                    assert c.execute_query(f"n({j})") == [{}]
            except BaseException as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []


def test_paper_aliases(magny):
    events: list[dict] = []
    c = rsmgr_client_connect(str(magny.path), app="cscs")
    try:
        rsmgr_register_fn(c, "facts_changed", {"predicate": "db_rtime"}, events.append)
        assert skb_add_fact(c, "db_rtime(3000)") == 1
        assert skb_add_fn(c, "twice(X, Y) :- Y is 2 * X.") == ["twice/2"]
        assert skb_execute_query(c, "db_rtime(R), twice(R, Y)") == [{"R": 3000, "Y": 6000}]
        assert wait_until(lambda: events) and events[0]["predicates"] == ["db_rtime"]
        # ... and as methods of the client.
        assert c.skb_add_fact("db_tsize(315)") == 1
        assert c.skb_execute_query("db_tsize(T)") == [{"T": 315}]
    finally:
        c.close()


def test_batch_is_one_round_trip_and_raises_the_first_error(magny):
    with Client.connect(str(magny.path)) as c:
        added, sols = c.batch([("add_facts", {"facts": ["b(1)", "b(2)"]}),
                               ("execute_query", {"goal": "findall(X, b(X), L)"})])
        assert added == {"added": 2} and sols["solutions"][0]["L"] == [1, 2]
        with pytest.raises(KnowledgeBaseError):
            c.batch([("execute_query", {"goal": "b("}), ("add_facts", {"facts": ["b(3)"]})])
        assert c.execute_query("findall(X, b(X), L)")[0]["L"] == [1, 2]  # stopped at the error


def test_client_survives_a_daemon_restart(tmp_path):
    d = start_daemon(tmp_path, "--machine", "magnycours")
    allocations: list[dict] = []
    left: list[dict] = []
    try:
        c = Client.connect(str(d.path), app="durable", reconnect_timeout_s=20)
        c.add_facts(["db_ntuple(3750000)", "gone(1)"])
        c.remove_facts("gone(_)")
        c.add_procedure("double(X) :- db_ntuple(N), X is 2 * N.")
        c.register_task("durable", max_cores=4, on_allocation=allocations.append)
        c.subscribe("task_left", None, left.append)
        assert wait_until(lambda: allocations)
        d.stop()
        d.start()
        # Everything the client had told the daemon is back, without any code of the application.
        assert wait_until(lambda: any(a["epoch"] == 1 and len(a["cores"]) == 4 for a in allocations[1:]), 20)
        assert c.execute_query("double(X)") == [{"X": 7500000}]
        # The removed fact is not back (the replay holds what is held now: gone/1 is not even known).
        with pytest.raises(KnowledgeBaseError) as err:
            c.execute_query("gone(G)")
        assert err.value.skb_code == "existence"
        with Client.connect(str(d.path)) as other:
            assert [t["task"] for t in other.list_tasks()] == ["durable"]
            other.register_task("passing", max_cores=1)
            other.deregister_task()
        assert wait_until(lambda: [e["task"] for e in left] == ["passing"])
        c.close()
    finally:
        d.stop()


def test_closing_the_client_releases_its_task(magny):
    gone: list[dict] = []
    with Client.connect(str(magny.path)) as watcher:
        watcher.subscribe("task_left", None, gone.append)
        with Client.connect(str(magny.path)) as c:
            c.register_task("shortlived", pid=os.getpid(), max_cores=2)
        assert wait_until(lambda: gone)
        assert gone[0]["task"] == "shortlived" and gone[0]["reason"] == "client disconnected"


def test_ack_allocation_takes_task_then_epoch_as_c_does_and_the_old_order_still_works(acking):
    """Issue 32: Python's ack_allocation(epoch, task=) against C's cod_ack_allocation(c, task, epoch).
    The order is now (task, epoch); an int first is the old order: accepted, with a DeprecationWarning."""
    import warnings

    def shrink(c: Client, task: str, to: int) -> dict:
        # Its CPUs first: a newcomer planned onto CPUs that tasks still give back (a client that
        # closed just before) is granted them in a later epoch, not in register_task's reply.
        wait_until(lambda: len(c.allocation(task)["cores"]) > to, what=f"{task} holding more than {to} CPUs")
        before = c.allocation(task)["epoch"]
        c.update_task(task, max_cores=to)
        assert wait_until(lambda: c.allocation(task)["epoch"] > before and c.allocation(task)["removed"])
        return c.allocation(task)

    with Client.connect(str(acking.path), app="orders") as c:
        c.register_task("scan", max_cores=12)
        c.register_task("olap", max_cores=12)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the new forms warn about nothing
            up = shrink(c, "scan", 10)
            assert c.ack_allocation("scan", up["epoch"]) == up["removed"]
            up = shrink(c, "olap", 10)
            assert c.ack_allocation(task="olap", epoch=up["epoch"]) == up["removed"]
            up = shrink(c, "scan", 8)
            assert c.ack_allocation(epoch=up["epoch"], task="scan") == up["removed"]
        for old in (lambda e: c.ack_allocation(e, "olap"), lambda e: c.ack_allocation(e, task="olap")):
            up = shrink(c, "olap", c.allocation("olap")["cores"].__len__() - 2)
            with pytest.warns(DeprecationWarning, match=r"the order is now \(task, epoch\)"):
                assert old(up["epoch"]) == up["removed"]
        for bad, says in ((lambda: c.ack_allocation("olap"), "needs the epoch"),
                          (lambda: c.ack_allocation("olap", "7"), "epoch must be an int"),
                          (lambda: c.ack_allocation(True, 3), "task must be a task name")):
            with pytest.raises(TypeError, match=says):
                bad()
    with Client.connect(str(acking.path), app="single") as one:
        one.register_task("only", max_cores=12)
        up = shrink(one, "only", 10)
        with pytest.warns(DeprecationWarning):
            assert one.ack_allocation(up["epoch"]) == up["removed"]  # the old one-argument form: its only task

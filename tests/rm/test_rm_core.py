"""Regression tests of the RM core's state bugs (issue "RM core: one clear structure ..."), and of
the rollback of a call that fails half-way (issue "Security first", item 4)."""

from __future__ import annotations

import asyncio
import os
import statistics
import threading
import time
from pathlib import Path

import pytest

from cod.client import AdmissionRefused, Client
from cod.facts import machines
from cod.protocol import jsonrpc as rpc
from cod.skb import SKB, SKBError
from helpers.procs import spawn, spinner_cmd  # noqa: F401 (fixtures)
from helpers.waiting import wait_until
from helpers.rm_support import RawConn, start_daemon


# ---- bug 1: one client's slow query stalls nobody's writes ------------------------------------
def test_a_runaway_query_does_not_delay_other_clients_writes(tmp_path, spawn):
    d = start_daemon(tmp_path, "--machine", "magnycours", "--revoke-deadline", "5")
    try:
        stop = threading.Event()

        def runaway():
            with Client(str(d.path), app="slow") as a:
                a.direct_queries = False  # through the daemon: the path that used to block everyone
                if a._direct is not None:
                    a._drop_direct(a._direct)
                while not stop.is_set():
                    try:
                        a.execute_query("repeat, sleep(0.01), fail", timeout_s=4)
                    except Exception:
                        pass

        threads = [threading.Thread(target=runaway, daemon=True) for _ in range(2)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        upcalls: list[dict] = []
        times: dict[str, list[float]] = {"register_task": [], "ack_allocation": [], "get_allocation": [],
                                         "list_tasks": []}
        with Client(str(d.path), app="fast") as b:
            procs = [spawn(1, "sleep") for _ in range(5)]
            for i in range(100):
                t0 = time.perf_counter()
                if i < 5:
                    b.register_task(f"t{i}", pid=procs[i].pid, max_cores=4, on_allocation=upcalls.append)
                    times["register_task"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                b.call("ack_allocation", {"task": "t0", "epoch": 10 ** 6})
                times["ack_allocation"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                b.get_allocation("t0")
                times["get_allocation"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                b.list_tasks()
                times["list_tasks"].append(time.perf_counter() - t0)
        stop.set()
        p99 = {k: sorted(v)[int(0.99 * (len(v) - 1))] * 1e3 for k, v in times.items()}
        # Before the restructure: ~3,800 ms while the other client's query ran.
        assert all(ms < 100 for ms in p99.values()), p99
        assert any(u["task"] == "t4" for u in upcalls), "the allocation upcall reached its task"
    finally:
        d.stop()


# ---- bug 2: a persistent fact removed by pattern does not come back ---------------------------
def test_a_persistent_fact_removed_by_pattern_stays_removed(tmp_path):
    d = start_daemon(tmp_path, "--machine", "shanghai")
    try:
        with Client(str(d.path), app="shop") as c:
            c.add_facts(["price(apple, 3)", "price(pear, 4)"], persistent=True)
            assert c.remove_facts(["price(apple, _)"]) == 1
        with Client(str(d.path), app="shop") as c:  # the application's last connection had left
            assert c.execute_query("price(F, P)") == [{"F": "pear", "P": 4}]
    finally:
        d.stop()


# ---- bug 3 and item 4: a refused call changes nothing -----------------------------------------
def test_a_refused_registration_leaves_no_facts_or_procedures(tmp_path):
    d = start_daemon(tmp_path, "--machine", "shanghai")
    try:
        with Client(str(d.path), app="greedy") as c:
            with pytest.raises(AdmissionRefused):
                c.register_task("huge", min_cores=64, facts=["marker(1)"], procedures=["helper(2)."])
            with pytest.raises(Exception) as err:
                c.execute_query("marker(X)")
            assert "unknown procedure" in str(err.value)
            with pytest.raises(Exception):
                c.execute_query("helper(X)")
            assert c.list_tasks() == []
            # A registration whose facts do not read is refused before anything happens, too.
            with pytest.raises(Exception) as err:
                c.register_task("ok", facts=["broken("])
            assert "syntax" in str(err.value)
            assert c.list_tasks() == []
    finally:
        d.stop()


# ---- bug 4: the client's replay state is what it holds, not its history -----------------------
def test_the_replay_state_stays_compact(tmp_path):
    d = start_daemon(tmp_path, "--machine", "shanghai")
    try:
        with Client(str(d.path), app="sla") as c:
            c.add_procedure("cost(X) :- db_rtime(R), X is R * 2.")
            for i in range(500):
                c.remove_facts("db_rtime(_)")
                c.add_facts([f"db_rtime({1000 + i})"])
            c.add_procedure("cost(X) :- db_rtime(R), X is R * 3.")  # replaces the first
            assert c._held.size() == 2  # one fact, one procedure
            d.stop()
            d.start()
            assert wait_until(lambda: c.execute_query("cost(X)") == [{"X": 4497}], 20)
    finally:
        d.stop()


# ---- bug 5: a bad system-facts reload keeps the machine ---------------------------------------
def test_a_bad_machine_text_leaves_the_machine_as_it_was():
    with SKB(load_library=False) as skb:
        skb.load_machine(machines.load("shanghai"))
        with pytest.raises(SKBError) as err:
            skb.load_system_text("pu(0, 0, 0, 0).\npu(1, 0, 0,")
        assert err.value.code == "syntax_error"
        assert skb.execute_query("a", "get_nr_cores(N)") == [{"N": 16}]


def test_the_colon_operator_in_data_is_data():
    with SKB(load_library=False) as skb:
        assert skb.execute_query("a", "time(12:30) = T") == [{"T": {"functor": "time", "args": [
            {"functor": ":", "args": [12, 30]}]}}]
        with pytest.raises(SKBError) as err:
            skb.execute_query("a", "lists:append(X, Y, [1])")
        assert err.value.code == "unsafe" and "module-qualified" in err.value.message


# ---- item 4: a failure at any step of a registration undoes the steps before it ---------------
class FailingEnforcer:
    """The real null backend, failing on demand at one step (fault injection, not a mock)."""

    def __init__(self, inner):
        self.inner = inner
        self.name = inner.name
        self.fail_apply = False

    def __getattr__(self, item):
        return getattr(self.inner, item)

    def apply(self, task, pids, cpus, mems):
        if self.fail_apply:
            raise OSError(1, "injected failure")
        return self.inner.apply(task, pids, cpus, mems)


@pytest.mark.parametrize("step", ["pin", "skb"])
def test_a_failure_at_any_step_of_a_registration_rolls_everything_back(tmp_path, step):
    from cod.rm.config import build_config
    from cod.rm.daemon import Daemon
    from cod.rm.enforce import NullEnforcer
    from cod.skb import SKBError as EngineError

    async def scenario():
        cfg = build_config(socket=str(tmp_path / "rm.sock"), machine="shanghai")
        enforcer = FailingEnforcer(NullEnforcer())
        daemon = Daemon(cfg, enforcer=enforcer, machine=machines.load("shanghai"))
        await daemon.start()
        rm = daemon.rm
        try:
            conns: list[RawConn] = []  # held open: a task lives as long as its connection

            def register(name: str) -> dict:
                c = RawConn(daemon.transport.path)
                conns.append(c)
                c.hello("victimapp")
                return c.call("register_task", {"name": name, "pid": os.getpid(), "properties": {"max_cores": 2},
                                                "facts": [f"marker_{name}(1)"], "procedures": [f"helper_{name}(2)."]})

            loop = asyncio.get_running_loop()
            assert "result" in await loop.run_in_executor(None, register, "first")
            if step == "pin":
                enforcer.fail_apply = True
            else:
                real = rm.skb.batch

                async def failing_batch(ops):
                    raise EngineError("engine", "injected failure")
                rm.skb.batch = failing_batch
            before = (set(rm.registry.tasks), dict(rm.publisher.holdings()), rm.publisher.epoch)
            reply = await loop.run_in_executor(None, register, "second")
            assert "error" in reply, reply
            # Nothing changed anywhere: the daemon's state, its epoch, the SKB, the enforcement.
            assert (set(rm.registry.tasks), dict(rm.publisher.holdings()), rm.publisher.epoch) == before
            facts = await rm.skb.execute_query("x", "findall(X, task(X, _, _), L)")
            assert [f["L"] for f in facts] == [["first"]]
            listed = await rm.skb.list_facts("victimapp")
            assert listed == ["marker_first(1)"]
            assert await rm.skb.list_procedures("victimapp") == ["helper_first(2).\n"]
            assert "second" not in enforcer.inner._tasks
            if step == "skb":
                rm.skb.batch = real
        finally:
            daemon.request_stop()
            await daemon.close()

    asyncio.run(scenario())

"""Every SKB write that describes the allocation goes through the one publisher, in order (issue 24).

The facts of unregistered busy processes (``other_task/3``: the CPUs the plan
keeps for them) used to be written from a background task of their own, so a
query could see the CPUs kept for a busy process and an ``allocated/2`` of
another epoch that still gives those CPUs to a task.  They are now written in
the transaction of the publication whose plan moved them, and other writes
(a busy process found or gone) are queued behind the publications before them.
"""

from __future__ import annotations

import asyncio
import os
import re

from cod.facts import machines
from helpers.rm_support import RawConn


def test_other_task_facts_are_written_with_the_allocation_they_describe(tmp_path):
    from cod.rm.busy import OtherTask
    from cod.rm.config import build_config
    from cod.rm.daemon import Daemon
    from cod.rm.enforce import NullEnforcer

    async def scenario():
        cfg = build_config(socket=str(tmp_path / "rm.sock"), machine="shanghai", busy_detect=False)
        daemon = Daemon(cfg, enforcer=NullEnforcer(), machine=machines.load("shanghai"))
        await daemon.start()
        rm = daemon.rm
        writes: list[dict[str, list[str]]] = []
        real = rm.skb.replace_many

        async def recorded(replacements):
            writes.append({p: list(f) for p, f in replacements.items()})
            if "allocated(_, _)" in replacements:
                await asyncio.sleep(0.2)  # a slow SKB: a write outside the queue would overtake this one
            return await real(replacements)

        real_batch = rm.skb.batch

        async def recorded_batch(ops):
            # A registration's writes carry the publication that admits it (Publisher.join).
            if any("allocated(_, _)" in op.text for op in ops):
                writes.append({"allocated(_, _)": [], "batch": [op.text for op in ops]})
                await asyncio.sleep(0.2)
            return await real_batch(ops)

        rm.skb.replace_many = recorded
        rm.skb.batch = recorded_batch
        conn = RawConn(daemon.transport.path)
        try:
            loop = asyncio.get_running_loop()

            def register() -> dict:
                conn.hello("pubapp")
                return conn.call("register_task", {"name": "wide", "pid": os.getpid(), "properties": {"min_cores": 1}})

            assert "result" in await loop.run_in_executor(None, register)
            hog = os.getpid() + 1_000_000  # a pid no process has: the allocator only needs its record
            gen = await rm.busy_changed({hog: OtherTask(hog, "hog", 2.0, (0,))}, "a busy process appeared")
            await rm.admission.wait_for(gen)
            await rm.publisher.write({}, "flush")  # every queued write is done
            kept = rm.demands.others[hog].cpus
            assert kept != (0,), "the plan keeps CPUs of its choice for the busy process, not where it ran"

            def kind(w: dict) -> str:
                other, alloc = "other_task(_, _, _)" in w, "allocated(_, _)" in w
                return "both" if other and alloc else "other" if other else "alloc" if alloc else "?"

            # 1. the registration's epoch (in its batch); 2. the busy process as found (where it ran), queued before
            # the recomputation; 3. the plan that keeps CPUs for it, with those CPUs, in one transaction.
            assert [kind(w) for w in writes] == ["alloc", "other", "both"], writes
            assert writes[1]["other_task(_, _, _)"] == [f"other_task({hog}, hog, [0])"]
            assert writes[2]["other_task(_, _, _)"] == [f"other_task({hog}, hog, [{kept[0]}, {kept[1]}])"]
            # What a query sees at the end: the plan's reservation and its epoch.
            [sol] = await rm.skb.execute_query("x", "other_task(P, _, K), allocation_epoch(E)")
            assert (sol["P"], sol["K"], sol["E"]) == (hog, list(kept), rm.publisher.epoch)
        finally:
            conn.close()
            rm.skb.replace_many = real
            rm.skb.batch = real_batch
            daemon.request_stop()
            await daemon.close()

    asyncio.run(scenario())


def test_a_registration_and_an_acknowledgement_during_its_write_number_every_epoch_once(tmp_path):
    """A registration's writes and the publication that admits it are one SKB transaction, carried
    out by the publisher (Publisher.join).  An acknowledgement that moves cores while that write is
    in flight gets the next epoch number; the registration is then published again behind it.  No
    epoch number is written twice, they only grow, and the SKB ends with the publisher's epoch."""
    from cod.rm.config import build_config
    from cod.rm.daemon import Daemon
    from cod.rm.enforce import NullEnforcer

    async def scenario():
        cfg = build_config(socket=str(tmp_path / "rm.sock"), machine="shanghai", busy_detect=False,
                           revoke_deadline_s=30.0)
        daemon = Daemon(cfg, enforcer=NullEnforcer(), machine=machines.load("shanghai"))
        await daemon.start()
        rm = daemon.rm
        epochs: list[int] = []
        joined: list[int] = []
        real_batch, real_replace = rm.skb.batch, rm.skb.replace_many
        writing, go_on = asyncio.Event(), asyncio.Event()

        def seen(text: str) -> None:
            epochs.extend(int(e) for e in re.findall(r"allocation_epoch\((\d+)\)", text))

        async def batch(ops):
            seen(" ".join(op.text for op in ops))
            if any("third" in op.text for op in ops):
                joined.append(epochs[-1])  # the epoch the third registration's transaction writes
                writing.set()
                await go_on.wait()  # the third registration's write, held open
            return await real_batch(ops)

        async def replace_many(replacements):
            seen(" ".join(f for facts in replacements.values() for f in facts))
            return await real_replace(replacements)

        rm.skb.batch, rm.skb.replace_many = batch, replace_many
        conns = {name: RawConn(daemon.transport.path) for name in ("wide", "second", "third")}
        try:
            loop = asyncio.get_running_loop()

            def register(name: str, props: dict) -> dict:
                conns[name].hello(f"app_{name}")
                return conns[name].call("register_task", {"name": name, "pid": os.getpid(), "properties": props})

            assert "result" in await loop.run_in_executor(None, register, "wide", {"min_cores": 1})
            assert len(rm.publisher.holdings_of("wide")) == 16
            # "second" takes CPUs "wide" holds: "wide" is told to give them back and does not yet.
            assert "result" in await loop.run_in_executor(None, register, "second", {"min_cores": 4})
            told = await loop.run_in_executor(None, conns["wide"].recv)
            while told["params"].get("task") != "wide" or not told["params"]["removed"]:
                told = await loop.run_in_executor(None, conns["wide"].recv)
            third = loop.run_in_executor(None, register, "third", {"min_cores": 2})
            await asyncio.wait_for(writing.wait(), 30)
            # While the third registration's write is in flight, "wide" gives its CPUs back.
            ack = await loop.run_in_executor(None, conns["wide"].call, "ack_allocation",
                                             {"task": "wide", "epoch": told["params"]["epoch"]})
            assert ack["result"]["released"] == told["params"]["removed"]
            go_on.set()
            reply = await asyncio.wait_for(third, 30)
            assert "result" in reply, reply
            await rm.publisher.write({}, "flush")  # every queued publication is carried out
            assert epochs == sorted(set(epochs)), f"an epoch number written twice or going back: {epochs}"
            [sol] = await rm.skb.execute_query("x", "allocation_epoch(E)")
            assert sol["E"] == rm.publisher.epoch == epochs[-1]
            for name in ("wide", "second", "third"):
                got = await rm.skb.execute_query("x", f"findall(C, allocated({name}, C), L)")
                assert tuple(got[0]["L"]) == rm.publisher.holdings_of(name), name
            # the acknowledgement's publication, then the third task's again (it was adopted anew)
            assert len([e for e in epochs if e > joined[0]]) == 2, (joined, epochs)
            assert rm.publisher.plan()["third"] and rm.publisher.holdings_of("second")
        finally:
            go_on.set()
            for c in conns.values():
                c.close()
            rm.skb.batch, rm.skb.replace_many = real_batch, real_replace
            daemon.request_stop()
            await daemon.close()

    asyncio.run(scenario())

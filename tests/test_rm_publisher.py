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

from cod.facts import machines
from test_rm_support import RawConn


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

        rm.skb.replace_many = recorded
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

            # 1. the registration's epoch; 2. the busy process as found (where it ran), queued before
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
            daemon.request_stop()
            await daemon.close()

    asyncio.run(scenario())

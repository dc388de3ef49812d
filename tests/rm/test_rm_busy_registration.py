"""A busy sample taken while a process registers must not make the new task a busy stranger.

Seen in a guest run (CI, 2x2, cgroup v2): a Python child busy with its own start-up registered as
a NUMA-sensitive task.  The busy detector had sampled it before the task was in the registry (the
registration pins it, then awaits the SKB write), reported it as an unregistered busy process, and
the monitor then confined it: the confinement took the process's record out of the task's, moved it
out of the task's cgroup, and releasing the confinement gave it back every CPU.  The task was never
pinned again.  A process is the RM's from the moment its registration starts (``arriving``), and a
busy report that names it is dropped.
"""

from __future__ import annotations

import asyncio
import subprocess

from cod.facts import machines
from helpers.rm_support import RawConn


def test_a_process_registering_is_never_recorded_as_a_busy_process(tmp_path):
    from cod.rm.busy import OtherTask
    from cod.rm.config import build_config
    from cod.rm.daemon import Daemon
    from cod.rm.enforce import NullEnforcer

    child = subprocess.Popen(["sleep", "60"])
    stranger = subprocess.Popen(["sleep", "60"])  # busy, and nobody registers it

    async def scenario():
        cfg = build_config(socket=str(tmp_path / "rm.sock"), machine="shanghai", busy_detect=False)
        daemon = Daemon(cfg, enforcer=NullEnforcer(), machine=machines.load("shanghai"))
        await daemon.start()
        rm = daemon.rm
        real = rm.skb.batch
        writing, go_on = asyncio.Event(), asyncio.Event()

        async def slow_batch(writes):
            writing.set()
            await go_on.wait()  # the registration's SKB write, held open
            return await real(writes)

        rm.skb.batch = slow_batch
        conn = RawConn(daemon.transport.path)
        try:
            loop = asyncio.get_running_loop()

            def register() -> dict:
                conn.hello("arriving")
                return conn.call("register_task", {"name": "db", "pid": child.pid, "properties": {"min_cores": 1}})

            reply = loop.run_in_executor(None, register)
            await asyncio.wait_for(writing.wait(), 30)
            assert rm.find_task("db") is None, "the task is not registered before its SKB write"
            assert child.pid in rm.managed_pids(), "a process whose registration is under way is the RM's"
            # The detector's sample from before the registration, delivered now.  It is recorded at
            # once; its SKB write waits behind the registration's in the publisher's queue.
            stale = {child.pid: OtherTask(child.pid, "sleep", 1.0, (0,)),
                     stranger.pid: OtherTask(stranger.pid, "sleep", 1.0, (1,))}
            changed = asyncio.create_task(rm.busy_changed(stale, "a busy process appeared"))
            await asyncio.sleep(0)
            assert stranger.pid in rm.demands.busy(), "the sample was recorded"
            assert child.pid not in rm.demands.busy()
            go_on.set()
            assert "result" in await reply
            await asyncio.wait_for(changed, 30)
            assert child.pid not in rm.demands.busy()
            await rm.busy_changed(stale, "a busy process appeared")  # and once it is registered
            assert child.pid not in rm.demands.busy()
            assert child.pid in rm.managed_pids()
        finally:
            go_on.set()
            conn.close()
            rm.skb.batch = real
            daemon.request_stop()
            await daemon.close()
        assert child.pid not in rm.managed_pids(), "nothing is left arriving"

    try:
        asyncio.run(scenario())
    finally:
        for p in (child, stranger):
            p.kill()
            p.wait()

"""A busy sample taken while an elastic group registers must not make its process a busy stranger.

Issue 30, the registration path of a group (decision 17 of docs/design-enforce.md, as for a task):
``register_unmanaged`` pins the group's processes and then awaits the SKB write of its facts; until
the group is among the daemon's demands, a busy report from the detector's sample would record the
process as an unregistered busy process, and the allocator would keep a CPU for it beside the group
(the monitor confining it there after the next plan).  A group's processes are the RM's from the
moment its registration starts (``Registry.arrival``), and a busy report naming them is dropped.

An in-process daemon (affinity backend, own state directory, no busy detector: the stale report is
delivered by hand at the moment it matters), a real process, the group's SKB write held open.
"""

from __future__ import annotations

import asyncio
import os
import subprocess

from cod.rm.busy import OtherTask
from test_rm_support import RawConn


def test_a_process_becoming_an_elastic_group_is_never_recorded_as_a_busy_process(tmp_path):
    from cod.rm.config import build_config
    from cod.rm.daemon import Daemon

    child = subprocess.Popen(["sleep", "60"])
    before = os.sched_getaffinity(child.pid)

    async def scenario():
        cfg = build_config(socket=str(tmp_path / "rm.sock"), enforce_mode="affinity", state_dir=str(tmp_path / "state"),
                           busy_detect=False)
        daemon = Daemon(cfg, root=False)
        await daemon.start()
        rm = daemon.rm
        real = rm.skb.replace_many
        writing, go_on = asyncio.Event(), asyncio.Event()

        async def slow_replace_many(replacements):
            if any(p.startswith("elastic_group(") for p in replacements):
                writing.set()
                await go_on.wait()  # the group's SKB write, held open
            return await real(replacements)

        rm.skb.replace_many = slow_replace_many
        conn = RawConn(daemon.transport.path)
        try:
            loop = asyncio.get_running_loop()

            def register() -> dict:
                conn.hello("arriving")
                return conn.call("register_unmanaged", {"name": "db", "pid": child.pid, "mode": "dense"})

            reply = loop.run_in_executor(None, register)
            await asyncio.wait_for(writing.wait(), 30)
            assert rm.demands.groups == {}, "the group is not among the demands before its SKB write"
            assert child.pid in rm.managed_pids(), "a process whose group is registering is the RM's"
            # The detector's sample from before the registration, delivered now.
            stale = {child.pid: OtherTask(child.pid, "sleep", 1.0, (0,))}
            await rm.busy_changed(stale, "a busy process appeared")
            assert child.pid not in rm.demands.busy()
            go_on.set()
            answer = await reply
            assert answer["result"]["group"] == "db", answer
            assert child.pid not in rm.managed_pids(), "nothing is left arriving: the group holds it now"
            assert child.pid in rm.demands.members()
            assert child.pid not in rm.demands.busy()
        finally:
            go_on.set()
            conn.close()
            rm.skb.replace_many = real
            daemon.request_stop()
            await daemon.close()
        assert child.pid not in rm.managed_pids()

    try:
        asyncio.run(scenario())
        assert os.sched_getaffinity(child.pid) == before, "the daemon's close gave the process its mask back"
    finally:
        child.kill()
        child.wait()

"""A task's memory nodes when its working set does not fit its CPUs' nodes (cod.rm.memory_nodes):
the rule as a table, on the 4x2 guest's distances (two dies of one package at 16, the other
package at 22)."""

from __future__ import annotations

import pytest

from cod.rm.memory_nodes import choose_memory_nodes

MIB = 1 << 20
DIST = {0: {0: 10, 1: 16, 2: 22, 3: 22}, 1: {0: 16, 1: 10, 2: 22, 3: 22},
        2: {0: 22, 1: 22, 2: 10, 3: 16}, 3: {0: 22, 1: 22, 2: 16, 3: 10}}
ALL_FREE = {n: 900 * MIB for n in range(4)}

CASES = [
    # (id, cpus per node, working set per CPU, free per node, own resident per node, nodes, reason has)
    ("no working set: its CPUs' nodes", {3: 2}, 0, {3: 0, 2: 0}, {}, (3,), None),
    ("fits: its CPUs' nodes", {3: 2}, 100 * MIB, ALL_FREE, {}, (3,), None),
    ("fits exactly", {3: 2}, 450 * MIB, ALL_FREE, {}, (3,), None),
    ("free of its node not known: its CPUs' nodes", {3: 2}, 1 << 40, {3: None, 2: 900 * MIB}, {}, (3,), None),
    ("what it holds there counts as its room", {3: 2}, 400 * MIB, {**ALL_FREE, 3: 100 * MIB}, {3: 700 * MIB},
     (3,), None),
    ("too big for node 3: the die beside it (16), not node 0 with more free",
     {3: 2}, 500 * MIB, {0: 1000 * MIB, 1: 900 * MIB, 2: 200 * MIB, 3: 900 * MIB}, {}, (2, 3),
     "also the nearest with room, node 2 (distance 16, 200 MiB free)"),
    ("beside it not enough: then the other package, the one with more free first",
     {3: 2}, 800 * MIB, {0: 300 * MIB, 1: 900 * MIB, 2: 100 * MIB, 3: 900 * MIB}, {}, (1, 2, 3),
     "node 2 (distance 16, 100 MiB free); node 1 (distance 22, 900 MiB free)"),
    ("CPUs on two nodes: the nearest to either",
     {0: 1, 2: 1}, 600 * MIB, {0: 500 * MIB, 1: 300 * MIB, 2: 500 * MIB, 3: 100 * MIB}, {}, (0, 1, 2),
     "nodes 0,2 of its CPUs"),
    ("not even every node holds it: every node", {0: 2}, 2000 * MIB, ALL_FREE, {}, (0, 1, 2, 3),
     "nor on every node (3.5 GiB free in all): every node"),
    ("a node whose free memory is not known is not added", {0: 1}, 1000 * MIB, {0: 900 * MIB, 1: None, 2: 900 * MIB},
     {}, (0, 2), "node 2 (distance 22"),
]


@pytest.mark.parametrize("cpus, ws, free, own, nodes, reason", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_memory_nodes(cpus, ws, free, own, nodes, reason):
    choice = choose_memory_nodes(cpus, ws, free, own, DIST)
    assert choice.nodes == nodes
    if reason is None:
        assert choice.reason is None
    else:
        assert reason in choice.reason
        assert "does not fit" in choice.reason


def test_the_reason_names_the_working_set_and_what_was_free():
    choice = choose_memory_nodes({3: 2}, 500 * MIB, {0: 1000 * MIB, 1: 900 * MIB, 2: 200 * MIB, 3: 900 * MIB}, {}, DIST)
    assert choice.reason == ("its working set, 1000 MiB (500 MiB per CPU x 2 CPUs), does not fit in the 900 MiB free "
                             "on node 3 of its CPUs: also the nearest with room, node 2 (distance 16, 200 MiB free)")


def test_no_cpus_no_memory_nodes():
    assert choose_memory_nodes({}, 100 * MIB, ALL_FREE, {}, DIST).nodes == ()


def test_the_daemon_tells_a_task_its_memory_nodes_and_why(tmp_path):
    """Wired: a daemon on the 8-node reference machine whose free memory is 1 GiB a node now (its
    facts say 16 GiB, so the allocator's C4 lets the task onto one node); a task with 1 GiB per
    CPU on 2 CPUs gets the node of its CPUs and the die beside it (distance 16) as memory nodes,
    in its allocation with the reason."""
    import asyncio
    import os

    from cod.facts import machines
    from cod.rm.config import build_config
    from cod.rm.daemon import Daemon
    from cod.rm.enforce import NullEnforcer
    from helpers.rm_support import RawConn

    machine = machines.load("magnycours")
    gib = 1 << 30

    async def scenario():
        cfg = build_config(socket=str(tmp_path / "rm.sock"), machine="magnycours", busy_detect=False)
        daemon = Daemon(cfg, enforcer=NullEnforcer(), machine=machine)
        await daemon.start()
        daemon.rm.pinning.free_memory = lambda: {n.id: gib for n in machine.numa_nodes}  # that machine's sysfs, now
        conn = RawConn(daemon.transport.path)
        try:
            def register() -> dict:
                conn.hello("memapp")
                return conn.call("register_task", {"name": "big", "pid": os.getpid(), "properties": {
                    "min_cores": 2, "max_cores": 2, "working_set_bytes": gib, "sensitive": ["numa"]}})

            reply = await asyncio.get_running_loop().run_in_executor(None, register)
            assert "result" in reply, reply
            alloc = await asyncio.get_running_loop().run_in_executor(None, lambda: conn.call("get_allocation", {}))
            mine = alloc["result"]
            [home] = mine["numa_nodes"]
            [beside] = [n for n, d in machine.numa_nodes[home].distances.items() if d == 16]
            assert mine["memory_nodes"] == sorted([home, beside]), mine
            assert mine["memory_reason"].startswith("its working set, 2 GiB (1 GiB per CPU x 2 CPUs), does not fit")
            assert f"node {beside} (distance 16, " in mine["memory_reason"]
        finally:
            conn.close()
            daemon.request_stop()
            await daemon.close()

    asyncio.run(scenario())

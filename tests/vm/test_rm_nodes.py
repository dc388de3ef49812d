"""The RM daemon's node choices on a NUMA guest, as the kernel shows them: a query-plan deployment
(phases 3 and 4) pins its operator threads onto the nodes it chose, and an elastic group in the
adaptive mode grows on the node that holds its pages.  One daemon for the module: it starts in
tens of seconds under TCG."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from cod.rm.elastic.settings import ElasticSettings
from helpers import opthreads
from helpers.procs import spawn, spinner_cmd  # noqa: F401 (fixtures)
from helpers.waiting import wait_until
from rmguest import SLOW, connection, guest_daemon, result

pytestmark = pytest.mark.timeout(3 * SLOW)


@pytest.fixture(scope="module")
def rm(tmp_path_factory):
    # No unregistered process is ever busy (no process runs as nobody): the spinners below are
    # an elastic group's members, not newcomers to confine.
    with guest_daemon(tmp_path_factory.mktemp("nodes"), "--busy-scope", "uids:65534") as d:
        yield d


def node_of(topo, cpu: int) -> int:
    return cpu // topo.cpus_per_node


def affinity(tid: int) -> set[int]:
    return set(os.sched_getaffinity(tid))


# ---- deployment phases 3 and 4 ---------------------------------------------------------------------
def test_a_deployment_pins_its_operator_threads_onto_the_nodes_it_chose(topo, rm, tmp_path):
    # One operator more than a node has CPUs, each nearly a core: the plan needs two nodes.
    duties = {f"op{i}": 0.9 for i in range(topo.cpus_per_node + 1)}
    graph = {"operators": [{"id": k, "cpu_util": v, "mem_bw": 1e8} for k, v in duties.items()], "edges": []}
    ops = opthreads.start(opthreads.build(str(tmp_path)), duties, seconds=3 * SLOW, units_per_ms=1000)
    original = affinity(ops.pid)
    try:
        with connection(rm, "engine") as c:
            result(c.call("register_task", {"name": "plan", "pid": ops.pid,
                                            "properties": {"min_cores": 1, "max_cores": topo.cpus}}))
            reply = result(c.call("deploy_plan", {"task": "plan", "graph": graph}))
            assert reply["min_cores"] == len(duties) and reply["problem"] is None, reply
            chosen = reply["numa_nodes"]
            assert len(chosen) == 2, reply
            if topo.nodes > 2:  # the pair phase 4 prefers: linked, the shortest distance of all
                assert topo.distances[chosen[0]][chosen[1]] == min(
                    d for row in topo.distances for d in row if d != topo.distances[0][0]), reply

            def pinned():
                task = next(t for t in result(c.call("list_tasks"))["tasks"] if t["task"] == "plan")
                placement = task.get("deployment", {}).get("placement", {})
                ok = (len(task["cores"]) == topo.cpus and set(placement) == set(duties)
                      and all(affinity(ops.tids[k]) == {cpu} for k, cpu in placement.items()))
                return placement if ok else None

            # The task grows to every CPU (max_cores); the clusters are laid out inside them.
            placement = wait_until(pinned, SLOW, "every operator thread pinned to its CPU", interval=1.0)
            assert {node_of(topo, cpu) for cpu in placement.values()} == set(chosen), placement
            assert len(set(placement.values())) == len(duties), placement  # 0.9 each: a CPU each
            # Threads that run no operator keep the task's whole allocation.
            assert affinity(ops.pid) == set(range(topo.cpus))
            result(c.call("deregister_task", {"task": "plan"}))
            wait_until(lambda: all(affinity(t) == original for t in ops.tids.values()), SLOW,
                       "the operator threads' masks given back")
    finally:
        ops.stop()


# ---- the elastic adaptive mode ---------------------------------------------------------------------
# A child that maps and writes fresh memory bound to a node (mbind) on request: the group's pages
# go where the test says, whichever CPU the group runs on.
BOUND_TOUCHER = r"""
import ctypes, mmap, platform, sys
libc = ctypes.CDLL(None, use_errno=True)
MBIND = {"x86_64": 237, "aarch64": 235}[platform.machine()]
keep = []
print("ready", flush=True)
for line in sys.stdin:
    mib, node = (int(x) for x in line.split())
    m = mmap.mmap(-1, mib << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    mask = ctypes.c_ulong(1 << node)
    if libc.syscall(MBIND, ctypes.c_void_p(addr), ctypes.c_ulong(mib << 20), 2, ctypes.byref(mask), 64, 0):
        sys.exit(f"mbind: errno {ctypes.get_errno()}")
    for off in range(0, mib << 20, 4096):
        m[off] = 1
    keep.append(m)
    print("touched", flush=True)
"""


def test_the_adaptive_mode_grows_a_group_on_the_node_of_its_pages(topo, rm, spawn):
    toucher = subprocess.Popen([sys.executable, "-c", BOUND_TOUCHER], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    # Started and idle before the group exists: Python's own start takes seconds of CPU under TCG,
    # which the net would read as load before the pages are anywhere.
    assert toucher.stdout.readline().strip() == "ready"
    spinner = spawn(topo.cpus_per_node + 2, "spin")
    os.kill(spinner.pid, signal.SIGSTOP)  # no load before the pages are where the test wants them
    try:
        with connection(rm, "elastic") as c:
            group = result(c.call("register_unmanaged", {
                "pids": [toucher.pid, spinner.pid], "name": "adaptive", "mode": "adaptive",
                "metric": "cpu_demand", "max_cores": topo.cpus_per_node + 1}))
            assert group["mode"] == "adaptive" and len(group["cores"]) == 1, group
            # The pages on the node farthest from the group's first CPU (the other package on 4x2).
            home = node_of(topo, group["cores"][0])
            node = max(range(topo.nodes), key=lambda n: (topo.distances[home][n], n))
            toucher.stdin.write(f"128 {node}\n")
            toucher.stdin.flush()
            assert toucher.stdout.readline().strip() == "touched"
            # Touching was load (seconds of CPU under TCG) while the pages were not all there yet:
            # the net may have granted a CPU by then; idle again, it gives back all but one.
            wait_until(lambda: len(affinity(spinner.pid)) == 1, SLOW, "the idle group back to one CPU",
                       interval=1.0)
            # The daemon reads numa_maps at most every pages_refresh_s: every reading from now on
            # sees the pages (an ordering, not a timing assertion).
            time.sleep(ElasticSettings().pages_refresh_s + 1)
            loaded_at = time.time()
            os.kill(spinner.pid, signal.SIGCONT)
            grown = topo.cpus_per_node + 1
            wait_until(lambda: len(affinity(spinner.pid)) == grown == len(affinity(toucher.pid)), SLOW,
                       f"the group grown to {grown} CPUs", interval=1.0)
            on_node = set(topo.node_cpus(node))
            assert on_node <= affinity(spinner.pid), (node, affinity(spinner.pid))
            periods = result(c.call("deregister_unmanaged", {"name": "adaptive"}))["periods"]
        # Every CPU granted under the load went to the pages' node while it had one free.
        held, grants = set(), 0
        for p in periods:
            if p["at"] >= loaded_at and p["action"] == "allocate" and not on_node <= held:
                assert set(p["cpus"]) - held <= on_node, (node, periods)
                grants += 1
            held = set(p["cpus"])
        assert grants >= 1, periods
    finally:
        os.kill(spinner.pid, signal.SIGCONT)
        toucher.kill()
        toucher.wait()

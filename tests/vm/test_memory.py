"""Memory follows cores (issue 26), against the guest's kernel: after a task is moved to another
node, its resident pages are there (numa_maps), moved by COD in bounded batches, and the pages it
allocates afterwards land there too; in cpuset mode (cgroup v2) and in affinity mode, with one
thread and with several, with the kernel's automatic NUMA balancing on and off."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cod.rm.enforce import AffinityEnforcer, CpusetV2Enforcer
from cod.rm.enforce.cgroupfs import find_cpuset_mount
from numa import MemTask, NumaBalancing, cgroup_v2_fixture, fmt, node_pages, process_pages, read, share_on

MOUNT = find_cpuset_mount()
PARENT = f"cod-mem-{os.getpid()}"
MIB = 16  # per test, split between the threads
SLOW = 240.0  # seconds a background move may take under TCG (the guest's per-test timeout is 300)


cgroup_v2 = cgroup_v2_fixture(PARENT)


def enforcer(mode: str, state_dir: str):
    if mode == "cpuset":
        return CpusetV2Enforcer(MOUNT, state_dir, parent=PARENT, memory_migrate=True)
    return AffinityEnforcer(state_dir, memory_migrate=True)


def settled(enf) -> None:
    """apply() returns once the CPUs are enforced; the pages follow on the mover's thread."""
    assert enf.wait_moves(SLOW), "the background page move did not end"


def on_node(pid: int, addrs, node: int, mib: int) -> None:
    """Every page of each mapping (``mib`` MiB) is on ``node``."""
    for addr in addrs:
        pages = node_pages(pid, addr)
        assert set(pages) == {node} and pages[node] >= mib * 256, (hex(addr), pages)


@pytest.mark.parametrize("balancing", [False, True], ids=["balancing-off", "balancing-on"])
@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize("mode", ["cpuset", "affinity"])
def test_pages_follow_a_task_to_another_node(topo, tmp_path, mode, threads, balancing):
    """Placed on node 0, then reallocated to the last node (two hops away on 4x2): >= 95 % of the
    process's resident pages are there, the task's own mappings entirely, moved by COD's batches
    (many move_pages calls, not one), and what it allocates afterwards lands there."""
    old, new = 0, topo.nodes - 1
    share = MIB // threads
    with NumaBalancing(balancing), MemTask(topo.node_cpus(old), threads) as task:
        before = task.touch(share)
        on_node(task.pid, before, old, share)
        enf = enforcer(mode, str(tmp_path / "state"))
        try:
            enf.apply("db", [task.pid], topo.node_cpus(old), [old])
            settled(enf)
            on_node(task.pid, before, old, share)
            enf.apply("db", [task.pid], topo.node_cpus(new), [new])
            settled(enf)
            if mode == "cpuset":  # narrowed to the task's node once the move ended
                assert read(os.path.join(MOUNT.path, PARENT, "db", "cpuset.mems")) == str(new)
            (report,) = enf.moves["db"]
            print(f"{mode} threads={threads} balancing={balancing}: {report.describe()}")
            assert report.moved >= 0.95 * MIB * 256 and report.calls > 1, report
            pages = process_pages(task.pid)
            assert share_on(pages, [new]) >= 0.95, pages
            on_node(task.pid, before, new, share)
            after = task.touch(share)
            on_node(task.pid, after, new, share)
        finally:
            enf.close()


def test_a_task_on_two_nodes_keeps_pages_that_are_on_either(topo, tmp_path):
    """Nodes {old, new}: pages already on one of them stay (no page moves between the task's own
    nodes), the others come onto them."""
    a, b, c = 0, 1, topo.nodes - 1
    with NumaBalancing(False), MemTask(topo.node_cpus(a), 1) as task:
        on_a = task.touch(8)
        enf = enforcer("cpuset", str(tmp_path / "state"))
        try:
            enf.apply("db", [task.pid], topo.node_cpus(b), [b])
            settled(enf)
            on_node(task.pid, on_a, b, 8)
            enf.apply("db", [task.pid], topo.node_cpus(b) + topo.node_cpus(c), [b, c])
            settled(enf)
            on_node(task.pid, on_a, b, 8)
        finally:
            enf.close()


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_json(*cmd: str) -> dict:
    out = subprocess.run([sys.executable, *cmd], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    print(out.stdout)
    return json.loads(out.stdout)


def test_the_move_bench_runs_and_both_ways_move_the_pages(topo):
    """bench/memmove_bench.py, small: COD's batches and one migrate_pages call each leave the
    task's pages on the node they moved them to (the figures are the bench's, not asserted)."""
    with NumaBalancing(False):
        r = run_json("bench/memmove_bench.py", "--mib", "16", "--loop-s", "1")
    assert r["to_node"] == topo.nodes - 1
    assert r["batched"]["share_on_to_node"] >= 0.95 and r["batched"]["calls"] > 1
    assert r["one_call"]["share_on_from_node"] >= 0.95
    assert r["baseline"]["rounds"] > 0, "the task's loop did not run"


def test_the_memory_distance_experiment_places_each_table_where_it_says(topo):
    """bench/experiments/exp6_memory_distance.py, small: local, the nearest and the farthest node
    by the guest's distances, each table's pages on its node."""
    r = run_json("bench/experiments/exp6_memory_distance.py", "--mib", "8", "--repeat", "1", "--no-write")
    row = topo.distances[0]
    nearest = min(d for n, d in enumerate(row) if n != 0)
    assert r["placement_nodes"]["local"] == 0
    assert row[r["placement_nodes"]["1 hop"]] == nearest
    if max(row) > nearest:  # 4x2: a farther node; 2x2 has none
        assert row[r["placement_nodes"]["2 hops"]] == max(row)
    else:
        assert "2 hops" not in r["placement_nodes"]
    assert all(share >= 0.95 for share in r["pages_on_placement_node"].values()), r["pages_on_placement_node"]


def test_cod_bandwidth_measures_every_pair_of_nodes(topo):
    """`cod bandwidth`, small: a node x node matrix, every (CPU node, memory node) pair once, each
    with the arrays bound to its memory node, the diagonal as each node's local figure and the
    memory_bandwidth/3 facts of every cell (TCG's figures mean nothing: their shape and sign only)."""
    r = run_json("-m", "cod.cli.main", "bandwidth", "--size-mib", "8", "--iterations", "2", "--no-store",
                 "--format", "json")
    nodes = list(range(topo.nodes))
    cells = {(m["node"], m["memory_node"]): m for m in r["matrix"]}
    assert sorted(cells) == [(a, b) for a in nodes for b in nodes] and len(r["matrix"]) == topo.nodes ** 2
    assert all(m["checked"] and m["memory_bound_to_node"] and m["bandwidth_bytes_per_s"] > 0 for m in r["matrix"])
    assert [n["node"] for n in r["nodes"]] == nodes and all(n["memory_node"] == n["node"] for n in r["nodes"])
    assert sum(f.startswith("memory_bandwidth(") for f in r["facts"]) == topo.nodes ** 2
    assert sum(f.startswith("numa_bandwidth(") for f in r["facts"]) == topo.nodes


CLIENT_CALLS = r"""
import ctypes, json, mmap, os, sys
from cod.client.memory import MemoryRanges, bind_thread, unbind_thread
from cod.facts.procfs import numa_ranges
os.sched_setaffinity(0, [0])  # runs on node 0: first touch alone would put everything there
thread_node, range_node = int(sys.argv[1]), int(sys.argv[2])

def where(m):
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    return next(r.pages for r in numa_ranges(os.getpid()) if r.start <= addr < r.end)

def touch(m):
    for off in range(0, len(m), 4096):
        m[off] = 1

bind_thread([thread_node])
a = mmap.mmap(-1, 4 << 20)
touch(a)
unbind_thread()
pool = mmap.mmap(-1, 4 << 20)
ranges = MemoryRanges()
ranges.register(ctypes.addressof(ctypes.c_char.from_buffer(pool)), 4 << 20)
ranges.follow({"task": "db", "memory_nodes": [range_node]})  # as an allocation_changed upcall would
touch(pool)
b = mmap.mmap(-1, 4 << 20)
touch(b)  # the default policy again: first touch, node 0
print(json.dumps({"thread": where(a), "range": where(pool), "default": where(b)}))
"""


def test_the_clients_calls_put_new_pages_on_the_allocations_nodes(topo):
    """Affinity mode's co-design: a process on node 0's CPU puts the pages its thread touches on
    the node it binds (bind_thread), and a registered range's on the nodes of the allocation
    (MemoryRanges.follow), whichever CPU touches them."""
    far, near = topo.nodes - 1, 1
    out = subprocess.run([sys.executable, "-c", CLIENT_CALLS, str(far), str(near)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    got = {k: {int(n): p for n, p in v.items()} for k, v in json.loads(out.stdout).items()}
    assert set(got["thread"]) == {far} and got["thread"][far] >= 1024, got
    assert set(got["range"]) == {near} and got["range"][near] >= 1024, got
    assert set(got["default"]) == {0}, got


HUGE = r"""
import ctypes, mmap, os, sys
os.sched_setaffinity(0, [int(c) for c in sys.argv[1].split(",")])
MAP_HUGETLB = 0x40000  # include/uapi/asm-generic/mman-common.h (the mmap module lacks it)
m = mmap.mmap(-1, 4 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_HUGETLB)
for off in range(0, 4 << 20, 4096):
    m[off] = 1
print(ctypes.addressof(ctypes.c_char.from_buffer(m)), flush=True)
sys.stdin.read()
"""


class HugePages:
    """Reserves ``count`` 2 MiB pages on each of ``nodes`` for a block, then gives them back."""

    def __init__(self, nodes, count: int) -> None:
        self.paths = [f"/sys/devices/system/node/node{n}/hugepages/hugepages-2048kB/nr_hugepages" for n in nodes]
        self.count = count

    def __enter__(self) -> "HugePages":
        self.before = [read(p) for p in self.paths]
        for p in self.paths:
            with open(p, "w") as f:
                f.write(str(self.count))
        return self

    def __exit__(self, *exc) -> None:
        for p, value in zip(self.paths, self.before):
            with open(p, "w") as f:
                f.write(value)


def test_huge_pages_follow_a_task_too(topo, tmp_path):
    """A hugetlb mapping (2 MiB pages, numa_maps' kernelpagesize_kB=2048) is moved page by huge page."""
    old, new = 0, topo.nodes - 1
    if not os.path.exists("/sys/devices/system/node/node0/hugepages/hugepages-2048kB"):
        pytest.skip("the guest kernel has no 2 MiB huge pages")
    with NumaBalancing(False), HugePages([old, new], 4):
        task = subprocess.Popen([sys.executable, "-c", HUGE, ",".join(map(str, topo.node_cpus(old)))],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            addr = int(task.stdout.readline())
            assert node_pages(task.pid, addr) == {old: 2}, "two huge pages on the first node"
            enf = enforcer("affinity", str(tmp_path / "state"))
            try:
                enf.apply("db", [task.pid], topo.node_cpus(new), [new])
                settled(enf)
                assert node_pages(task.pid, addr) == {new: 2}
                (report,) = enf.moves["db"]
                assert report.bytes_moved >= 4 << 20, report
            finally:
                enf.close()
        finally:
            task.kill()
            task.wait()


TOO_BIG_SPILL_MIB = 64  # what does not fit the task's node: that much more than the node has free


def test_a_working_set_larger_than_its_node_gets_the_nearest_node_too(topo, tmp_path):
    """Huge pages reserved on the last node leave it about 128 MiB free; a task of two threads on
    its CPUs with a working set 64 MiB larger than that gets that node and the nearest other (by
    the guest's distances) as memory nodes, with the reason, in its cpuset; what it touches
    fills its node and the rest lands on the nearest node, none elsewhere."""
    from cod.facts.sysfs import discover
    from cod.rm.allocator.model import TaskSpec
    from cod.rm.enforce.livestate import node_free_bytes
    from cod.rm.pinning import Pinning
    from cod.rm.registry import Task

    node = topo.nodes - 1
    row = topo.distances[node]
    nearest = min((n for n in range(topo.nodes) if n != node), key=lambda n: (row[n], n))
    free_now = node_free_bytes()[node]
    with NumaBalancing(False), HugePages([node], max(0, (free_now >> 20) - 2 * TOO_BIG_SPILL_MIB) // 2):
        with MemTask(topo.node_cpus(node), threads=2) as task:
            free = node_free_bytes()[node]  # what the reservation left (it may have got fewer pages)
            per_cpu_mib = -(-((free >> 20) + TOO_BIG_SPILL_MIB) // 2)
            spec = TaskSpec("big", min_cores=2, max_cores=2, working_set_bytes=per_cpu_mib << 20)
            big = Task("big", task.pid, "memtest", 0, 0, spec, {})
            enf = enforcer("cpuset", str(tmp_path / "state"))
            pinning = Pinning(discover("/"), enf)
            try:
                assert pinning.pin(big, topo.node_cpus(node))
                choice = pinning.memory(big, topo.node_cpus(node))
                print(f"node {node} {free >> 20} MiB free, working set 2 x {per_cpu_mib} MiB: {choice}")
                assert choice.nodes == tuple(sorted((node, nearest))), choice
                assert "does not fit" in choice.reason and f"node {nearest} (distance {row[nearest]}," in choice.reason
                settled(enf)
                assert read(os.path.join(MOUNT.path, PARENT, "big", "cpuset.mems")) == fmt(choice.nodes)
                per_mapping = [node_pages(task.pid, addr) for addr in task.touch(per_cpu_mib)]
                print(f"pages per node of the two mappings of {per_cpu_mib} MiB: {per_mapping}")
                assert all(set(p) <= {node, nearest} for p in per_mapping), per_mapping
                # The two mappings may be one (the kernel merges neighbours): the whole process's count.
                spilled = 2 * per_cpu_mib * 256 - free // 4096  # at least what did not fit in the node's free memory
                assert process_pages(task.pid).get(nearest, 0) >= 0.8 * spilled, (per_mapping, spilled)
            finally:
                pinning.release(big)
                enf.close()


UNMODIFIED = r"""
import ctypes, mmap, os, sys
keep = []
for line in sys.stdin:  # "CPU MIB": run on CPU (the program places itself, as engines do) and touch MIB
    cpu, mib = (int(x) for x in line.split())
    os.sched_setaffinity(0, [cpu])
    keep.append(mmap.mmap(-1, 4096, prot=mmap.PROT_READ))  # a neighbour the next one cannot merge with
    m = mmap.mmap(-1, mib << 20)
    for off in range(0, mib << 20, 4096):
        m[off] = 1
    keep.append(m)
    print(ctypes.addressof(ctypes.c_char.from_buffer(m)), sorted(os.sched_getaffinity(0))[0], flush=True)
"""


def start_unmodified(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", UNMODIFIED], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=os.environ | env)


def touch_on(proc: subprocess.Popen, cpu: int, mib: int) -> tuple[dict[int, int], int]:
    """Where the pages the program touched on ``cpu`` are, and the CPU it ran on."""
    proc.stdin.write(f"{cpu} {mib}\n")
    proc.stdin.flush()
    line = proc.stdout.readline()
    assert line, proc.stderr.read()
    addr, ran_on = (int(x) for x in line.split())
    return node_pages(proc.pid, addr), ran_on


@pytest.mark.timeout(900)  # the daemon starts in tens of seconds to minutes under TCG
def test_an_unmodified_process_under_the_preload_puts_new_pages_on_its_memory_nodes(topo, tmp_path):
    """Affinity mode, a program that does not speak COD started with libcod_preload.so and
    COD_TASK: registered by the library, its pages touched from a CPU of a node it was not given
    (it placed itself there) land on its memory nodes; without the library the same program's
    pages land on that CPU's node (what the kernel does by itself)."""
    import time

    from rmguest import guest_daemon
    from test_cclient import BUILD, make
    from helpers.rm_support import RawConn

    make("all")
    with NumaBalancing(False), guest_daemon(tmp_path, "--enforce", "affinity") as d:
        proc = start_unmodified({"LD_PRELOAD": str(BUILD / "libcod_preload.so"), "COD_SOCKET": str(d.path),
                                 "COD_TASK": "db", "COD_TASK_MIN_CORES": str(topo.cpus_per_node),
                                 "COD_TASK_MAX_CORES": str(topo.cpus_per_node)})
        conn = RawConn(d.path)
        try:
            conn.sock.settimeout(SLOW)
            conn.hello("observer")
            deadline = time.monotonic() + SLOW
            while not (db := [a for a in conn.call("get_allocation", {})["result"]["tasks"] if a["task"] == "db"]):
                assert time.monotonic() < deadline and proc.poll() is None, "the library did not register the task"
                time.sleep(0.5)
            mems = set(db[0]["memory_nodes"])
            elsewhere = next(n for n in range(topo.nodes) if n not in mems)
            cpu = topo.node_cpus(elsewhere)[0]
            pages, ran_on = touch_on(proc, cpu, 16)
            print(f"db on nodes {sorted(mems)}, touched on CPU {ran_on} (node {elsewhere}): {pages}")
            assert ran_on == cpu and set(pages) <= mems and sum(pages.values()) >= 16 * 256, (pages, ran_on)
        finally:
            conn.close()
            proc.kill()
            proc.wait()
    plain = start_unmodified({})
    try:
        pages, ran_on = touch_on(plain, cpu, 16)
    finally:
        plain.kill()
        plain.wait()
    assert ran_on == cpu and set(pages) == {elsewhere}, pages

"""Discovery from sysfs: edge cases on small trees written in tmp_path, and this machine.

The three real-machine snapshots are checked against hwloc in test_facts_vs_hwloc.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from cod.facts import sysfs
from cod.facts.cpulist import format_cpulist
from cod.facts.model import FactsError
from cod.facts.text import memory_note, render

GIB_KB = 1 << 20


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def make_tree(root: Path, *, present=range(4), online=None, threads=1, package_of=None,
              nodes=None, caches=True, meminfo_kb=8 * GIB_KB, status=None,
              topology=True) -> Path:
    """A small Linux tree: CPUs ``present`` (online unless excluded by ``online``),
    SMT siblings in groups of ``threads`` consecutive numbers, package per CPU from
    ``package_of`` (default 0), NUMA nodes {id: cpus} (None: no node directory)."""
    present = list(present)
    online = present if online is None else list(online)
    cpu_dir = root / "sys/devices/system/cpu"
    write(cpu_dir / "online", format_cpulist(online) + "\n")
    write(cpu_dir / "present", format_cpulist(present) + "\n")
    for cpu in present:
        d = cpu_dir / f"cpu{cpu}"
        d.mkdir(parents=True, exist_ok=True)
        if cpu not in online:
            write(d / "online", "0\n")
            continue  # Linux removes topology/ and cache/ of an offline CPU
        first = cpu - cpu % threads
        siblings = [c for c in range(first, first + threads) if c in online]
        pkg = package_of(cpu) if package_of else 0
        pkg_cpus = [c for c in online if (package_of(c) if package_of else 0) == pkg]
        if topology:
            write(d / "topology/physical_package_id", f"{pkg}\n")
            write(d / "topology/core_id", f"{first}\n")
            write(d / "topology/thread_siblings_list", format_cpulist(siblings) + "\n")
            write(d / "topology/core_siblings_list", format_cpulist(pkg_cpus) + "\n")
        if caches:
            for index, (level, kind, size, shared) in enumerate([
                (1, "Data", "32K", siblings), (1, "Instruction", "32K", siblings),
                (2, "Unified", "1024K", siblings), (3, "Unified", "16384K", pkg_cpus)]):
                c = d / f"cache/index{index}"
                write(c / "level", f"{level}\n")
                write(c / "type", f"{kind}\n")
                write(c / "size", f"{size}\n")
                write(c / "shared_cpu_list", format_cpulist(shared) + "\n")
    if nodes is not None:
        node_dir = root / "sys/devices/system/node"
        write(node_dir / "online", format_cpulist(nodes) + "\n")
        for node, cpus in nodes.items():
            d = node_dir / f"node{node}"
            write(d / "cpulist", format_cpulist(cpus) + "\n")
            write(d / "meminfo", f"Node {node} MemTotal:       {meminfo_kb} kB\n"
                                 f"Node {node} MemFree:        {meminfo_kb // 2} kB\n"
                                 f"Node {node} MemUsed:        {meminfo_kb // 2} kB\n")
            write(d / "distance", " ".join("10" if n == node else "20" for n in nodes) + "\n")
    write(root / "proc/meminfo", f"MemTotal:       {meminfo_kb * max(1, len(nodes or {1: 0}))}"
                                 f" kB\nMemFree:        1024 kB\n")
    if status is not None:
        write(root / "proc/self/status", status)
    return root


def test_plain_two_node_machine(tmp_path):
    root = make_tree(tmp_path, present=range(8), threads=2, package_of=lambda c: c // 4,
                     nodes={0: [0, 1, 2, 3], 1: [4, 5, 6, 7]})
    m = sysfs.discover(root)
    assert [(p.id, p.cpus) for p in m.packages] == [(0, (0, 1, 2, 3)), (1, (4, 5, 6, 7))]
    assert [c.pus for c in m.cores] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert [c.id for c in m.cores] == [0, 2, 4, 6]
    assert [(n.id, n.memory_bytes, n.free_bytes) for n in m.numa_nodes] == \
        [(0, 8 << 30, 4 << 30), (1, 8 << 30, 4 << 30)]
    assert m.numa_nodes[0].distances == {0: 10, 1: 20}
    assert [(c.cpus, c.size_bytes) for c in m.l3_caches()] == \
        [((0, 1, 2, 3), 16 << 20), ((4, 5, 6, 7), 16 << 20)]
    assert {(p.id, p.core, p.package, p.numa_node) for p in m.pus} == \
        {(c, c - c % 2, c // 4, c // 4) for c in range(8)}
    assert m.allowed_cpus is None and m.allowed_mems is None


def test_no_cache_directories(tmp_path):
    m = sysfs.discover(make_tree(tmp_path, caches=False, nodes={0: [0, 1, 2, 3]}))
    assert m.caches == ()
    assert len(m.cores) == 4


def test_no_node_directory_means_one_node_with_all_memory(tmp_path):
    m = sysfs.discover(make_tree(tmp_path, nodes=None, meminfo_kb=4 * GIB_KB))
    assert len(m.numa_nodes) == 1
    node = m.numa_nodes[0]
    assert (node.id, node.cpus, node.memory_bytes) == (0, (0, 1, 2, 3), 4 << 30)
    assert node.free_bytes == 1024 * 1024
    assert {p.numa_node for p in m.pus} == {0}


def test_one_node_counted_short_by_the_kernel_gets_the_machines_memory(tmp_path):
    """Issue 32: a VM's kernel said node0 10.7 GiB while /proc/meminfo said 23.6 GiB, both agreeing
    on the memory in use; all memory of a one-node machine is that node's."""
    root = make_tree(tmp_path, nodes={0: [0, 1, 2, 3]}, meminfo_kb=4 * GIB_KB)
    write(root / "proc/meminfo", f"MemTotal: {12 * GIB_KB} kB\nMemFree: {10 * GIB_KB} kB\n")
    m = sysfs.discover(root)
    [node] = m.numa_nodes
    assert (node.memory_bytes, node.free_bytes, m.total_memory_bytes) == (12 << 30, 10 << 30, 12 << 30)
    assert memory_note(m) == ""
    assert "NUMANode P#0 (12 GiB, 10 GiB free)" in render(m)


def test_nodes_that_do_not_add_up_are_said_so(tmp_path):
    root = make_tree(tmp_path, nodes={0: [0, 1], 1: [2, 3]}, meminfo_kb=4 * GIB_KB)
    write(root / "proc/meminfo", f"MemTotal: {12 * GIB_KB} kB\nMemFree: {10 * GIB_KB} kB\n")
    m = sysfs.discover(root)
    assert [n.memory_bytes for n in m.numa_nodes] == [4 << 30, 4 << 30]  # which node lacks it is unknown
    assert "memory: the NUMA nodes count 8 GiB of the 12 GiB the kernel counts in all" in render(m)
    plain = sysfs.discover(make_tree(tmp_path / "plain", nodes={0: [0, 1], 1: [2, 3]}))
    assert memory_note(plain) == "" and "memory:" not in render(plain)


def test_offline_cpu(tmp_path):
    m = sysfs.discover(make_tree(tmp_path, present=range(4), online=[0, 1, 3],
                                 nodes={0: [0, 1, 3]}))
    assert [(p.id, p.online) for p in m.pus] == [(0, True), (1, True), (2, False), (3, True)]
    assert m.cpu_ids() == (0, 1, 3)
    assert all(2 not in c.pus for c in m.cores)
    assert all(2 not in c.cpus for c in m.caches)
    assert m.packages[0].cpus == (0, 1, 3)


def test_holes_in_cpu_numbering(tmp_path):
    cpus = [0, 1, 4, 5, 64, 65]
    m = sysfs.discover(make_tree(tmp_path, present=cpus, threads=2,
                                 package_of=lambda c: 0 if c < 64 else 1,
                                 nodes={0: [0, 1, 4, 5], 2: [64, 65]}))
    assert [p.id for p in m.pus] == cpus
    assert [c.pus for c in m.cores] == [(0, 1), (4, 5), (64, 65)]
    assert [n.id for n in m.numa_nodes] == [0, 2]
    assert m.numa_nodes[1].distances == {0: 20, 2: 10}


def test_without_topology_each_cpu_is_a_core_of_no_package(tmp_path):
    m = sysfs.discover(make_tree(tmp_path, topology=False, caches=False, nodes={0: [0, 1, 2, 3]}))
    assert m.packages == ()
    assert [c.pus for c in m.cores] == [(0,), (1,), (2,), (3,)]
    assert {p.package for p in m.pus} == {None}


def test_unknown_package_id_groups_by_package_siblings(tmp_path):
    # POWER: physical_package_id is -1; the siblings list still tells what goes together.
    root = make_tree(tmp_path, present=range(8), threads=4, package_of=lambda c: c // 4,
                     nodes={0: list(range(8))})
    for cpu in range(8):
        write(root / f"sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id", "-1\n")
    m = sysfs.discover(root)
    assert [(p.id, p.cpus) for p in m.packages] == [(0, (0, 1, 2, 3)), (4, (4, 5, 6, 7))]


def test_allowed_cpus_and_mems_from_proc_self_status(tmp_path):
    status = "Name:\tcod\nCpus_allowed:\t5\nCpus_allowed_list:\t0,2,9\nMems_allowed_list:\t1\n"
    m = sysfs.discover(make_tree(tmp_path, nodes={0: [0, 1], 1: [2, 3]}, status=status))
    assert m.allowed_cpus == (0, 2)  # 9 does not exist here
    assert m.allowed_mems == (1,)
    assert m.cpu_ids() == (0, 2)


def test_proc_root_can_point_elsewhere(tmp_path):
    root = make_tree(tmp_path / "a", nodes={0: [0, 1, 2, 3]})
    write(tmp_path / "p/self/status", "Cpus_allowed_list:\t3\nMems_allowed_list:\t0\n")
    m = sysfs.discover(root, proc_root=tmp_path / "p")
    assert m.allowed_cpus == (3,)


@pytest.mark.parametrize("relative, content, complaint", [
    ("sys/devices/system/node/node0/cpulist", "0-x\n", "bad cpulist item"),
    ("sys/devices/system/cpu/online", "zero\n", "bad cpulist item"),
    ("sys/devices/system/cpu/cpu1/topology/thread_siblings_list", "1,,\n", "bad cpulist item"),
    ("sys/devices/system/cpu/cpu0/topology/physical_package_id", "abc\n", "expected an integer"),
    ("sys/devices/system/cpu/cpu0/cache/index3/size", "lots\n", "expected a size"),
    ("sys/devices/system/node/node0/distance", "10 x\n", "expected integers"),
    ("sys/devices/system/node/node0/distance", "10 20 30\n", "3 distances for 2 nodes"),
    ("sys/devices/system/node/node1/meminfo", "Node 1 MemTotal: many kB\n", "bad MemTotal"),
    ("proc/self/status", "Cpus_allowed_list:\t0-\n", "Cpus_allowed_list"),
])
def test_garbage_names_the_file(tmp_path, relative, content, complaint):
    root = make_tree(tmp_path, nodes={0: [0, 1], 1: [2, 3]})
    write(root / relative, content)
    with pytest.raises(FactsError, match=complaint) as info:
        sysfs.discover(root)
    assert str(root / relative) in str(info.value)


def test_not_a_sysfs_tree(tmp_path):
    with pytest.raises(FactsError, match="no cpuN directories"):
        sysfs.discover(tmp_path)


# ---- this machine ---------------------------------------------------------------

@pytest.mark.skipif(not Path("/sys/devices/system/cpu").is_dir(), reason="not Linux")
def test_this_machine_as_this_process_sees_it():
    m = sysfs.discover("/")
    assert m.allowed_cpus == tuple(sorted(os.sched_getaffinity(0)))
    assert set(m.cpu_ids()) == os.sched_getaffinity(0)
    online = [p.id for p in m.pus if p.online]
    assert len(online) == os.sysconf("SC_NPROCESSORS_ONLN")
    assert sorted(pu for c in m.cores for pu in c.pus) == online
    assert sorted(cpu for n in m.numa_nodes for cpu in n.cpus) == online


@pytest.mark.skipif(shutil.which("hwloc-calc") is None, reason="hwloc tools not installed")
def test_this_machine_agrees_with_hwloc():
    m = sysfs.discover("/")

    def count(kind: str) -> int:
        out = subprocess.run(["hwloc-calc", "-N", kind, "all"], capture_output=True,
                             text=True, check=True, timeout=60).stdout
        return int(out.strip())

    assert len([p for p in m.pus if p.online]) == count("pu")
    assert len(m.cores) == count("core")
    assert len(m.packages) == count("package")
    assert len(m.numa_nodes) == count("numa")
    assert len(m.l3_caches()) == count("l3")


@pytest.mark.parametrize("text,table", [
    ("MemTotal:       24731708 kB\nMemFree:  3979136 kB\n", {"MemTotal": 24731708 * 1024, "MemFree": 3979136 * 1024}),
    ("Node 1 MemFree:        2048 kB\n", {"MemFree": 2048 * 1024}),  # a node's file: the prefix dropped
    ("HugePages_Total:       4\n", {"HugePages_Total": 4}),  # a count, not a size
    ("bogus line\nMemFree: lots kB\n: 5 kB\n", {}),  # other shapes are skipped
])
def test_one_parser_reads_every_meminfo_file(text, table):
    from cod.facts.sysfs import parse_meminfo
    assert parse_meminfo(text) == table


def test_a_meminfo_line_without_its_figure_is_an_error(tmp_path):
    root = make_tree(tmp_path, nodes={0: [0, 1, 2, 3]})
    (root / "sys/devices/system/node/node0/meminfo").write_text("Node 0 MemTotal: many kB\n")
    with pytest.raises(FactsError, match="bad MemTotal line 'Node 0 MemTotal: many kB'"):
        sysfs.discover(root)

"""Allocation modes (paper Section IV-B) on synthetic and real topologies, and numa_maps."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cod.facts import hwloc_xml, machines
from cod.facts.synthetic import Shape, build
from cod.rm.elastic.errors import ElasticError
from cod.rm.elastic.group import PidTreeGroup
from cod.rm.elastic.measure import GroupMeter
from cod.rm.elastic.modes import Layout, choose_grant, choose_release, effective_mode
from helpers.data import DATA, HWLOC_DIR

NUMA_MAPS = DATA / "elastic" / "numa_maps"
HWLOC_FILES = sorted(HWLOC_DIR.glob("*.xml"))


def grant_sequence(layout, mode, k, available=None, pages=None):
    held: list[int] = []
    available = set(layout.cpus) if available is None else set(available)
    for _ in range(k):
        cpu = choose_grant(layout, mode, held, available, pages)
        if cpu is None:
            break
        held.append(cpu)
    return held


# ---- the paper's machine: 4 nodes x 4 cores (Fig. 2 and Fig. 12) ------------------------------

PAPER = Layout.from_machine(machines.load("shanghai"))  # 4 x quad-core Opteron 8380, 4 nodes


def test_paper_machine_core_function():
    d = 4  # "a d-ary node machine, d = 4 by Fig. 12"
    assert PAPER.nodes == (0, 1, 2, 3)
    for i in PAPER.nodes:
        for j in range(d):
            assert PAPER.cpus_of[i][j] == d * i + j  # core(i, j) = d.i + j


def test_paper_dense_fills_a_node_then_the_next():
    assert grant_sequence(PAPER, "dense", 6) == [0, 1, 2, 3, 4, 5]


def test_paper_sparse_puts_each_core_on_another_node():
    assert grant_sequence(PAPER, "sparse", 6) == [0, 4, 8, 12, 1, 5]


@pytest.mark.parametrize("mode", ["dense", "sparse", "adaptive"])
def test_release_undoes_the_last_grant(mode):
    held = grant_sequence(PAPER, mode, 7, pages={1: 50, 3: 10})
    for _ in range(6):
        cpu = choose_release(PAPER, mode, held, pages={1: 50, 3: 10})
        assert cpu == held[-1] or mode == "adaptive"
        held.remove(cpu)
    assert len(held) == 1


# ---- adaptive priority over synthetic numa_maps ---------------------------------------------------

def stat_line(pid: int, comm: str, ppid: int, start: int) -> str:
    rest = ["0"] * 50
    rest[0], rest[1], rest[17], rest[19] = "S", str(ppid), "1", str(start)
    return f"{pid} ({comm}) " + " ".join(rest) + "\n"


@pytest.fixture
def fake_proc(tmp_path: Path) -> Path:
    """A /proc with a postmaster (100), its backends (101, 102, 103) and an unrelated process (200)."""
    procs = {100: ("postmaster", 1, "postmaster"), 101: ("postgres", 100, "backend_a"),
             102: ("postgres", 100, "backend_b"), 103: ("postgres", 100, "interleaved"),
             200: ("other", 1, "backend_b")}
    for pid, (comm, ppid, maps) in procs.items():
        d = tmp_path / str(pid)
        (d / "task" / str(pid)).mkdir(parents=True)
        (d / "stat").write_text(stat_line(pid, comm, ppid, 1000 + pid))
        shutil.copy(NUMA_MAPS / f"{maps}.numa_maps", d / "numa_maps")
    return tmp_path


def test_group_pages_from_numa_maps_files(fake_proc):
    group = PidTreeGroup([100], proc=str(fake_proc))
    assert sorted(m.pid for m in group.members()) == [100, 101, 102, 103]  # not 200
    pages = GroupMeter(group, proc=str(fake_proc)).pages()
    # Base pages; backend_b's 40 huge pages of 2 MiB weigh 40 * 512.
    assert pages == {0: 7957, 1: 1020, 2: 49136, 3: 23016}
    assert pages[2] > pages[3] > pages[0] > pages[1]


def test_adaptive_allocates_on_the_nodes_with_the_most_pages(fake_proc):
    group = PidTreeGroup([100], proc=str(fake_proc))
    pages = GroupMeter(group, proc=str(fake_proc)).pages()
    held = grant_sequence(PAPER, "adaptive", 16, pages=pages)
    # Node 2 (CPUs 8-11), then node 3, node 0, node 1: the priority queue's order.
    assert held == [8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7]
    releases = []
    for _ in range(15):
        cpu = choose_release(PAPER, "adaptive", held, pages)
        releases.append(cpu)
        held.remove(cpu)
    # Lowest priority first: node 1, node 0, node 3, then node 2 down to its first CPU.
    assert releases == [7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9]
    assert held == [8]


def test_adaptive_skips_a_full_node_and_cpus_taken_by_others():
    pages = {2: 100, 0: 50}
    available = set(PAPER.cpus) - {8, 9, 10}  # the global allocation gave most of node 2 away
    assert grant_sequence(PAPER, "adaptive", 3, available, pages) == [11, 0, 1]


def test_adaptive_without_pages_keeps_to_its_node_then_lowest():
    assert grant_sequence(PAPER, "adaptive", 5, pages={}) == [0, 1, 2, 3, 4]
    # Holding CPUs on node 3 already: grow there first (ties go to where the group is).
    assert choose_grant(PAPER, "adaptive", [12], set(PAPER.cpus), {}) == 13


def test_adaptive_release_ties_go_to_the_node_with_fewer_cpus():
    held = [0, 1, 2, 4]  # three on node 0, one on node 1, no pages known
    assert choose_release(PAPER, "adaptive", held, {}) == 4


def test_hugepages_change_the_order():
    # Counted as one page each, node 3's huge pages would lose to node 0 (see the data README).
    naive = {0: 7957, 1: 1020, 2: 49136, 3: 23016 - 40 * 512 + 40}
    assert grant_sequence(PAPER, "adaptive", 5, pages=naive)[4] == 0
    weighted = {0: 7957, 1: 1020, 2: 49136, 3: 23016}
    assert grant_sequence(PAPER, "adaptive", 5, pages=weighted)[4] == 12


def test_one_node_machine_says_so_and_falls_back_to_dense():
    layout = Layout.from_machine(hwloc_xml.load(HWLOC_DIR / "2i386-2c-nohugepage.xml"))
    mode, note = effective_mode(layout, "adaptive")
    assert mode == "dense" and "one NUMA node" in note
    assert grant_sequence(layout, "adaptive", 2, pages={0: 10}) == grant_sequence(layout, "dense", 2)
    assert effective_mode(PAPER, "adaptive") == ("adaptive", "")


def test_memory_only_node_pages_count_for_the_nearest_cpu_node():
    knl = Layout.from_machine(hwloc_xml.load(HWLOC_DIR / "8intel64-fakeKNL-A2A-hybrid.rootattachednumas.xml"))
    assert knl.nodes == (0,) and knl.fold[1] == 0  # MCDRAM (node 1) has no CPUs
    assert knl.fold_pages({1: 500, 0: 5}) == {0: 505}


def test_unknown_mode_and_empty_machine_are_refused():
    with pytest.raises(ElasticError, match="unknown elastic mode"):
        effective_mode(PAPER, "random")
    with pytest.raises(ElasticError, match="no usable CPU"):
        Layout.from_machine(machines.load("shanghai"), allowed=[999])


# ---- every real topology: the modes' invariants ----------------------------------------------------

@pytest.mark.parametrize("path", HWLOC_FILES, ids=[p.name for p in HWLOC_FILES])
def test_modes_on_real_topologies(path):
    machine = hwloc_xml.load(path)
    layout = Layout.from_machine(machine)
    cpus = set(machine.cpu_ids())
    dense, sparse = layout.dense_order(), layout.sparse_order()
    assert sorted(dense) == sorted(sparse) == sorted(cpus)  # each order lists every CPU once
    # Dense: node by node.
    nodes_in_dense = [layout.node_of(c) for c in dense]
    assert nodes_in_dense == sorted(nodes_in_dense, key=layout.nodes.index)
    # Sparse: the first len(nodes) grants land on distinct nodes.
    first = sparse[:len(layout.nodes)]
    assert len({layout.node_of(c) for c in first}) == len(layout.nodes)
    # Within a node, physical cores come before SMT siblings.
    pu_core = {pu.id: pu.core for pu in machine.pus}
    for node, node_cpus in layout.cpus_of.items():
        n_cores = len({pu_core[c] for c in node_cpus})
        assert len({pu_core[c] for c in node_cpus[:n_cores]}) == n_cores
    # Grant all, release all: every mode ends where it started.
    for mode in ("dense", "sparse", "adaptive"):
        pages = {layout.nodes[-1]: 10} if mode == "adaptive" else None
        held = grant_sequence(layout, mode, len(cpus), pages=pages)
        assert sorted(held) == sorted(cpus)
        assert choose_grant(layout, mode, held, cpus, pages) is None
        if mode == "adaptive" and len(layout.nodes) > 1:
            assert layout.node_of(held[0]) == layout.nodes[-1]  # the node with the pages
        while len(held) > 1:
            held.remove(choose_release(layout, mode, held, pages))
        assert len(held) == 1


def test_node_numbers_out_of_cpu_order():
    # hwloc's 16amd64: node 0 holds CPUs 2-3 and node 1 CPUs 0-1; ids are the OS's.
    layout = Layout.from_machine(hwloc_xml.load(HWLOC_DIR / "16amd64-4distances.xml"))
    assert layout.cpus_of[0] == (2, 3) and layout.cpus_of[1] == (0, 1)
    assert grant_sequence(layout, "dense", 3) == [2, 3, 0]
    assert grant_sequence(layout, "sparse", 3) == [2, 0, 4]


def test_smt_siblings_come_after_the_cores_of_a_node():
    machine = build(Shape("smt2x2", packages=2, dies_per_package=1, cores_per_die=2, threads_per_core=2))
    layout = Layout.from_machine(machine)
    # Linux numbering: CPUs 0-3 are first threads, 4-7 their siblings.
    assert layout.cpus_of[0] == (0, 1, 4, 5) and layout.cpus_of[1] == (2, 3, 6, 7)
    assert grant_sequence(layout, "sparse", 8) == [0, 2, 1, 3, 4, 6, 5, 7]


def test_numa_maps_bytes_weigh_each_mapping_by_its_page_size():
    from cod.rm.enforce.livestate import parse_numa_maps, parse_numa_maps_bytes

    text = (NUMA_MAPS / "backend_b.numa_maps").read_bytes()
    assert parse_numa_maps(text) == {0: 900, 3: 1500 + 40 + 36}  # pages, whatever their size
    assert parse_numa_maps_bytes(text) == {0: 900 * 4096, 3: (1500 + 36) * 4096 + 40 * 2 * 1024 * 1024}

"""Our picture of real machines must agree with hwloc's.

* every sysfs snapshot in tests/data/topologies/linux-sysfs/ is unpacked and
  discovered; the expected picture is parsed from hwloc's own ``lstopo -v``
  output stored beside it (NAME.output);
* every XML in tests/data/topologies/hwloc/ is imported; the expected picture
  comes from running hwloc's tools on the same file now (``lstopo-no-graphics
  --input FILE -v`` for the tree, ``hwloc-info --input FILE numa:all`` for
  exact node memory).  A file dropped into the folder is tested too.

Compared: packages (id where hwloc has one, and their PUs), NUMA nodes (id,
PUs, memory), the node distance matrix, L3 caches, cores (as PU sets) and PUs.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cod.facts import hwloc_xml, sysfs
from cod.facts.model import Machine
from helpers.data import HWLOC_DIR, SYSFS_DIR

SNAPSHOTS = sorted(SYSFS_DIR.glob("*.tar.bz2"))
XML_FILES = sorted(HWLOC_DIR.glob("*.xml"))
HAVE_HWLOC = shutil.which("lstopo-no-graphics") is not None and shutil.which("hwloc-info")


# ---- hwloc's text output, parsed into a tree --------------------------------------

_LINE = re.compile(r"^(?P<indent> *)(?P<type>[A-Za-z][A-Za-z0-9]*)(?:\([^)]*\))?"
                   r"(?: L#(?P<logical>\d+))?(?: \((?P<attrs>[^\n]*)\))?")
_MEMORY_SIDE = {"NUMANode", "MemCache"}


@dataclass
class _Node:
    type: str
    os_index: int | None
    logical: int | None
    attrs: str
    parent: "_Node | None"
    children: list["_Node"] = field(default_factory=list)
    pus: set[int] = field(default_factory=set)


@dataclass
class Expected:
    packages: dict[int | None, list[frozenset[int]]]  # os index (None: none) -> PU sets
    nodes: dict[int, frozenset[int]]  # os index -> PUs
    node_memory_kib: dict[int, int | None]
    # Every NUMA latency matrix hwloc shows (v1 imports may yield several, see below).
    distances: list[dict[int, dict[int, int]]]
    l3: list[frozenset[int]]
    cores: list[frozenset[int]]
    pus: set[int]


def parse_lstopo(text: str) -> Expected:
    """The tree of ``lstopo -v`` text, and the first NUMA latency matrix after it."""
    lines = text.splitlines()
    root: _Node | None = None
    stack: list[tuple[int, _Node]] = []
    all_nodes: list[_Node] = []
    i = 0
    for i, line in enumerate(lines):
        if line.startswith("depth ") or not line.strip():
            break
        m = _LINE.match(line)
        if m is None:
            continue
        indent = len(m.group("indent"))
        attrs = m.group("attrs") or ""
        os_match = re.match(r"P#(\d+)", attrs)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else None
        node = _Node(m.group("type"), int(os_match.group(1)) if os_match else None,
                     int(m.group("logical")) if m.group("logical") else None, attrs, parent)
        if parent is None:
            root = node
        else:
            parent.children.append(node)
        stack.append((indent, node))
        all_nodes.append(node)
    assert root is not None, "no tree in lstopo output"

    def fill(node: _Node) -> set[int]:
        if node.type == "PU":
            node.pus = {node.os_index}
        for child in node.children:
            node.pus |= fill(child)
        return node.pus

    fill(root)

    def cpu_side_pus(node: _Node) -> frozenset[int]:
        # A NUMA node (or MemCache) hangs off a CPU-side object: its CPUs are that one's.
        up = node.parent
        while up is not None and up.type in _MEMORY_SIDE:
            up = up.parent
        return frozenset(up.pus if up is not None else root.pus)

    packages: dict[int | None, list[frozenset[int]]] = {}
    nodes: dict[int, frozenset[int]] = {}
    memory: dict[int, int | None] = {}
    logical_nodes: dict[int, int] = {}  # the matrix is by logical index (L#)
    for node in all_nodes:
        if node.type == "Package":
            packages.setdefault(node.os_index, []).append(frozenset(node.pus))
        elif node.type == "NUMANode":
            nodes[node.os_index] = cpu_side_pus(node)
            local = re.search(r"local=(\d+)KB", node.attrs)
            memory[node.os_index] = int(local.group(1)) if local else None
            logical_nodes[node.logical] = node.os_index

    distances: list[dict[int, dict[int, int]]] = []
    for j in range(i, len(lines)):
        if lines[j].startswith("Relative latency matrix") and "NUMANodes" in lines[j]:
            assert "by logical indexes" in lines[j]
            # Rows and columns come in the matrix's own order, labelled by logical index.
            n = len(logical_nodes)
            columns = [logical_nodes[int(v)] for v in lines[j + 1].split()[1:]]
            rows = [lines[j + 2 + r].split() for r in range(n)]
            distances.append({logical_nodes[int(row[0])]: dict(zip(columns, map(int, row[1:])))
                              for row in rows})

    return Expected(
        packages=packages,
        nodes=nodes,
        node_memory_kib=memory,
        distances=distances,
        l3=[frozenset(n.pus) for n in all_nodes if n.type == "L3Cache"],
        cores=[frozenset(n.pus) for n in all_nodes if n.type == "Core"],
        pus=set(root.pus),
    )


def _sets(groups) -> list[tuple[int, ...]]:
    """Groups of CPUs in a canonical order (frozensets only order partially)."""
    return sorted(tuple(sorted(g)) for g in groups)


def assert_agrees(machine: Machine, expected: Expected) -> None:
    # PUs and cores (a core is its set of PUs; its id is their lowest number).
    assert {p.id for p in machine.pus if p.online} == expected.pus
    assert _sets(c.pus for c in machine.cores) == _sets(expected.cores)
    assert all(c.id == min(c.pus) for c in machine.cores)
    # Packages: same PU sets; same ids wherever hwloc knows the OS number.
    assert _sets(p.cpus for p in machine.packages) == \
        _sets(s for sets in expected.packages.values() for s in sets)
    for os_index, sets in expected.packages.items():
        if os_index is not None:
            assert [frozenset(p.cpus) for p in machine.packages if p.id == os_index] == sets
    # NUMA nodes: ids, CPUs and memory.
    assert {n.id: frozenset(n.cpus) for n in machine.numa_nodes} == expected.nodes
    for node in machine.numa_nodes:
        kib = expected.node_memory_kib[node.id]
        assert (None if node.memory_bytes is None else node.memory_bytes // 1024) == kib, node.id
    # The latency matrix, by OS node numbers.  hwloc 2 imports every v1 matrix of
    # as many objects as there are nodes as a NUMA matrix (16amd64-4distances.v1
    # gets its Package matrix too); ours must be one of them, and
    # test_v1_and_v2_exports_of_one_machine_agree checks it is the right one.
    ours = {n.id: n.distances for n in machine.numa_nodes if n.distances}
    if expected.distances:
        assert ours in expected.distances
    else:
        assert ours == {}
    # L3 caches.
    assert _sets(c.cpus for c in machine.l3_caches()) == _sets(expected.l3)


# ---- sysfs snapshots ------------------------------------------------------------------

@pytest.fixture(scope="module")
def unpacked(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("sysfs")
    roots = {}
    for tarball in SNAPSHOTS:
        with tarfile.open(tarball) as tar:
            tar.extractall(base, filter="tar")
        roots[tarball.name.removesuffix(".tar.bz2")] = base / tarball.name.removesuffix(".tar.bz2")
    return roots


def test_snapshots_are_present():
    assert SNAPSHOTS, f"no sysfs snapshots under {SYSFS_DIR}"


@pytest.mark.parametrize("tarball", SNAPSHOTS, ids=lambda p: p.name.removesuffix(".tar.bz2"))
def test_sysfs_snapshot_matches_lstopo(tarball: Path, unpacked):
    name = tarball.name.removesuffix(".tar.bz2")
    expected = parse_lstopo(tarball.with_name(name + ".output").read_text())
    machine = sysfs.discover(unpacked[name])
    assert_agrees(machine, expected)
    # sysfs gives exact kB figures and free memory too.
    for node in machine.numa_nodes:
        assert node.memory_bytes == expected.node_memory_kib[node.id] * 1024
        assert node.free_bytes is not None and 0 < node.free_bytes <= node.memory_bytes


# ---- hwloc XML exports ----------------------------------------------------------------

def _hwloc_tool(*args: str) -> str:
    return subprocess.run(args, check=True, capture_output=True, text=True, timeout=60).stdout


def test_xml_folder_is_present():
    assert XML_FILES, f"no hwloc XML files under {HWLOC_DIR}"


@pytest.mark.skipif(not HAVE_HWLOC, reason="hwloc tools (Debian package hwloc) not installed")
@pytest.mark.parametrize("path", XML_FILES, ids=lambda p: p.name)
def test_hwloc_xml_matches_hwloc_tools(path: Path):
    expected = parse_lstopo(_hwloc_tool("lstopo-no-graphics", "--input", str(path), "-v", "-"))
    machine = hwloc_xml.load(path)
    assert_agrees(machine, expected)
    # Exact bytes per node from hwloc-info (lstopo prints KiB).
    info = _hwloc_tool("hwloc-info", "--input", str(path), "numa:all")
    exact: dict[int, int | None] = {}
    for block in info.split("NUMANode L#")[1:]:
        os_index = int(re.search(r"os index = (\d+)", block).group(1))
        local = re.search(r"local memory = (\d+)", block)
        exact[os_index] = int(local.group(1)) if local else None
    got = {n.id: n.memory_bytes for n in machine.numa_nodes}
    # hwloc-info says 0 where the file has no local_memory; we say unknown.
    assert got == {k: (v or None) for k, v in exact.items()}


def test_v1_and_v2_exports_of_one_machine_agree():
    v1 = hwloc_xml.load(HWLOC_DIR / "16amd64-4distances.v1.xml")
    v2 = hwloc_xml.load(HWLOC_DIR / "16amd64-4distances.xml")
    for attr in ("packages", "numa_nodes", "caches", "cores", "pus", "total_memory_bytes"):
        assert getattr(v1, attr) == getattr(v2, attr), attr


@pytest.mark.skipif(not HAVE_HWLOC, reason="hwloc's tools are not installed")
@pytest.mark.parametrize("whole", [False, True], ids=["allowed-only", "whole-system"])
def test_an_export_with_a_restricted_allowed_set_reads_as_hwloc_shows_it(tmp_path: Path, whole: bool):
    # An export made inside a cpuset: half of package 0 and its two nodes allowed.
    text = (HWLOC_DIR / "64amd64-4p2n4ca2co.xml").read_text()
    text = re.sub(r'allowed_cpuset="[^"]*"', 'allowed_cpuset="0x0000ffff"', text, count=1)
    text = re.sub(r'allowed_nodeset="[^"]*"', 'allowed_nodeset="0x00000003"', text, count=1)
    path = tmp_path / "restricted.xml"
    path.write_text(text)
    from cod.facts import from_args

    machine = from_args(hwloc=path, whole_system=whole)
    args = ["--input", str(path), "-v", "-"] + (["--whole-system"] if whole else [])
    assert_agrees(machine, parse_lstopo(_hwloc_tool("lstopo-no-graphics", *args)))
    if whole:
        assert machine.allowed_cpus == tuple(range(16)) and machine.allowed_mems == (0, 1)
        assert machine.cpu_ids() == tuple(range(16))
    else:
        assert machine.allowed_cpus is None and {pu.id for pu in machine.pus} == set(range(16))

"""The four machines of the COD paper (Section 7.1) as fact files."""

from __future__ import annotations

import json

import pytest

from cod.facts import machines
from cod.facts.synthetic import REFERENCE_SHAPES, build

GIB = 1 << 30
MIB = 1 << 20

# name: (packages, NUMA nodes, bytes per node, L3 caches, bytes per L3, CPUs)
PAPER = {
    "magnycours": (4, 8, 16 * GIB, 8, 5 * MIB, 48),
    "barcelona": (8, 8, 2 * GIB, 8, 2 * MIB, 32),
    "shanghai": (4, 4, 4 * GIB, 4, 6 * MIB, 16),
    "nehalem-ex": (4, 4, 32 * GIB, 4, 24 * MIB, 32),
}


def test_every_reference_machine_has_a_file() -> None:
    assert machines.names() == sorted(PAPER)


@pytest.mark.parametrize("name", sorted(PAPER))
def test_files_are_in_step_with_the_generator(name: str) -> None:
    on_disk = json.loads((machines.MACHINES_DIR / f"{name}.json").read_text())
    assert on_disk == json.loads(json.dumps(build(REFERENCE_SHAPES[name]).to_dict()))


@pytest.mark.parametrize("name", sorted(PAPER))
def test_shape_matches_the_paper(name: str) -> None:
    packages, nodes, node_bytes, l3s, l3_bytes, cpus = PAPER[name]
    m = machines.load(name)
    assert len(m.packages) == packages
    assert len(m.numa_nodes) == nodes
    assert all(n.memory_bytes == node_bytes for n in m.numa_nodes)
    assert len(m.l3_caches()) == l3s
    assert all(c.size_bytes == l3_bytes for c in m.l3_caches())
    assert len(m.cpu_ids()) == cpus == len(m.cores)  # no SMT on any of them
    # one id space: a core's id is its lowest CPU, every CPU in exactly one node
    assert all(c.id == min(c.pus) for c in m.cores)
    node_cpus = sorted(cpu for n in m.numa_nodes for cpu in n.cpus)
    assert node_cpus == list(m.cpu_ids())
    # distances: 10 on the diagonal, symmetric
    for a in m.numa_nodes:
        assert a.distances[a.id] == 10
        for b in m.numa_nodes:
            assert a.distances[b.id] == b.distances[a.id]


def test_unknown_machine_names_the_known_ones() -> None:
    with pytest.raises(machines.FactsError, match="magnycours"):
        machines.load("pdp11")

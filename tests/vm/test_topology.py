"""The guest's sysfs is the machine qemu was given: nodes, CPUs, distances, memory per node,
read through COD's own reader (facts/sysfs.py) and through the SKB's facts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cod.facts.sysfs import discover
from topologies import NODE_MEMORY_MIB


@pytest.fixture(scope="module")
def machine():
    return discover("/")


def test_nodes_and_their_cpus(machine, topo):
    assert [n.id for n in machine.numa_nodes] == list(range(topo.nodes))
    for node in machine.numa_nodes:
        assert node.cpus == topo.node_cpus(node.id)
    assert machine.cpu_ids() == tuple(range(topo.cpus))


def test_distances_are_the_matrix_qemu_was_given(machine, topo):
    for node in machine.numa_nodes:
        assert node.distances == {dst: topo.distances[node.id][dst] for dst in range(topo.nodes)}


def test_each_node_has_the_memory_it_was_given(machine, topo):
    given = NODE_MEMORY_MIB << 20
    for node in machine.numa_nodes:
        # The kernel keeps some of each node for itself (and node 0 holds the kernel image).
        assert 0.75 * given <= node.memory_bytes <= given, (node.id, node.memory_bytes)


def test_cgroup_v2_alone_with_the_cpuset_controller():
    with open("/proc/self/mounts") as f:
        kinds = {line.split()[2] for line in f}
    assert "cgroup2" in kinds and "cgroup" not in kinds
    with open("/sys/fs/cgroup/cgroup.controllers") as f:
        assert {"cpuset", "memory"} <= set(f.read().split())


def test_cod_facts_json_is_the_given_machine(topo):
    """The CLI a person runs on the guest (`cod facts --format json`) says the same."""
    out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "cod"), "facts", "--format", "json"], capture_output=True, text=True, timeout=600, check=True).stdout
    nodes = json.loads(out)["numa_nodes"]
    assert [(n["id"], n["cpus"]) for n in nodes] == [(i, list(topo.node_cpus(i))) for i in range(topo.nodes)]
    assert [[n["distances"][str(d)] for d in range(topo.nodes)] for n in nodes] == [list(r) for r in topo.distances]

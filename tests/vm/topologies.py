"""The guests' NUMA topologies: what qemu is given, and what the guest tests expect to find.

One table read by both sides: the host runner (vmrun.py) turns a topology into virtme-ng's
``--cpus/--memory/--numa/--numa-distance`` options, and the tests inside the guest compare the
guest's sysfs with the same entry (the runner names it in ``COD_VM_TOPOLOGY``).
"""

from __future__ import annotations

from dataclasses import dataclass

NODE_MEMORY_MIB = 1024
ENV = "COD_VM_TOPOLOGY"


@dataclass(frozen=True)
class Topology:
    name: str
    nodes: int
    cpus_per_node: int
    distances: tuple[tuple[int, ...], ...]  # the full matrix, row = from, column = to

    @property
    def cpus(self) -> int:
        return self.nodes * self.cpus_per_node

    def node_cpus(self, node: int) -> tuple[int, ...]:
        first = node * self.cpus_per_node
        return tuple(range(first, first + self.cpus_per_node))

    def vng_args(self) -> list[str]:
        """virtme-ng's options for this machine: qemu wants every ordered pair's distance."""
        args = ["--cpus", str(self.cpus), "--memory", f"{self.nodes * NODE_MEMORY_MIB}M"]
        for node in range(self.nodes):
            cpus = self.node_cpus(node)
            args += ["--numa", f"{NODE_MEMORY_MIB}M,cpus={cpus[0]}-{cpus[-1]}"]
        for src in range(self.nodes):
            for dst in range(self.nodes):
                if src != dst:
                    args += ["--numa-distance", f"{src},{dst}={self.distances[src][dst]}"]
        return args


TOPOLOGIES = {
    "2x2": Topology("2x2", 2, 2, ((10, 21), (21, 10))),
    # The paper's MagnyCours: the two dies of one package at 16, the other package at 22
    # (facts/machines/magnycours.json has the same pattern over 8 nodes).
    "4x2": Topology("4x2", 4, 2, ((10, 16, 22, 22), (16, 10, 22, 22), (22, 22, 10, 16), (22, 22, 16, 10))),
}


def topology(name: str) -> Topology:
    try:
        return TOPOLOGIES[name]
    except KeyError:
        raise ValueError(f"unknown guest topology {name!r}: use one of {', '.join(TOPOLOGIES)}") from None

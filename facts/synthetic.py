"""Regular machines built from a short description.

Used for the reference machines of the COD paper (facts/machines/) and for
synthetic machines in benchmarks.  CPU numbering follows what Linux does on
such boxes: CPUs are numbered core by core through dies and packages, and SMT
siblings of the first thread come after all first threads (as on Intel),
unless ``smt_adjacent`` says the siblings are adjacent numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import PU, Cache, Core, Machine, NumaNode, Package

GIB = 1 << 30
MIB = 1 << 20
KIB = 1 << 10


@dataclass(frozen=True)
class Shape:
    name: str
    packages: int
    dies_per_package: int
    cores_per_die: int
    threads_per_core: int = 1
    # One NUMA node per die (True, e.g. MagnyCours) or per package (False).
    node_per_die: bool = False
    node_memory_bytes: int = 16 * GIB
    l3_bytes_per_die: int | None = None  # None: the machine has no L3
    l2_bytes_per_core: int = 512 * KIB
    l1d_bytes_per_core: int = 64 * KIB
    smt_adjacent: bool = False
    # SLIT-style distances: local, same package, remote.
    distance_local: int = 10
    distance_same_package: int = 16
    distance_remote: int = 22
    # Attainable STREAM-triad bandwidth of one NUMA node, bytes/s (None: unknown).
    node_bandwidth_bytes_per_s: int | None = None


def build(shape: Shape) -> Machine:
    s = shape
    n_cores = s.packages * s.dies_per_package * s.cores_per_die
    n_pus = n_cores * s.threads_per_core

    def cpu_of(core_index: int, thread: int) -> int:
        if s.smt_adjacent:
            return core_index * s.threads_per_core + thread
        return thread * n_cores + core_index

    packages: list[Package] = []
    nodes: list[NumaNode] = []
    caches: list[Cache] = []
    cores: list[Core] = []
    pus: list[PU] = []
    node_cpus: dict[int, list[int]] = {}
    node_pkg: dict[int, int] = {}

    core_index = 0
    for pkg in range(s.packages):
        pkg_cpus: list[int] = []
        for die in range(s.dies_per_package):
            node = pkg * s.dies_per_package + die if s.node_per_die else pkg
            node_pkg[node] = pkg
            die_cpus: list[int] = []
            for _ in range(s.cores_per_die):
                threads = tuple(sorted(cpu_of(core_index, t) for t in range(s.threads_per_core)))
                core_id = threads[0]
                cores.append(Core(core_id, pkg, node, threads))
                for cpu in threads:
                    pus.append(PU(cpu, core_id, pkg, node))
                caches.append(Cache(1, "data", s.l1d_bytes_per_core, threads))
                caches.append(Cache(2, "unified", s.l2_bytes_per_core, threads))
                die_cpus.extend(threads)
                core_index += 1
            die_cpus.sort()
            if s.l3_bytes_per_die is not None:
                caches.append(Cache(3, "unified", s.l3_bytes_per_die, tuple(die_cpus)))
            node_cpus.setdefault(node, []).extend(die_cpus)
            pkg_cpus.extend(die_cpus)
        packages.append(Package(pkg, tuple(sorted(pkg_cpus))))

    node_ids = sorted(node_cpus)
    for node in node_ids:
        distances = {}
        for other in node_ids:
            if other == node:
                d = s.distance_local
            elif node_pkg[other] == node_pkg[node]:
                d = s.distance_same_package
            else:
                d = s.distance_remote
            distances[other] = d
        nodes.append(
            NumaNode(
                id=node,
                cpus=tuple(sorted(node_cpus[node])),
                memory_bytes=s.node_memory_bytes,
                free_bytes=s.node_memory_bytes,
                distances=distances,
                bandwidth_bytes_per_s=s.node_bandwidth_bytes_per_s,
            )
        )

    assert len(pus) == n_pus
    caches.sort(key=lambda c: (c.level, c.cpus))
    return Machine(
        name=s.name,
        source=f"machine:{s.name}",
        packages=tuple(packages),
        numa_nodes=tuple(nodes),
        caches=tuple(caches),
        cores=tuple(sorted(cores, key=lambda c: c.id)),
        pus=tuple(sorted(pus, key=lambda p: p.id)),
        total_memory_bytes=s.node_memory_bytes * len(nodes),
    )


GB = 10**9

# The four machines of the COD paper, Section 7.1.
#
# Node bandwidth: the deployment paper (Giceva et al., VLDB 2015) measured it with
# STREAM but prints no figure in its text, so these are documented defaults from
# published STREAM Triad results for the same processors (docs/deploy.md, "NUMA
# bandwidth facts"); measure a real machine with `cod bandwidth`.
REFERENCE_SHAPES: dict[str, Shape] = {
    # 4 x Opteron 6174: two 6-core dies per package, a 5 MiB L3 and a 16 GiB node per die.
    "magnycours": Shape(
        "magnycours", packages=4, dies_per_package=2, cores_per_die=6, node_per_die=True,
        node_memory_bytes=16 * GIB, l3_bytes_per_die=5 * MIB, l2_bytes_per_core=512 * KIB,
        # AMD: ~100 GB/s STREAM over four Opteron 6100 = eight dies (2 x DDR3-1333 each).
        node_bandwidth_bytes_per_s=12_500_000_000,
    ),
    # 8 x quad-core Opteron 8350, 16 GiB over 8 nodes, 2 MiB L3 per package.
    "barcelona": Shape(
        "barcelona", packages=8, dies_per_package=1, cores_per_die=4,
        node_memory_bytes=2 * GIB, l3_bytes_per_die=2 * MIB, l2_bytes_per_core=512 * KIB,
        distance_same_package=10, distance_remote=20,
        # 2 x DDR2-667 per socket (10.7 GB/s peak); Triad reaches about 55 % of it.
        node_bandwidth_bytes_per_s=6_000_000_000,
    ),
    # 4 x quad-core Opteron 8380, 4 nodes of 4 GiB, 6 MiB L3 per package.
    "shanghai": Shape(
        "shanghai", packages=4, dies_per_package=1, cores_per_die=4,
        node_memory_bytes=4 * GIB, l3_bytes_per_die=6 * MIB, l2_bytes_per_core=512 * KIB,
        distance_same_package=10, distance_remote=20,
        # 2 x DDR2-800 per socket (12.8 GB/s peak); same controller that reaches 8 GB/s on Istanbul.
        node_bandwidth_bytes_per_s=8_000_000_000,
    ),
    # 4 x 8-core Xeon L7555, 4 nodes of 32 GiB, 24 MiB L3 per package, hyperthreading off.
    "nehalem-ex": Shape(
        "nehalem-ex", packages=4, dies_per_package=1, cores_per_die=8,
        node_memory_bytes=32 * GIB, l3_bytes_per_die=24 * MIB, l2_bytes_per_core=256 * KIB,
        l1d_bytes_per_core=32 * KIB, distance_same_package=10, distance_remote=21,
        # Four X7560 (same uncore and SMI links as the L7555) reach 25-29 GB/s Triad: ~7 GB/s a node.
        node_bandwidth_bytes_per_s=7_000_000_000,
    ),
}

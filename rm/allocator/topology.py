"""The allocator's view of a machine: which CPUs can be given out and how they group.

A *domain* is a set of CPUs sharing one L3 cache.  Machines (or CPUs) without an
L3 fall back to one domain per NUMA node, or to one domain for the whole machine
when NUMA is unknown.  A *class* is a set of CPUs that are interchangeable for
every task: same domain, same NUMA node and same number of available SMT
threads in their core (paper Section 5.3: a task does not care which of
equivalent cores it gets).  The solvers decide counts per class.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from cod.facts.cpulist import format_cpulist
from cod.facts.model import Machine

NO_NODE = -1  # CPUs whose NUMA node is unknown


@dataclass(frozen=True)
class CpuClass:
    index: int
    domain: int
    node: int
    threads: int  # available SMT threads per core in this class
    cores: tuple[tuple[int, ...], ...]  # available PUs of each core, ascending
    # per set of View.allowed_sets: whether these cores lie inside it
    part: tuple[bool, ...] = ()

    @property
    def cpus(self) -> tuple[int, ...]:
        return tuple(c for core in self.cores for c in core)

    @property
    def size(self) -> int:
        return self.threads * len(self.cores)


@dataclass(frozen=True)
class View:
    cpus: tuple[int, ...]  # CPUs that may be given out, ascending
    node_of: dict[int, int]
    domain_of: dict[int, int]
    core_of: dict[int, int]
    siblings: dict[int, tuple[int, ...]]  # other available PUs of the same core
    domain_labels: tuple[str, ...]  # index -> "L3 0-5" / "node 2" / "machine"
    nodes: tuple[int, ...]
    node_free: dict[int, int | None]  # free bytes per node; None = unknown, no constraint
    classes: tuple[CpuClass, ...]
    # CPU sets some tasks are restricted to (unregistered processes' affinity):
    # classes are split along them, whole cores only (CpuClass.part)
    allowed_sets: tuple[frozenset[int], ...] = ()

    @property
    def n_domains(self) -> int:
        return len(self.domain_labels)

    def allowed_classes(self, allowed: frozenset[int] | None) -> frozenset[int] | None:
        """Indices of the classes inside ``allowed`` (one of ``allowed_sets``); None: all."""
        if allowed is None:
            return None
        i = self.allowed_sets.index(allowed)
        return frozenset(g.index for g in self.classes if g.part[i])


_CACHE: dict[tuple, tuple[Machine, "View"]] = {}
_CACHE_SIZE = 16


def build_view(machine: Machine, unavailable: Iterable[int] = (),
               allowed_sets: Iterable[frozenset[int]] = ()) -> View:
    """The view of ``machine`` without ``unavailable``, its classes split
    along ``allowed_sets``; the last few are cached, since the RM recomputes
    on the same machine again and again."""
    busy = frozenset(unavailable)
    parts = tuple(dict.fromkeys(frozenset(a) for a in allowed_sets))
    key = (id(machine), busy, parts)
    hit = _CACHE.get(key)
    if hit is not None and hit[0] is machine:
        return hit[1]
    view = _build_view(machine, busy, parts)
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.pop(next(iter(_CACHE)))
    _CACHE[key] = (machine, view)
    return view


def _build_view(machine: Machine, busy: frozenset[int], parts: tuple[frozenset[int], ...] = ()) -> View:
    online = set(machine.cpu_ids())
    unknown = sorted(busy - {pu.id for pu in machine.pus})
    if unknown:
        raise ValueError(f"unavailable: CPU {unknown[0]} does not exist on {machine.name}")
    cpus = tuple(sorted(online - busy))
    pu_by_id = {pu.id: pu for pu in machine.pus}
    node_of = {c: (pu_by_id[c].numa_node if pu_by_id[c].numa_node is not None else NO_NODE) for c in cpus}
    core_of = {c: pu_by_id[c].core for c in cpus}

    # Domains: L3 caches first, then NUMA nodes, then the whole machine.
    groups: dict[tuple, list[int]] = {}
    labels: dict[tuple, str] = {}
    l3_of: dict[int, tuple[int, ...]] = {}
    for cache in machine.l3_caches():
        for c in cache.cpus:
            l3_of.setdefault(c, cache.cpus)
    for c in cpus:
        if c in l3_of:
            key: tuple = ("l3", l3_of[c][0])
            labels[key] = f"L3 {format_cpulist(l3_of[c])}"
        elif node_of[c] != NO_NODE:
            key = ("node", node_of[c])
            labels[key] = f"node {node_of[c]}"
        else:
            key = ("machine", 0)
            labels[key] = "machine"
        groups.setdefault(key, []).append(c)
    ordered = sorted(groups, key=lambda k: min(groups[k]))
    domain_of = {c: i for i, k in enumerate(ordered) for c in groups[k]}

    by_core: dict[int, list[int]] = {}
    for c in cpus:
        by_core.setdefault(core_of[c], []).append(c)
    siblings = {c: tuple(s for s in by_core[core_of[c]] if s != c) for c in cpus}

    class_cores: dict[tuple, list[tuple[int, ...]]] = {}
    for core_pus in by_core.values():
        first = core_pus[0]
        # A core whose threads straddle domains or nodes (never seen) is split per CPU.
        if len({(domain_of[c], node_of[c]) for c in core_pus}) > 1:
            for c in core_pus:
                part = tuple(c in a for a in parts)
                class_cores.setdefault((domain_of[c], node_of[c], 1, part), []).append((c,))
            continue
        part = tuple(all(c in a for c in core_pus) for a in parts)
        key4 = (domain_of[first], node_of[first], len(core_pus), part)
        class_cores.setdefault(key4, []).append(tuple(sorted(core_pus)))
    classes = tuple(
        CpuClass(i, k[0], k[1], k[2], tuple(sorted(class_cores[k])), k[3])
        for i, k in enumerate(sorted(class_cores, key=lambda k: (k[0], k[1], -k[2], k[3])))
    )

    nodes = tuple(sorted(set(node_of.values())))
    node_free: dict[int, int | None] = {n: None for n in nodes}
    for n in machine.numa_nodes:
        if n.id in node_free:
            node_free[n.id] = n.free_bytes if n.free_bytes is not None else n.memory_bytes
    return View(
        cpus=cpus,
        node_of=node_of,
        domain_of=domain_of,
        core_of=core_of,
        siblings=siblings,
        domain_labels=tuple(labels[k] for k in ordered),
        nodes=nodes,
        node_free=node_free,
        classes=classes,
        allowed_sets=parts,
    )

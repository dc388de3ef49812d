"""Which core to allocate or release: the paper's allocation modes (Section IV-B). Pure.

`Layout` is the machine seen by an elastic group: the NUMA nodes that have
CPUs the group may use, each with its CPUs in *dense order* (the first
hardware thread of every core by core id, then the second threads, ...: a
node's physical cores are used before their SMT siblings).  COD allocates
hardware threads (docs/skb-schema.md), so a "core" here is one CPU number.

* **Dense**: ``core(i, j) = d*i + j`` iterated over ``j`` then ``i`` -- fill
  node 0, then node 1, ...
* **Sparse**: the same function iterated over ``i`` then ``j`` -- one core on
  each node in turn.
* **Adaptive priority**: a priority queue of nodes by the group's resident
  pages there (``/proc/PID/numa_maps`` of every process of the group);
  allocate on the highest node that still has a free CPU, release on the
  lowest node the group holds a CPU on.  Ties go to the node where the group
  already holds more CPUs (allocate) or fewer (release), then to the lower
  (allocate) or higher (release) node number.  Pages on a node without CPUs
  (memory-only: MCDRAM, CXL) count for the nearest node with CPUs (by SLIT
distance; without distances, only when one node has CPUs).  With one
  node there is nothing to choose: adaptive says so and behaves as dense.

Dense and sparse release the most recently allocated position of their order
(the last held CPU in order), so a grant followed by a release is a no-op.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from cod.facts.model import Machine

from .errors import ElasticError
from .settings import MODES


@dataclass(frozen=True)
class Layout:
    nodes: tuple[int, ...]  # nodes with usable CPUs, ascending
    cpus_of: Mapping[int, tuple[int, ...]]  # node -> its usable CPUs in dense order
    fold: Mapping[int, int]  # any node with memory -> the node with CPUs its pages count for
    # Derived once (a step on a 384-CPU machine must stay well under 1 ms).
    _node_of: dict[int, int] = field(init=False, repr=False, compare=False)
    _dense: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _sparse: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _cpus: frozenset[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        dense = tuple(c for n in self.nodes for c in self.cpus_of[n])
        longest = max(len(cs) for cs in self.cpus_of.values())
        sparse = tuple(self.cpus_of[n][j] for j in range(longest) for n in self.nodes
                       if j < len(self.cpus_of[n]))
        object.__setattr__(self, "_node_of", {c: n for n in self.nodes for c in self.cpus_of[n]})
        object.__setattr__(self, "_dense", dense)
        object.__setattr__(self, "_sparse", sparse)
        object.__setattr__(self, "_cpus", frozenset(dense))

    @classmethod
    def from_machine(cls, machine: Machine, allowed: Collection[int] | None = None) -> "Layout":
        usable = set(machine.cpu_ids())
        if allowed is not None:
            usable &= set(allowed)
        if not usable:
            raise ElasticError(f"machine {machine.name}: no usable CPU for an elastic group")
        pu_of = {pu.id: pu for pu in machine.pus}
        by_node: dict[int, list[tuple[int, int]]] = {}  # node -> [(rank within core, cpu)]
        cores = sorted(machine.cores, key=lambda c: c.id)
        seen: set[int] = set()
        for core in cores:
            for rank, cpu in enumerate(sorted(core.pus)):
                if cpu in usable:
                    node = pu_of[cpu].numa_node if cpu in pu_of else core.numa_node
                    by_node.setdefault(0 if node is None else node, []).append((rank, cpu))
                    seen.add(cpu)
        for cpu in sorted(usable - seen):  # a PU without a core record: its own core
            node = pu_of[cpu].numa_node if cpu in pu_of else None
            by_node.setdefault(0 if node is None else node, []).append((0, cpu))
        cpus_of = {n: tuple(cpu for _, cpu in sorted(v, key=lambda rc: rc[0]))  # stable: core order kept
                   for n, v in sorted(by_node.items())}
        nodes = tuple(sorted(cpus_of))
        fold: dict[int, int] = {n: n for n in nodes}
        for node in machine.numa_nodes:
            if node.id in fold:
                continue
            dist = {k: v for k, v in node.distances.items() if k in cpus_of}
            if dist:
                fold[node.id] = min(dist, key=lambda k: (dist[k], k))
            elif len(nodes) == 1:  # no distances, one node with CPUs: it is the nearest
                fold[node.id] = nodes[0]
        return cls(nodes=nodes, cpus_of=cpus_of, fold=fold)

    @property
    def cpus(self) -> frozenset[int]:
        return self._cpus

    def node_of(self, cpu: int) -> int | None:
        return self._node_of.get(cpu)

    def dense_order(self) -> tuple[int, ...]:
        """core(i, j) = d*i + j iterated j-inner: node by node."""
        return self._dense

    def sparse_order(self) -> tuple[int, ...]:
        """core(i, j) iterated i-inner: the j-th CPU of every node, for j = 0, 1, ..."""
        return self._sparse

    def fold_pages(self, pages: Mapping[int, int]) -> dict[int, int]:
        """Pages per node with CPUs (memory-only nodes folded onto their nearest)."""
        out = {n: 0 for n in self.nodes}
        for node, count in pages.items():
            target = self.fold.get(node)
            if target is not None:
                out[target] += count
        return out


def effective_mode(layout: Layout, mode: str) -> tuple[str, str]:
    """The mode actually used and a one-line note (empty when it is the one asked)."""
    if mode not in MODES:
        raise ElasticError(f"unknown elastic mode {mode!r}; choose one of {', '.join(MODES)}")
    if mode == "adaptive" and len(layout.nodes) == 1:
        return "dense", (f"adaptive mode: the group's CPUs are on one NUMA node ({layout.nodes[0]}), "
                         "so there is no node to choose; using dense order")
    return mode, ""


def _held_per_node(layout: Layout, have: set[int]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for c in have:
        n = layout.node_of(c)
        if n is not None:
            counts[n] = counts.get(n, 0) + 1
    return counts


def _order(layout: Layout, mode: str) -> tuple[int, ...]:
    return layout.sparse_order() if mode == "sparse" else layout.dense_order()


def choose_grant(layout: Layout, mode: str, held: Sequence[int], available: Collection[int],
                 pages: Mapping[int, int] | None = None) -> int | None:
    """The CPU to allocate next, or None when no CPU of the layout is available.

    ``available``: CPUs the group may take now (what the global allocation leaves it);
    ``pages``: the group's resident pages per node (adaptive mode; None = unknown)."""
    mode, _ = effective_mode(layout, mode)
    have = set(held)
    if mode != "adaptive":
        return next((c for c in _order(layout, mode) if c not in have and c in available), None)
    folded = layout.fold_pages(pages or {})
    held_on = _held_per_node(layout, have)
    # The priority queue of the paper: most pages first; ties as the module says.
    queue = [(-folded[n], -held_on.get(n, 0), n) for n in layout.nodes]
    heapq.heapify(queue)
    while queue:
        _, _, node = heapq.heappop(queue)
        for c in layout.cpus_of[node]:
            if c not in have and c in available:
                return c
    return None


def choose_release(layout: Layout, mode: str, held: Sequence[int],
                   pages: Mapping[int, int] | None = None) -> int | None:
    """The held CPU to give back, or None when the group holds nothing."""
    if not held:
        return None
    mode, _ = effective_mode(layout, mode)
    have = set(held)
    foreign = [c for c in held if layout.node_of(c) is None]
    if foreign:  # a CPU outside the layout (no longer usable): it goes first
        return foreign[-1]
    if mode != "adaptive":
        order = _order(layout, mode)
        return next(c for c in reversed(order) if c in have)
    folded = layout.fold_pages(pages or {})
    held_on = _held_per_node(layout, have)
    queue = [(folded[n], count, -n) for n, count in held_on.items()]
    heapq.heapify(queue)
    _, _, neg = heapq.heappop(queue)
    return next(c for c in reversed(layout.cpus_of[-neg]) if c in have)

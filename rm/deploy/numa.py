"""Phase 3: pack the clusters (one core each) onto NUMA nodes by bandwidth and core count.

A NUMA node is a bin with two capacities: its attainable local bandwidth
(``numa_bandwidth``) and its number of usable cores, the cardinality limit of
the paper's cardinality-constrained bin packing (Section 4.3).  FFD sorts the
clusters by decreasing bandwidth; :func:`exact_min_nodes` is the CP-SAT
minimum beside it.

A node's *slots* are the CPUs clusters may be pinned to: the lowest usable
hardware thread of each usable core, cores in ascending order (one cluster per
core: the paper leaves hyperthreads unused).  Only when the machine has fewer
usable cores than the plan has clusters do the remaining hardware threads
become slots too (``use_smt``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

from cod.facts.model import Machine


@dataclass(frozen=True)
class NodeSlots:
    id: int
    cpus: tuple[int, ...]  # slots, in the order clusters take them
    bandwidth: int | None  # bytes/s; None = unknown (not a constraint)
    bandwidth_source: str  # "machine" | "override" | "rm" | "unknown"


def node_slots(machine: Machine, usable_cpus: Iterable[int], *, use_smt: bool = False,
               bandwidth_override: dict[int, int] | None = None,
               override_source: str = "override") -> list[NodeSlots]:
    """The usable slots of each NUMA node that has any (nodes in id order)."""
    usable = set(usable_cpus)
    override = bandwidth_override or {}
    nodes = sorted(machine.numa_nodes, key=lambda n: n.id)
    if not nodes:  # a machine without NUMA information is one node
        from cod.facts.model import NumaNode
        nodes = [NumaNode(0, tuple(sorted(p.id for p in machine.pus)), None)]
    out = []
    for node in nodes:
        in_node = set(node.cpus) & usable
        firsts: list[int] = []
        rest: list[int] = []
        for core in sorted(machine.cores, key=lambda c: c.id):
            pus = sorted(p for p in core.pus if p in in_node)
            if pus:
                firsts.append(pus[0])
                rest.extend(pus[1:])
        if not machine.cores:  # no core information: every usable CPU is a core
            firsts = sorted(in_node)
        slots = tuple(firsts + (sorted(rest) if use_smt else []))
        if not slots:
            continue
        if node.id in override:
            bw, src = override[node.id], override_source
        elif node.bandwidth_bytes_per_s is not None:
            bw, src = node.bandwidth_bytes_per_s, "machine"
        else:
            bw, src = None, "unknown"
        out.append(NodeSlots(node.id, slots, bw, src))
    return out


def _fits(load: int, count: int, bw: int, node: NodeSlots) -> bool:
    return count < len(node.cpus) and (node.bandwidth is None or load + bw <= node.bandwidth)


def capacity_order(nodes: Sequence[NodeSlots]) -> list[NodeSlots]:
    """Nodes with the most room first (most slots, then most bandwidth, then lowest id)."""
    return sorted(nodes, key=lambda n: (-len(n.cpus), -(n.bandwidth if n.bandwidth is not None else 1 << 62), n.id))


def clamp(bws: Sequence[int], nodes: Sequence[NodeSlots]) -> list[int]:
    """A cluster needing more bandwidth than any node has saturates one node alone:
    pack it as if it needed exactly the largest node's bandwidth."""
    caps = [n.bandwidth for n in nodes]
    if not caps or any(c is None for c in caps):
        return list(bws)
    top = max(caps)  # type: ignore[type-var]
    return [min(b, top) for b in bws]


def ffd_nodes(bws: Sequence[int], nodes: Sequence[NodeSlots]) -> list[list[int]] | None:
    """FFD of clusters (bandwidths ``bws``) onto ``nodes`` taken in the given order,
    opening the next node only when no open one fits.  Returns the clusters of each
    opened node, or None when the nodes run out."""
    order = sorted(range(len(bws)), key=lambda i: (-bws[i], i))
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in order:
        for b in range(len(bins)):
            if _fits(loads[b], len(bins[b]), bws[i], nodes[b]):
                bins[b].append(i)
                loads[b] += bws[i]
                break
        else:
            while len(bins) < len(nodes):
                node = nodes[len(bins)]
                bins.append([])
                loads.append(0)
                if _fits(0, 0, bws[i], node):
                    bins[-1].append(i)
                    loads[-1] += bws[i]
                    break
            else:
                return None
    return bins


def exact_min_nodes(bws: Sequence[int], nodes: Sequence[NodeSlots], upper: int,
                    *, time_limit_s: float = 2.0) -> tuple[int | None, str]:
    """The fewest nodes that can hold the clusters (CP-SAT); (None, "timeout") if unproven."""
    n_items = len(bws)
    lb = 1 if n_items else 0
    if upper <= lb:
        return upper, "optimal"
    from ortools.sat.python import cp_model

    m = cp_model.CpModel()
    x = {(i, b): m.new_bool_var(f"x{i}_{b}") for i in range(n_items) for b in range(len(nodes))}
    used = [m.new_bool_var(f"u{b}") for b in range(len(nodes))]
    for i in range(n_items):
        m.add_exactly_one(x[i, b] for b in range(len(nodes)))
    for b, node in enumerate(nodes):
        m.add(sum(x[i, b] for i in range(n_items)) <= len(node.cpus) * used[b])
        if node.bandwidth is not None:
            m.add(sum(bws[i] * x[i, b] for i in range(n_items)) <= node.bandwidth * used[b])
    m.add(sum(used) <= upper)
    m.minimize(sum(used))
    s = cp_model.CpSolver()
    s.parameters.num_workers = 1
    s.parameters.random_seed = 0
    s.parameters.max_time_in_seconds = max(0.01, time_limit_s)
    st = s.solve(m)
    if st == cp_model.OPTIMAL:
        return int(round(s.objective_value)), "optimal"
    return None, "timeout"

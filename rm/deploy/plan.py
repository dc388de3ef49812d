"""The four phases put together: a dataflow graph and a machine in, a deployment out.

Pure: no file, socket, /proc or clock other than the solvers' time limits.

1. :mod:`.collapse` merges pipelines of blocking operators (Eq. 3-4).
2. :mod:`.binpack` packs the compound operators onto cores by cpu_util (FFD,
   Algorithm 1, with the sibling rule), beside the CP-SAT optimum; then the
   load-balancing epilogue evens the cores out without adding one.
3. :mod:`.numa` packs those clusters onto NUMA nodes by bandwidth and core count.
4. :mod:`.densest` picks which nodes (densest k-subgraph of the interconnect),
   then every cluster gets a core of its node and every operator its CPU.

:func:`deploy` runs all four; :func:`bind` re-runs phases 3-4 for a plan inside
a given CPU set (the CPUs the RM's global allocator gave the task).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from cod.facts.model import Machine

from . import binpack
from .collapse import Compound, collapse
from .densest import Choice, Interconnect, densest, interconnect
from .errors import DeployError, InfeasibleError
from .graph import UTIL_SCALE, Graph
from .numa import NodeSlots, capacity_order, clamp, exact_min_nodes, ffd_nodes, node_slots
from .screen import demand_of

# Linux truncates thread names (comm) to 15 bytes.
COMM_LEN = 15


def comm_key(op_id: str) -> str:
    """The thread name an operator id matches: its first 15 bytes (TASK_COMM_LEN - 1)."""
    return op_id.encode()[:COMM_LEN].decode(errors="ignore")


@dataclass(frozen=True)
class Options:
    capacity: float = 1.0  # share of one core a cluster may fill
    exact: bool = True  # also compute the CP-SAT optimum of phases 2 and 3
    prefer_exact: bool = True  # deploy on the exact packing when it needs fewer cores than FFD
    balance: bool = True  # the load-balancing epilogue
    time_limit_s: float = 2.0  # per exact search
    exhaustive_limit: int = 20_000  # phase 4 enumerates up to this many node sets
    link_distance: int | None = None  # phase 4: SLIT distance of one hop (None: the smallest remote)
    unavailable: tuple[int, ...] = ()  # CPUs not to use
    node_bandwidth: dict[int, int] | None = None  # bytes/s per node, overriding the machine's
    node_bandwidth_source: str = "override"  # what to call it in the output ("rm": the SKB's facts)

    def __post_init__(self) -> None:
        if not isinstance(self.capacity, (int, float)) or not 0 < self.capacity <= 1:
            raise DeployError(f"capacity: must be in (0, 1], got {self.capacity!r}")
        if self.time_limit_s <= 0:
            raise DeployError(f"time limit: must be > 0 s, got {self.time_limit_s!r}")
        for node, bw in (self.node_bandwidth or {}).items():
            if not isinstance(bw, int) or isinstance(bw, bool) or bw <= 0:
                raise DeployError(f"node {node} bandwidth: must be a positive number of bytes/s, got {bw!r}")


@dataclass(frozen=True)
class Cluster:
    """A phase-2 bin: the operators that share one core."""

    index: int
    compounds: tuple[str, ...]
    members: tuple[str, ...]
    util: int
    mem_bw: int
    mem_bw_known: bool
    numa_node: int | None = None
    cpu: int | None = None

    @property
    def cpu_util(self) -> float:
        return self.util / UTIL_SCALE


@dataclass(frozen=True)
class NodeUse:
    node: int
    clusters: tuple[int, ...]
    cpus: tuple[int, ...]
    mem_bw: int
    bandwidth: int | None
    bandwidth_source: str
    usable_slots: int


@dataclass(frozen=True)
class NumaChoice:
    nodes: tuple[int, ...]
    count_ffd: int  # phase 3's FFD node count
    count_optimal: int | None  # CP-SAT minimum (None: not computed or unproven)
    choice: Choice
    link_distance: int | None
    usage: tuple[NodeUse, ...]

    @property
    def density(self) -> float:
        return self.choice.density


@dataclass(frozen=True)
class DeployPlan:
    machine: str
    operators: int
    capacity: float
    compounds: tuple[Compound, ...]
    clusters: tuple[Cluster, ...]
    cores: int  # phase 2 FFD
    cores_optimal: int | None
    cores_lower_bound: int
    exact_status: str
    balance: binpack.Balanced | None
    numa: NumaChoice
    placement: dict[str, int]  # operator id -> Linux CPU number
    warnings: tuple[str, ...]
    explanation: tuple[str, ...]
    timings_ms: dict[str, float] = field(default_factory=dict)

    @property
    def min_cores(self) -> int:
        """CPUs the plan needs: the task's ``min_cores`` in the RM."""
        return len(self.clusters)

    def to_dict(self) -> dict[str, Any]:
        def bw(value: int, known: bool) -> dict[str, Any]:
            return {"mem_bw": value, "mem_bw_known": known}

        return {
            "machine": self.machine,
            "operators": self.operators,
            "capacity": self.capacity,
            "compound_operators": [
                {"id": c.id, "members": list(c.members), "cpu_util": c.cpu_util,
                 **bw(c.mem_bw, c.mem_bw_known), "siblings": sorted(c.sibling_groups)}
                for c in self.compounds
            ],
            "clusters": [
                {"cluster": c.index, "operators": list(c.compounds), "members": list(c.members),
                 "cpu_util": c.cpu_util, **bw(c.mem_bw, c.mem_bw_known),
                 "numa_node": c.numa_node, "cpu": c.cpu}
                for c in self.clusters
            ],
            "cores": self.cores,
            "cores_optimal": self.cores_optimal,
            "cores_lower_bound": self.cores_lower_bound,
            "ffd_gap": None if self.cores_optimal is None else self.cores - self.cores_optimal,
            "exact_status": self.exact_status,
            "min_cores": self.min_cores,
            "balance": None if self.balance is None else {
                "status": self.balance.status,
                "max_cpu_util_before": self.balance.max_before / UTIL_SCALE,
                "max_cpu_util_after": self.balance.max_after / UTIL_SCALE,
                "min_cpu_util_before": self.balance.min_before / UTIL_SCALE,
                "min_cpu_util_after": self.balance.min_after / UTIL_SCALE,
                "moved": self.balance.moved,
            },
            "numa_nodes": {
                "nodes": list(self.numa.nodes),
                "count": len(self.numa.nodes),
                "count_ffd": self.numa.count_ffd,
                "count_optimal": self.numa.count_optimal,
                "density": self.numa.density,
                "links": self.numa.choice.links,
                "mean_distance": self.numa.choice.mean_distance,
                "link_distance": self.numa.link_distance,
                "method": self.numa.choice.method,
                "optimal": self.numa.choice.optimal,
                "usage": [
                    {"node": u.node, "clusters": list(u.clusters), "cpus": list(u.cpus),
                     "mem_bw": u.mem_bw, "bandwidth": u.bandwidth,
                     "bandwidth_source": u.bandwidth_source, "usable_cores": u.usable_slots}
                    for u in self.numa.usage
                ],
            },
            "placement": dict(self.placement),
            "warnings": list(self.warnings),
            "explain": list(self.explanation),
            "timings_ms": {k: round(v, 3) for k, v in self.timings_ms.items()},
        }


def _pct(units: int) -> str:
    return f"{100 * units / UTIL_SCALE:.1f}%"


def _gbs(bw: int | None) -> str:
    return "unknown" if bw is None else f"{bw / 1e9:.2f} GB/s"


def deploy(graph: Graph, machine: Machine, options: Options = Options()) -> DeployPlan:
    """Run the four phases; InfeasibleError when the machine cannot hold the plan, as soon as that
    is known: after phase 1 when no packing could fit (the lower bound), before the epilogue when
    the packing found does not."""
    t0 = time.perf_counter()
    timings: dict[str, float] = {}
    notes: list[str] = []
    warnings: list[str] = []
    cap = round(options.capacity * UTIL_SCALE)
    usable = set(machine.cpu_ids()) - set(options.unavailable)
    available = _usable_count(machine, usable, options)

    compounds = _phase1(graph, cap, notes, warnings)
    need = demand_of(compounds, cap)
    if need.cores > available:
        raise InfeasibleError(f"the plan needs {need.cores} cores; {machine.name} has {available} usable "
                              f"(no packing needs fewer: {need.why})")
    t1 = time.perf_counter()
    timings["phase1"] = (t1 - t0) * 1e3

    sizes = [c.util for c in compounds]
    groups = [c.sibling_groups for c in compounds]
    ffd_bins, lb, exact = _phase2(compounds, sizes, groups, cap, options, notes, warnings)
    t2 = time.perf_counter()
    timings["phase2"] = (t2 - t1) * 1e3

    bins, bal = _epilogue(sizes, groups, cap, ffd_bins, exact, options, notes, (machine.name, available))
    t3 = time.perf_counter()
    timings["balance"] = (t3 - t2) * 1e3

    clusters = _clusters(compounds, bins, notes)
    placed, numa, more_notes, more_warnings, ph = _place(clusters, machine, usable, options)
    notes += more_notes
    warnings += more_warnings
    timings.update(ph)
    timings["total"] = (time.perf_counter() - t0) * 1e3
    return DeployPlan(
        machine=machine.name,
        operators=len(graph.operators),
        capacity=options.capacity,
        compounds=tuple(compounds),
        clusters=tuple(placed),
        cores=len(ffd_bins),
        cores_optimal=exact.count,
        cores_lower_bound=max(lb, exact.bound),
        exact_status=exact.status,
        balance=bal,
        numa=numa,
        placement=_placement(placed),
        warnings=tuple(warnings),
        explanation=tuple(notes),
        timings_ms=timings,
    )


def _usable_count(machine: Machine, usable: set[int], options: Options) -> int:
    """The most clusters ``usable`` can hold: one per hardware thread (SMT siblings included)."""
    return sum(len(s.cpus) for s in node_slots(machine, usable, use_smt=True,
                                                  bandwidth_override=options.node_bandwidth,
                                                  override_source=options.node_bandwidth_source))


def _phase1(graph: Graph, cap: int, notes: list[str], warnings: list[str]) -> list[Compound]:
    """Phase 1: pipelines of blocking operators collapsed into compound operators."""
    compounds = collapse(graph, cap)
    merged = [c for c in compounds if len(c.members) > 1]
    notes.append(f"phase 1: {len(graph.operators)} operators -> {len(compounds)} compound operators "
                 f"({len(merged)} pipelines of blocking operators collapsed)")
    for c in merged:
        notes.append(f"  {' -> '.join(c.members)}: cpu_util {_pct(c.util)}, mem_bw {_gbs(c.mem_bw)}")
    unknown_bw = [op.id for op in graph.operators if op.mem_bw is None]
    if unknown_bw:
        warnings.append(f"mem_bw unknown for {len(unknown_bw)} operator(s) ({', '.join(unknown_bw[:5])}"
                        f"{', ...' if len(unknown_bw) > 5 else ''}): counted as 0 in phase 3")
    return compounds


def _phase2(compounds: Sequence[Compound], sizes: list[int], groups: list[frozenset[str]], cap: int,
            options: Options, notes: list[str], warnings: list[str]) -> tuple[binpack.Bins, int, binpack.Exact]:
    """Phase 2: compound operators onto cores by cpu_util (FFD, Algorithm 1), beside its lower bound
    and, when asked, the CP-SAT optimum.  Returns FFD's bins, the lower bound and the exact answer."""
    big = [c.id for c in compounds if c.util > cap]
    if big:
        warnings.append(f"{len(big)} operator(s) need more than the capacity of one core "
                        f"({options.capacity:g}) and get a core of their own: {', '.join(big[:5])}")
    ffd_bins = binpack.first_fit_decreasing(sizes, cap, groups)
    lb = binpack.lower_bound(sizes, cap, groups)
    notes.append(f"phase 2: FFD by cpu_util packs {len(compounds)} compound operators onto "
                 f"{len(ffd_bins)} cores (lower bound {lb}; capacity {options.capacity:g} core)")
    sibling_skips = _sibling_skips(sizes, cap, groups)
    if sibling_skips:
        notes.append(f"  sibling rule: {sibling_skips} time(s) a bin with room was skipped because it held a sibling")
    exact = binpack.Exact(None, None, lb, "skipped")
    if options.exact:
        exact = binpack.exact_min_bins(sizes, cap, groups, ffd_bins, time_limit_s=options.time_limit_s)
        if exact.count is not None:
            notes.append(f"  exact (CP-SAT): {exact.count} cores; FFD gap {len(ffd_bins) - exact.count}")
        elif exact.status == "skipped":
            notes.append(f"  exact (CP-SAT): skipped ({len(compounds)} operators x {len(ffd_bins)} cores is "
                         f"too large a model, or an operator exceeds the capacity); lower bound {exact.bound}")
        else:
            notes.append(f"  exact (CP-SAT): {exact.status}, best bound {exact.bound} cores")
    return ffd_bins, lb, exact


def _epilogue(sizes: list[int], groups: list[frozenset[str]], cap: int, ffd_bins: binpack.Bins,
              exact: binpack.Exact, options: Options, notes: list[str], room: tuple[str, int]
              ) -> tuple[binpack.Bins, binpack.Balanced | None]:
    """The bins deployed: FFD's or the exact packing's, balanced when asked (the epilogue);
    InfeasibleError first when they are more than ``room`` (machine name, usable CPUs) holds."""
    bins = [list(b) for b in ffd_bins]
    if options.prefer_exact and exact.bins is not None and len(exact.bins) < len(ffd_bins):
        bins = [list(b) for b in exact.bins]
        notes.append(f"  deployed on the exact packing's {len(bins)} cores, not FFD's {len(ffd_bins)}")
    if len(bins) > room[1]:
        raise InfeasibleError(f"the plan needs {len(bins)} cores; {room[0]} has {room[1]} usable")
    bal = None
    if options.balance:
        bal = binpack.balance(sizes, cap, groups, bins, time_limit_s=options.time_limit_s)
        bins = bal.bins
        if bal.status in ("optimal", "improved"):
            notes.append(f"epilogue: balanced {len(bins)} cores ({bal.status}): busiest core "
                         f"{_pct(bal.max_before)} -> {_pct(bal.max_after)}, idlest {_pct(bal.min_before)} -> "
                         f"{_pct(bal.min_after)}, {bal.moved} operator(s) moved")
        else:
            notes.append(f"epilogue: bins left as FFD made them ({bal.status})")
    return bins, bal


def _clusters(compounds: Sequence[Compound], bins: binpack.Bins, notes: list[str]) -> list[Cluster]:
    """One cluster per bin: its compound operators, their members, load and bandwidth."""
    clusters = []
    for index, b in enumerate(bins):
        members = [compounds[i] for i in b]
        clusters.append(Cluster(
            index=index,
            compounds=tuple(c.id for c in members),
            members=tuple(m for c in members for m in c.members),
            util=sum(c.util for c in members),
            mem_bw=sum(c.mem_bw for c in members),
            mem_bw_known=all(c.mem_bw_known for c in members),
        ))
    for c in clusters:
        notes.append(f"  core {c.index}: {_pct(c.util)} {', '.join(c.compounds)}")
    return clusters


def bind(plan: DeployPlan, machine: Machine, cpus: Iterable[int], options: Options = Options()) -> DeployPlan:
    """Phases 3-4 again for ``plan``'s clusters, inside ``cpus`` only.

    The RM calls this once the global allocator has given the task its CPUs
    (``plan.min_cores`` of them at least); the result's ``placement`` maps each
    operator id (thread name) to one of ``cpus``.
    """
    usable = set(cpus) & set(machine.cpu_ids()) - set(options.unavailable)
    if len(usable) < len(plan.clusters):
        raise InfeasibleError(f"the plan needs {len(plan.clusters)} CPUs; only {len(usable)} of those "
                              f"given are online on {machine.name}")
    bare = [dataclasses.replace(c, numa_node=None, cpu=None) for c in plan.clusters]
    placed, numa, notes, warnings, _ = _place(bare, machine, usable, options)
    return dataclasses.replace(
        plan, clusters=tuple(placed), numa=numa, placement=_placement(placed),
        warnings=plan.warnings + tuple(warnings),
        explanation=plan.explanation + (f"bound to CPUs {sorted(usable)}",) + tuple(notes))


def _describe_nodes(slots: Sequence[NodeSlots]) -> str:
    """'8 x (6 cores, 12.50 GB/s)'-style summary of the usable nodes."""
    kinds: dict[tuple[int, int | None], list[int]] = {}
    for s in slots:
        kinds.setdefault((len(s.cpus), s.bandwidth), []).append(s.id)
    return "; ".join(f"{len(ids)} x ({cores} cores, {_gbs(bw)})" for (cores, bw), ids in kinds.items())


def _placement(clusters: Sequence[Cluster]) -> dict[str, int]:
    return {op: c.cpu for c in clusters for op in c.members if c.cpu is not None}


def _sibling_skips(sizes: Sequence[int], cap: int, groups: Sequence[frozenset[str]]) -> int:
    """How often Algorithm 1's line 5 turned an item away from a bin it fit in."""
    loads: list[int] = []
    held: list[set[str]] = []
    skips = 0
    for i in binpack.ffd_order(sizes):
        for b in range(len(loads)):
            if loads[b] + sizes[i] <= cap:
                if groups[i] & held[b]:
                    skips += 1
                    continue
                loads[b] += sizes[i]
                held[b] |= groups[i]
                break
        else:
            loads.append(sizes[i])
            held.append(set(groups[i]))
    return skips


def _place(clusters: list[Cluster], machine: Machine, usable: set[int], options: Options
           ) -> tuple[list[Cluster], NumaChoice, list[str], list[str], dict[str, float]]:
    """Phases 3 and 4 for ``clusters`` on the ``usable`` CPUs of ``machine``."""
    t0 = time.perf_counter()
    notes: list[str] = []
    warnings: list[str] = []
    slots = _usable_slots(len(clusters), machine, usable, options, warnings)
    bws = _clamped_bandwidths(clusters, slots, warnings)
    slots, k_ffd, k_opt = _phase3(bws, slots, options, notes, warnings)
    t1 = time.perf_counter()

    by_id = {s.id: s for s in slots}
    # Links come from the whole machine's distances, whichever nodes are usable now.
    ic = interconnect(machine.numa_nodes, options.link_distance)
    choice = _phase4(ic, by_id, bws, k_ffd, machine, options, notes)
    chosen = capacity_order([by_id[i] for i in choice.nodes])
    placed, usage = _assign_cpus(clusters, chosen, bws, notes)
    if len(usage) < len(choice.nodes):  # bigger nodes than phase 3 counted on: fewer were needed
        used = tuple(u.node for u in usage)
        links, dist = ic.score(used)
        choice = Choice(used, links, dist, choice.method, choice.optimal, choice.sets_examined)
    t2 = time.perf_counter()
    numa = NumaChoice(tuple(sorted(choice.nodes)), k_ffd, k_opt, choice, ic.link_distance, tuple(usage))
    return placed, numa, notes, warnings, {"phase3": (t1 - t0) * 1e3, "phase4": (t2 - t1) * 1e3}


def _usable_slots(n: int, machine: Machine, usable: set[int], options: Options,
                  warnings: list[str]) -> list[NodeSlots]:
    """The usable cores per NUMA node for ``n`` clusters: SMT siblings as well when the cores
    alone are too few; InfeasibleError when even those are."""
    slots = node_slots(machine, usable, bandwidth_override=options.node_bandwidth,
                       override_source=options.node_bandwidth_source)
    total = sum(len(s.cpus) for s in slots)
    if total < n:
        smt = node_slots(machine, usable, use_smt=True, bandwidth_override=options.node_bandwidth,
                         override_source=options.node_bandwidth_source)
        if sum(len(s.cpus) for s in smt) >= n:
            warnings.append(f"only {total} usable cores for {n} clusters: SMT siblings used as well")
            slots, total = smt, sum(len(s.cpus) for s in smt)
    if total < n:
        raise InfeasibleError(f"the plan needs {n} cores; {machine.name} has {total} usable")
    return slots


def _clamped_bandwidths(clusters: Sequence[Cluster], slots: Sequence[NodeSlots], warnings: list[str]) -> list[int]:
    """Each cluster's mem_bw, at most a node's worth, with a warning for what is unknown or clamped."""
    unknown = [s.id for s in slots if s.bandwidth is None]
    if unknown:
        warnings.append(f"bandwidth capacity unknown for NUMA node(s) {', '.join(map(str, unknown))}: "
                        f"packed by core count only (measure it with `cod bandwidth`)")
    raw_bw = [c.mem_bw for c in clusters]
    bws = clamp(raw_bw, slots)
    for c, b, r in zip(clusters, bws, raw_bw):
        if b < r:
            warnings.append(f"cluster {c.index} needs {_gbs(r)}, more than any node's bandwidth: "
                            f"it is given a node's worth ({_gbs(b)})")
    return bws


def _phase3(bws: list[int], slots: list[NodeSlots], options: Options, notes: list[str],
            warnings: list[str]) -> tuple[list[NodeSlots], int, int | None]:
    """Phase 3: how many NUMA nodes the clusters need, FFD by mem_bw (and the exact minimum when
    asked).  Returns the slots (without bandwidth when it cannot bind), FFD's count and the exact one."""
    ordered = capacity_order(slots)
    ffd = ffd_nodes(bws, ordered)
    if ffd is None:
        warnings.append("the clusters need more bandwidth than the usable nodes have together: "
                        "phase 3 packs by core count only")
        slots = [dataclasses.replace(s, bandwidth=None) for s in slots]
        ordered = capacity_order(slots)
        ffd = ffd_nodes(bws, ordered)
        assert ffd is not None  # enough slots checked above
    k_ffd = sum(1 for b in ffd if b) or 1
    notes.append(f"phase 3: FFD by mem_bw onto NUMA nodes ({_describe_nodes(slots)}) needs {k_ffd} node(s)")
    k_opt = None
    if options.exact and bws:
        k_opt, k_status = exact_min_nodes(bws, ordered, k_ffd, time_limit_s=options.time_limit_s)
        notes.append(f"  exact (CP-SAT): {k_opt if k_opt is not None else k_status} node(s)")
    return slots, k_ffd, k_opt


def _phase4(ic: Interconnect, by_id: dict[int, NodeSlots], bws: list[int], k_ffd: int, machine: Machine,
            options: Options, notes: list[str]) -> Choice:
    """Phase 4: the densest set of nodes, from ``k_ffd`` nodes up, that holds the clusters."""
    def feasible(subset: tuple[int, ...]) -> bool:
        return ffd_nodes(bws, capacity_order([by_id[i] for i in subset])) is not None

    choice = None
    k = k_ffd
    while choice is None and k <= len(by_id):
        choice = densest(ic, k, list(by_id), feasible, exhaustive_limit=options.exhaustive_limit,
                         time_limit_s=options.time_limit_s)
        if choice is None:
            notes.append(f"  no set of {k} node(s) holds the clusters; trying {k + 1}")
            k += 1
    if choice is None:
        raise InfeasibleError(f"no set of NUMA nodes of {machine.name} holds the {len(bws)} clusters")
    if ic.link_distance is None and len(by_id) > 1:
        notes.append("phase 4: no NUMA distances known: every pair of nodes counts as linked")
    notes.append(f"phase 4: densest {k}-subgraph ({choice.method}"
                 f"{', proven' if choice.optimal else ', best found'}, {choice.sets_examined} set(s) examined): "
                 f"nodes {list(choice.nodes)}, {choice.links} link(s), density {choice.density:.2f}"
                 + (f", mean distance {choice.mean_distance:.1f}" if choice.mean_distance is not None else ""))
    return choice


def _assign_cpus(clusters: list[Cluster], chosen: list[NodeSlots], bws: list[int], notes: list[str]
                 ) -> tuple[list[Cluster], list[NodeUse]]:
    """Each cluster on a core of its chosen node, the busiest first; the nodes used."""
    per_node = ffd_nodes(bws, chosen)
    assert per_node is not None
    placed = list(clusters)
    usage = []
    for node, items in zip(chosen, per_node + [[]] * (len(chosen) - len(per_node))):
        # The busiest cluster takes the node's first core.
        items = sorted(items, key=lambda i: (-clusters[i].util, i))
        cpus = node.cpus[: len(items)]
        for i, cpu in zip(items, cpus):
            placed[i] = dataclasses.replace(clusters[i], numa_node=node.id, cpu=cpu)
        usage.append(NodeUse(node.id, tuple(items), tuple(cpus), sum(bws[i] for i in items),
                             node.bandwidth, node.bandwidth_source, len(node.cpus)))
        notes.append(f"  node {node.id}: clusters {items} on CPUs {list(cpus)}, "
                     f"mem_bw {_gbs(sum(bws[i] for i in items))} of {_gbs(node.bandwidth)}")
    return placed, sorted((u for u in usage if u.clusters), key=lambda u: u.node)

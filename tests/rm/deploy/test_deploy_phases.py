"""Plan deployment, phase by phase, on hand-made graphs with known answers (issue 17)."""

from __future__ import annotations

import dataclasses
import itertools
import json

import pytest

from cod.facts import machines
from cod.rm.deploy import GraphError, InfeasibleError, Options, bind, collapse, deploy, parse_graph
from cod.rm.deploy import binpack
from cod.rm.deploy.graph import UTIL_SCALE
from helpers.data import DATA

U = UTIL_SCALE


def graph(ops, edges=()):
    """ops: (id, cpu_util[, blocking[, siblings[, mem_bw]]])"""
    out = []
    for op in ops:
        op_id, util, *rest = op
        d = {"id": op_id, "cpu_util": util, "mem_bw": 1e8}
        if len(rest) > 0:
            d["blocking"] = rest[0]
        if len(rest) > 1 and rest[1] is not None:
            d["siblings"] = rest[1]
        if len(rest) > 2:
            d["mem_bw"] = rest[2]
        out.append(d)
    return parse_graph({"operators": out, "edges": [list(e) for e in edges]})


# ---- input ------------------------------------------------------------------------------------
@pytest.mark.parametrize("data, message", [
    ([], "JSON object"),
    ({"edges": []}, "'operators' must be a non-empty list"),
    ({"operators": []}, "non-empty list"),
    ({"operators": [{"id": "a", "cpu_util": 0.1}], "edges": {}}, "'edges' must be a list"),
    ({"operators": ["a"]}, "operator 0: expected an object"),
    ({"operators": [{"cpu_util": 0.1}]}, "operator 0: id: must be a non-empty string"),
    ({"operators": [{"id": "a", "cpu_util": 0.1}, {"id": "a", "cpu_util": 0.2}]}, "operator 1 ('a'): id: appears more than once"),
    ({"operators": [{"id": "a", "cpu_util": 1.2}]}, "operator 0 ('a'): cpu_util: must be a number in [0, 1]"),
    ({"operators": [{"id": "a", "cpu_util": -0.1}]}, "cpu_util"),
    ({"operators": [{"id": "a", "cpu_util": True}]}, "cpu_util"),
    ({"operators": [{"id": "a"}]}, "cpu_util"),
    ({"operators": [{"id": "a", "cpu_util": float("nan")}]}, "cpu_util"),
    ({"operators": [{"id": "a", "cpu_util": 0.1, "mem_bw": -1}]}, "mem_bw: must be a number of bytes/s"),
    ({"operators": [{"id": "a", "cpu_util": 0.1, "mem_bw": "1GB"}]}, "mem_bw"),
    ({"operators": [{"id": "a", "cpu_util": 0.1, "blocking": "yes"}]}, "blocking: must be true or false"),
    ({"operators": [{"id": "a", "cpu_util": 0.1, "siblings": ""}]}, "siblings"),
    ({"operators": [{"id": "a", "cpu_util": 0.1}], "edges": [["a"]]}, "edge 0: expected [from, to]"),
    ({"operators": [{"id": "a", "cpu_util": 0.1}], "edges": [["a", "b"]]}, "edge 0 ('a' -> 'b'): unknown operator 'b'"),
    ({"operators": [{"id": "a", "cpu_util": 0.1}], "edges": [["a", "a"]]}, "cannot feed itself"),
    # issue 47: cycles of any length were accepted (a dataflow plan is acyclic)
    ({"operators": [{"id": "a", "cpu_util": 0.1}, {"id": "b", "cpu_util": 0.1}], "edges": [["a", "b"], ["b", "a"]]},
     "is a cycle of 2 operators"),
    ({"operators": [{"id": x, "cpu_util": 0.1} for x in "abcd"], "edges": [["a", "b"], ["b", "c"], ["c", "d"], ["d", "b"]]},
     "edges: 'b' -> 'c' -> 'd' -> 'b' is a cycle of 3 operators"),
    ({"operators": [{"id": f"o{i}", "cpu_util": 0.01} for i in range(50)],
      "edges": [[f"o{i}", f"o{(i + 1) % 50}"] for i in range(50)]}, "-> ... is a cycle of 50 operators"),
])
def test_bad_graphs_are_refused_with_the_place_named(data, message):
    with pytest.raises(GraphError) as err:
        parse_graph(data)
    assert message in str(err.value)


def test_other_keys_are_ignored_and_defaults_apply():
    g = parse_graph({"operators": [{"id": "a", "cpu_util": 0.25, "tid": 7, "ipc": None}],
                     "edges": [], "profile": {"pid": 1}})
    [op] = g.operators
    assert (op.blocking, op.siblings, op.mem_bw) == (False, None, None)
    g = parse_graph({"operators": [{"id": "a", "cpu_util": 0.1}, {"id": "b", "cpu_util": 0.1}],
                     "edges": [["a", "b"], ["a", "b"]]})
    assert g.edges == (("a", "b"),)


# ---- phase 1 ----------------------------------------------------------------------------------
B, N = True, False  # blocking, non-blocking

PHASE1 = [
    ("chain of three blocking operators",
     [("a", .1, B), ("b", .2, B), ("c", .3, B)], [("a", "b"), ("b", "c")],
     [["a", "b", "c"]]),
    ("a non-blocking operator breaks the pipeline",
     [("a", .1, B), ("x", .2, N), ("c", .3, B)], [("a", "x"), ("x", "c")],
     [["a"], ["x"], ["c"]]),
    ("non-blocking neighbours do not merge",
     [("a", .1, N), ("b", .2, N)], [("a", "b")],
     [["a"], ["b"]]),
    ("a branch (a feeds two) is not a pipeline",
     [("a", .1, B), ("b", .2, B), ("c", .3, B)], [("a", "b"), ("a", "c")],
     [["a"], ["b"], ["c"]]),
    ("a merge (c fed by two) is not a pipeline",
     [("a", .1, B), ("b", .2, B), ("c", .3, B)], [("a", "c"), ("b", "c")],
     [["a"], ["b"], ["c"]]),
    ("the non-branching tail after a merge collapses",
     [("a", .1, N), ("b", .1, N), ("j", .2, B), ("s", .2, B), ("t", .1, B)],
     [("a", "j"), ("b", "j"), ("j", "s"), ("s", "t")],
     [["a"], ["b"], ["j", "s", "t"]]),
    ("the paper's Figure 5: sort -> group -> top-N between a join and the output",
     [("join", .4, N), ("sort", .2, B), ("group", .1, B), ("top", .05, B), ("out", .05, N)],
     [("join", "sort"), ("sort", "group"), ("group", "top"), ("top", "out")],
     [["join"], ["sort", "group", "top"], ["out"]]),
    ("a pipeline over one core is cut where it would overflow",
     [("a", .6, B), ("b", .5, B), ("c", .3, B)], [("a", "b"), ("b", "c")],
     [["a"], ["b", "c"]]),
]


@pytest.mark.parametrize("name, ops, edges, expected", PHASE1, ids=[p[0] for p in PHASE1])
def test_phase1_collapses_pipelines_of_blocking_operators(name, ops, edges, expected):
    g = graph(ops, edges)
    compounds = collapse(g)
    assert [list(c.members) for c in compounds] == expected
    util = {op.id: op.util_units for op in g.operators}
    for c in compounds:  # Eq. 3 and 4: RAVs summed
        assert c.util == sum(util[m] for m in c.members)
        assert c.mem_bw == len(c.members) * 100_000_000
        assert c.id == "+".join(c.members)


def test_phase1_cuts_a_cycle_it_is_handed_at_its_first_operator():
    """parse_graph refuses cycles; a Graph built by hand with one still collapses, cut at its first operator."""
    g = dataclasses.replace(graph([("a", .1, True), ("b", .1, True)], [("a", "b")]), edges=(("a", "b"), ("b", "a")))
    assert [list(c.members) for c in collapse(g)] == [["a", "b"]]


def test_phase1_unknown_bandwidth_is_carried_and_siblings_inherited():
    g = parse_graph({"operators": [
        {"id": "a", "cpu_util": .1, "blocking": True, "siblings": "p", "mem_bw": 1e9},
        {"id": "b", "cpu_util": .1, "blocking": True, "mem_bw": None}], "edges": [["a", "b"]]})
    [c] = collapse(g)
    assert (c.mem_bw, c.mem_bw_known, c.sibling_groups) == (1_000_000_000, False, frozenset({"p"}))


# ---- phase 2 ----------------------------------------------------------------------------------
def sizes_of(*utils: float) -> list[int]:
    return [round(u * U) for u in utils]


FFD = [
    ("fits in one", [.3, .3, .3], None, [[0, 1, 2]]),
    ("first fit, largest first", [.2, .7, .5, .3], None, [[1, 3], [2, 0]]),
    ("exactly full", [.5, .5, .5, .5], None, [[0, 1], [2, 3]]),
    ("siblings never share a bin even with room", [.5, .4], ["s", "s"], [[0], [1]]),
    # Algorithm 1, line 5: .3s skips bin 0 (holds its sibling) but .3 still fits there.
    ("sibling skips to the next bin, others still first-fit", [.6, .3, .3], ["s", "s", None], [[0, 2], [1]]),
    ("a sibling takes a later bin that has room", [.5, .5, .4, .4], ["p", None, "p", None], [[0, 1], [2, 3]]),
]


@pytest.mark.parametrize("name, utils, sib, expected", FFD, ids=[f[0] for f in FFD])
def test_phase2_first_fit_decreasing_with_the_sibling_rule(name, utils, sib, expected):
    groups = [frozenset([s]) if s else frozenset() for s in (sib or [None] * len(utils))]
    bins = binpack.first_fit_decreasing(sizes_of(*utils), U, groups)
    assert bins == expected
    assert binpack.is_valid_packing(bins, sizes_of(*utils), U, groups)


def brute_force_min_bins(sizes, cap, groups) -> int:
    """The minimum over every assignment of items to bins (tiny instances only)."""
    n = len(sizes)
    for k in range(1, n + 1):
        for assign in itertools.product(range(k), repeat=n):
            if assign and max(assign) != k - 1:
                continue
            bins = [[i for i in range(n) if assign[i] == b] for b in range(k)]
            if binpack.is_valid_packing(bins, sizes, cap, groups):
                return k
    return n


def test_exact_finds_what_ffd_misses():
    # FFD: .58+.28 | .53+.18+.17 | .16, where .58+.18+.16 | .53+.28+.17 takes two cores.
    utils = [.58, .53, .28, .18, .17, .16]
    sizes = sizes_of(*utils)
    groups = [frozenset()] * len(sizes)
    ffd = binpack.first_fit_decreasing(sizes, U, groups)
    exact = binpack.exact_min_bins(sizes, U, groups, ffd, time_limit_s=10)
    assert exact.status == "optimal"
    assert binpack.is_valid_packing(exact.bins, sizes, U, groups)
    assert exact.count == 2 < len(ffd) == 3
    assert brute_force_min_bins(sizes, U, groups) == 2


def test_exact_respects_siblings():
    sizes = sizes_of(.1, .1, .1, .1)
    groups = [frozenset({"s"})] * 4
    ffd = binpack.first_fit_decreasing(sizes, U, groups)
    exact = binpack.exact_min_bins(sizes, U, groups, ffd)
    assert len(ffd) == exact.count == 4


def test_lower_bound():
    assert binpack.lower_bound(sizes_of(.6, .6, .1), U) == 2
    assert binpack.lower_bound(sizes_of(.1, .1, .1), U, [frozenset({"s"})] * 3) == 3
    assert binpack.lower_bound(sizes_of(.5, .5, .5), U) == 2


def test_balance_evens_the_cores_without_adding_one():
    sizes = sizes_of(.6, .4, .3, .3, .2)
    groups = [frozenset()] * 5
    ffd = binpack.first_fit_decreasing(sizes, U, groups)
    assert [sum(sizes[i] for i in b) for b in ffd] == [U, round(.8 * U)]
    bal = binpack.balance(sizes, U, groups, ffd, time_limit_s=5)
    assert len(bal.bins) == len(ffd)
    assert binpack.is_valid_packing(bal.bins, sizes, U, groups)
    assert (bal.max_after, bal.min_after) == (round(.9 * U), round(.9 * U))
    assert bal.status == "optimal"


def test_balance_keeps_siblings_apart_and_leaves_balanced_bins_alone():
    sizes = sizes_of(.5, .5, .5, .5)
    groups = [frozenset({"s"}), frozenset({"s"}), frozenset(), frozenset()]
    ffd = binpack.first_fit_decreasing(sizes, U, groups)
    bal = binpack.balance(sizes, U, groups, ffd, time_limit_s=5)
    assert bal.status == "unchanged" and bal.bins == ffd and bal.moved == 0


# ---- phases 3 and 4 through deploy() ------------------------------------------------------------
def test_phase3_packs_by_bandwidth():
    # Four single-operator cores of 5 GB/s: two fit a 12.5 GB/s node, so two nodes.
    g = graph([(f"o{i}", .9, N, None, 5e9) for i in range(4)])
    plan = deploy(g, machines.load("magnycours"))
    assert plan.cores == 4
    assert plan.numa.count_ffd == plan.numa.count_optimal == 2
    per_node = {u.node: len(u.clusters) for u in plan.numa.usage}
    assert sorted(per_node.values()) == [2, 2]
    # Two nodes one hop apart: the pair on one package (distance 16).
    assert plan.numa.nodes in {(0, 1), (2, 3), (4, 5), (6, 7)}
    assert plan.numa.choice.links == 1 and plan.numa.density == 0.5


def test_phase3_packs_by_core_count():
    g = graph([(f"o{i}", .9, N, None, 1e6) for i in range(7)])  # 7 cores, nodes of 6
    plan = deploy(g, machines.load("magnycours"))
    assert plan.cores == 7 and len(plan.numa.nodes) == 2
    assert sorted(len(u.clusters) for u in plan.numa.usage) == [1, 6]


def test_node_bandwidth_override_changes_phase3():
    g = graph([(f"o{i}", .9, N, None, 5e9) for i in range(4)])
    plan = deploy(g, machines.load("magnycours"), Options(node_bandwidth={n: 30_000_000_000 for n in range(8)}))
    assert plan.numa.nodes == (0,)


def test_phase4_skips_a_densest_set_that_cannot_hold_the_clusters():
    # Node 1 keeps one usable CPU, so {0, 1} (the first linked pair) has 7 cores for 8 clusters.
    g = graph([(f"o{i}", .9, N, None, 1e6) for i in range(8)])
    plan = deploy(g, machines.load("magnycours"), Options(unavailable=tuple(range(7, 12))))
    assert plan.numa.nodes == (2, 3)
    assert plan.numa.choice.links == 1


def test_every_operator_is_placed_and_siblings_get_different_cpus():
    ops = [(f"s{i}", .3, N, "scan") for i in range(6)] + [(f"j{i}", .2, N) for i in range(6)]
    plan = deploy(graph(ops), machines.load("nehalem-ex"))
    assert set(plan.placement) == {o[0] for o in ops}
    assert len({plan.placement[f"s{i}"] for i in range(6)}) == 6
    cpus = [c.cpu for c in plan.clusters]
    assert len(set(cpus)) == len(cpus) == plan.min_cores == plan.cores
    nodes = machines.load("nehalem-ex").node_of_cpu()
    assert {nodes[c] for c in cpus} <= set(plan.numa.nodes)
    for c in plan.clusters:
        assert c.util <= U


def test_too_small_a_machine_is_infeasible():
    g = graph([(f"o{i}", .9) for i in range(3)])
    with pytest.raises(InfeasibleError, match="needs 3 cores; shanghai has 2 usable"):
        deploy(g, machines.load("shanghai"), Options(unavailable=tuple(range(2, 16))))


def test_bind_places_the_clusters_inside_the_given_cpus():
    g = graph([(f"o{i}", .6) for i in range(3)])
    m = machines.load("magnycours")
    plan = deploy(g, m)
    placed = bind(plan, m, [12, 13, 14, 30])
    assert set(placed.placement.values()) <= {12, 13, 14}  # node 2 holds all three
    assert placed.min_cores == plan.min_cores == 3
    with pytest.raises(InfeasibleError, match="needs 3 CPUs"):
        bind(plan, m, [12, 13])


def test_unknown_bandwidths_are_warned_about():
    g = parse_graph({"operators": [{"id": "a", "cpu_util": .5, "mem_bw": None}]})
    m = machines.load("magnycours")
    bare = dataclasses.replace(m, numa_nodes=tuple(dataclasses.replace(n, bandwidth_bytes_per_s=None)
                                                   for n in m.numa_nodes))
    plan = deploy(g, bare)
    text = " ".join(plan.warnings)
    assert "mem_bw unknown for 1 operator(s) (a)" in text
    assert "bandwidth capacity unknown for NUMA node(s) 0, 1" in text


# ---- the TPC-W-shaped plan (the paper's Section 5.4) -------------------------------------------
PAPER_CORES = {"magnycours": 6, "nehalem-ex": 5}


@pytest.mark.parametrize("machine", sorted(PAPER_CORES))
def test_tpcw_plan_compresses_like_the_paper(machine):
    data = json.loads((DATA / "plans" / f"tpcw_{machine}.json").read_text())
    plan = deploy(parse_graph(data), machines.load(machine))
    assert plan.operators == 44
    assert len(plan.compounds) == 32                  # phase 1: 44 -> 32
    assert plan.cores == PAPER_CORES[machine]          # phase 2: -> 6 (AMD), 5 (Intel)
    assert plan.cores_optimal == plan.cores            # FFD is optimal here
    assert len(plan.numa.nodes) == 1                   # the plan fits one NUMA node
    assert len(plan.placement) == 44


def test_the_exact_packing_is_deployed_when_it_needs_fewer_cores():
    # The instance of test_exact_finds_what_ffd_misses as operators: FFD 3 cores, optimum 2.
    g = graph([(f"o{i}", u) for i, u in enumerate([.58, .53, .28, .18, .17, .16])])
    plan = deploy(g, machines.load("magnycours"))
    assert (plan.cores, plan.cores_optimal, plan.min_cores) == (3, 2, 2)
    assert len(set(plan.placement.values())) == 2
    paper = deploy(g, machines.load("magnycours"), Options(prefer_exact=False))
    assert paper.min_cores == 3

"""The planner's own bounds (issue 47, item 3): what refuses a plan before any packing, the epilogue
and the exact searches kept to models of bounded size, and the plan's JSON form the RM reads back from
its planner process.  Pure: table-driven, the reference machines."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import re
from pathlib import Path

import pytest

from cod.facts import machines
from cod.rm.deploy import (DeployError, GraphLimits, GraphTooLarge, InfeasibleError, Options, binpack, check_bytes,
                           check_size, deploy, parse_graph, quick_demand)
from cod.rm.deploy.screen import demand_of
from cod.rm.deploy.collapse import collapse
from cod.rm.deploy.wire import WireError, check_plan, decode_plan, encode

from helpers.paths import TESTS

U = 1_000_000
PLANS = TESTS / "data" / "plans"


def chain(n: int, util: float, blocking: bool = False, siblings: str | None = None) -> dict:
    ops = [{"id": f"op{i}", "cpu_util": util, "mem_bw": 1e8, "blocking": blocking,
            **({"siblings": siblings} if siblings else {})} for i in range(n)]
    return {"operators": ops, "edges": [[f"op{i}", f"op{i + 1}"] for i in range(n - 1)]}


# ---- the lower bound, before any packing -----------------------------------------------------------
@pytest.mark.parametrize("graph, cores, why", [
    (chain(10, 0.9), 10, "10 operator(s) need more than half the capacity"),
    (chain(10, 0.5), 5, "their cpu_util adds up to 5.00 cores"),  # 0.5 is not more than half
    (chain(3, 0.1, siblings="scan"), 3, "the 3 threads of sibling group 'scan' may not share a core"),
    # Blocking siblings in a pipeline collapse into one compound operator: one core holds them.
    (chain(3, 0.1, blocking=True, siblings="scan"), 1, "their cpu_util adds up to 0.30 cores"),
    ({"operators": [{"id": "a", "cpu_util": 0.0}]}, 1, "their cpu_util adds up to 0.00 cores"),
])
def test_the_demand_after_phase_1(graph, cores, why):
    need = demand_of(collapse(parse_graph(graph), U), U)
    assert need.cores == cores and why in need.why
    sizes = [c.util for c in collapse(parse_graph(graph), U)]
    groups = [c.sibling_groups for c in collapse(parse_graph(graph), U)]
    assert need.cores == binpack.lower_bound(sizes, U, groups)  # the same bound, in words


@pytest.mark.parametrize("data, cores", [
    (chain(10, 0.9), 10),
    (chain(10, 0.5), 5),
    (chain(3, 0.1, siblings="scan"), 1),  # no sibling bound on the raw graph: collapsing may merge them
    # Malformed parts count for nothing (parse_graph refuses them later), and nothing raises.
    ({"operators": [{"id": "a", "cpu_util": 0.9}, {"cpu_util": "x"}, 7, {"cpu_util": True}, {"cpu_util": 2}]}, 1),
    ({"operators": "none"}, 0),
    ([1, 2], 0),
])
def test_the_quick_demand_of_a_raw_graph(data, cores):
    assert quick_demand(data).cores == cores


@pytest.mark.parametrize("seed", range(20))
def test_each_bound_is_below_the_next(seed):
    """The quick demand <= the demand after phase 1 <= the cores of the plan (random plans)."""
    rng = random.Random(seed)
    n = rng.randrange(1, 80)
    ops = [{"id": f"o{i}", "cpu_util": round(rng.choice([rng.uniform(0, 0.2), rng.uniform(0.4, 1)]), 3),
            "blocking": rng.random() < 0.5, **({"siblings": f"s{i % 3}"} if rng.random() < 0.3 else {})}
           for i in range(n)]
    data = {"operators": ops, "edges": [[f"o{rng.randrange(i)}", f"o{i}"] for i in range(1, n)]}
    graph = parse_graph(data)
    full = demand_of(collapse(graph, U), U)
    assert quick_demand(data).cores <= full.cores
    try:
        plan = deploy(graph, machines.load("magnycours"), Options(exact=False, balance=False))
    except InfeasibleError:
        return
    assert full.cores <= plan.min_cores


@pytest.mark.parametrize("graph, machine, message", [
    (chain(300, 0.9), "magnycours", "the plan needs 300 cores; magnycours has 48 usable (no packing needs fewer: "
                                    "300 operator(s) need more than half"),
    (chain(3, 0.2, siblings="s"), "shanghai", "the plan needs 3 cores; shanghai has 2 usable (no packing needs "
                                              "fewer: the 3 threads of sibling group 's'"),
])
def test_a_plan_that_cannot_fit_is_refused_after_phase_1(graph, machine, message):
    unavailable = tuple(range(2, 16)) if machine == "shanghai" else ()
    with pytest.raises(InfeasibleError, match=re.escape(message)):
        deploy(parse_graph(graph), machines.load(machine), Options(unavailable=unavailable))


def test_a_packing_that_does_not_fit_is_refused_before_the_epilogue():
    # 0.4 0.4 0.3 0.3 0.3 0.3: the bound is 2, FFD needs 3; without the exact search 3 do not fit in 2.
    g = parse_graph({"operators": [{"id": f"o{i}", "cpu_util": u} for i, u in enumerate([.4, .4, .3, .3, .3, .3])]})
    with pytest.raises(InfeasibleError, match="the plan needs 3 cores; shanghai has 2 usable$"):
        deploy(g, machines.load("shanghai"), Options(unavailable=tuple(range(2, 16)), exact=False))
    assert deploy(g, machines.load("shanghai"), Options(unavailable=tuple(range(2, 16)))).min_cores == 2


# ---- models of bounded size ------------------------------------------------------------------------
def test_the_epilogue_is_skipped_beyond_the_models_bound():
    n = binpack.EXACT_MAX_VARS // 150 + 1  # items x bins just past the bound
    sizes = [U // 2 + 1] * 150 + [1] * (n - 150)
    bins = [[i] for i in range(150)]
    bins[0] += list(range(150, n))
    bal = binpack.balance(sizes, U, None, bins)
    assert n * len(bins) > binpack.EXACT_MAX_VARS
    assert bal.status == "skipped" and bal.bins == bins and bal.moved == 0


@pytest.mark.parametrize("old, new, moved", [
    ([[0, 1], [2, 3]], [[0, 1], [2, 3]], 0),
    ([[0, 1], [2, 3]], [[2, 3], [0, 1]], 0),  # bins are unlabelled
    ([[0, 1], [2, 3]], [[0, 2], [1, 3]], 2),
    ([[0, 1, 2], [3]], [[0, 1], [2, 3]], 1),
    ([[0], [1], [2]], [[2], [0], [1]], 0),
])
def test_moved_counts_the_items_that_left_their_bin(old, new, moved):
    assert binpack._moved(old, new) == moved


# ---- the caller's limits ---------------------------------------------------------------------------
@pytest.mark.parametrize("data, setting, requested", [
    (chain(5, 0.1), "deploy_max_operators", 5),
    ({"operators": [{"id": "a", "cpu_util": 0.1}], "edges": [["a", "b"]] * 9}, "deploy_max_edges", 9),
])
def test_counts_beyond_the_limits(data, setting, requested):
    with pytest.raises(GraphTooLarge) as err:
        check_size(data, GraphLimits(operators=4, edges=8))
    assert (err.value.setting, err.value.requested) == (setting, requested)
    assert f"at most {err.value.limit} (setting {setting})" in str(err.value)


def test_counts_and_bytes_within_the_limits():
    check_size(chain(4, 0.1), GraphLimits(operators=4, edges=8))
    check_size("not a graph", GraphLimits(operators=4))  # parse_graph's to refuse
    check_bytes(100, GraphLimits(json_bytes=100))
    with pytest.raises(GraphTooLarge, match="101 bytes of JSON; at most 100"):
        check_bytes(101, GraphLimits(json_bytes=100))


# ---- the plan's JSON ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tpcw():
    m = machines.load("magnycours")
    graph = parse_graph(json.loads((PLANS / "tpcw_magnycours.json").read_text()))
    return deploy(graph, m, Options(time_limit_s=0.5)), graph, m


def test_a_plan_comes_back_as_it_was(tpcw):
    plan, graph, m = tpcw
    text = json.dumps(encode(plan), allow_nan=False)
    again = decode_plan(json.loads(text))
    assert again == plan
    check_plan(again, [op.id for op in graph.operators], m)


def _edit(path: str, value):
    def apply(data):
        *parents, last = path.split(".")
        node = data
        for p in parents:
            node = node[int(p)] if p.isdigit() else node[p]
        if value is KeyError:
            del node[last]
        else:
            node[int(last) if last.isdigit() else last] = value
        return data
    return apply


@pytest.mark.parametrize("edit, where", [
    (_edit("cores", True), "plan.cores: expected int"),
    (_edit("cores", "6"), "plan.cores: expected int"),
    (_edit("capacity", math.inf), "plan.capacity: expected float"),
    (_edit("clusters", {}), "plan.clusters: expected a list"),
    (_edit("clusters.0.members.0", 7), r"plan.clusters\[0\].members\[0\]: expected str"),
    (_edit("clusters.0.extra", 1), r"plan.clusters\[0\]: expected the fields"),
    (_edit("numa.choice", KeyError), "plan.numa: expected the fields"),
    (_edit("placement", {"a": 1}), "plan.placement: expected a list of"),
    (_edit("cores_optimal", [1]), "plan.cores_optimal: expected int, got list"),
])
def test_a_malformed_plan_is_refused_naming_the_field(tpcw, edit, where):
    data = edit(json.loads(json.dumps(encode(tpcw[0]))))
    with pytest.raises(WireError, match=where):
        decode_plan(data)


@pytest.mark.parametrize("change, message", [
    (lambda p, ids: (dataclasses.replace(p, operators=p.operators + 1), ids), "does not place the 44 operators"),
    (lambda p, ids: (p, ids[:-1] + ["someone_else"]), "does not place"),
    (lambda p, ids: (dataclasses.replace(p, clusters=(dataclasses.replace(p.clusters[0], cpu=999),) + p.clusters[1:]),
                     ids), "puts its clusters on CPUs"),
    (lambda p, ids: (dataclasses.replace(p, clusters=(dataclasses.replace(p.clusters[0], cpu=p.clusters[1].cpu),)
                                         + p.clusters[1:]), ids), "puts its clusters on CPUs"),
    (lambda p, ids: (dataclasses.replace(p, placement={**p.placement, ids[0]: 47}), ids), "placement"),
])
def test_a_plan_for_something_else_is_refused(tpcw, change, message):
    plan, graph, m = tpcw
    bad, ids = change(plan, [op.id for op in graph.operators])
    with pytest.raises(DeployError, match=message):
        check_plan(bad, ids, m)

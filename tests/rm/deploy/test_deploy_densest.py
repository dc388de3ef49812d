"""Phase 4: the densest k-subgraph of the NUMA interconnect against brute force."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections import deque

import pytest

from cod.facts import hwloc_xml, machines
from cod.facts.model import NumaNode
from cod.rm.deploy import Options, deploy, parse_graph
from cod.rm.deploy.densest import densest, interconnect
from helpers.data import DATA, HWLOC_DIR


def best_by_brute_force(ic, k, cands, feasible=lambda s: True):
    scored = [(ic.score(s), s) for s in itertools.combinations(sorted(cands), k) if feasible(s)]
    if not scored:
        return None
    (links, dist), _ = max(scored, key=lambda x: (x[0][0], -x[0][1]))
    return links, dist


def multi_node_machines():
    out = [machines.load(n) for n in machines.names()]
    for path in sorted(HWLOC_DIR.glob("*.xml")):
        m = hwloc_xml.load(path)
        if len(m.numa_nodes) > 1:
            out.append(m)
    return out


MACHINES = multi_node_machines()


@pytest.mark.parametrize("machine", MACHINES, ids=lambda m: m.name)
def test_exhaustive_matches_brute_force_for_every_k(machine):
    ic = interconnect(machine.numa_nodes)
    nodes = [n.id for n in machine.numa_nodes]
    for k in range(1, len(nodes) + 1):
        if sum(1 for _ in itertools.combinations(nodes, k)) > 20_000:
            continue
        choice = densest(ic, k, nodes)
        assert (choice.links, choice.total_distance) == best_by_brute_force(ic, k, nodes), k
        assert len(choice.nodes) == k and choice.optimal


@pytest.mark.parametrize("machine", [m for m in MACHINES if len(m.numa_nodes) >= 8], ids=lambda m: m.name)
def test_cpsat_matches_brute_force(machine):
    """The bounded exact method (forced by an exhaustive limit of 0) finds the same optimum."""
    ic = interconnect(machine.numa_nodes)
    nodes = [n.id for n in machine.numa_nodes]
    for k in range(2, min(len(nodes), 5) + 1):
        choice = densest(ic, k, nodes, exhaustive_limit=0, time_limit_s=10)
        assert choice.method == "cpsat" and choice.optimal
        assert (choice.links, choice.total_distance) == best_by_brute_force(ic, k, nodes), k


def test_cpsat_cuts_off_infeasible_sets():
    m = hwloc_xml.load(HWLOC_DIR / "192em64t-24n8c2t.xml")
    ic = interconnect(m.numa_nodes)
    nodes = [n.id for n in m.numa_nodes]
    first = densest(ic, 4, nodes, exhaustive_limit=0)
    banned = set(first.nodes[:1])
    feasible = lambda s: not (set(s) & banned)  # noqa: E731
    choice = densest(ic, 4, nodes, feasible, exhaustive_limit=0, time_limit_s=10)
    assert not set(choice.nodes) & banned and choice.sets_examined >= 2
    assert (choice.links, choice.total_distance) == best_by_brute_force(ic, 4, nodes, feasible)


def figure7_nodes():
    fig = json.loads((DATA / "plans" / "figure7.json").read_text())
    n = fig["nodes"]
    adj = {i: set() for i in range(n)}
    for a, b in fig["links"]:
        adj[a].add(b)
        adj[b].add(a)

    def hops(src):
        dist, todo = {src: 0}, deque([src])
        while todo:
            u = todo.popleft()
            for v in adj[u]:
                if v not in dist:
                    dist[v] = dist[u] + 1
                    todo.append(v)
        return dist

    nodes = [NumaNode(i, (i,), None, distances={j: 10 + 6 * h for j, h in hops(i).items()}) for i in range(n)]
    return fig, nodes


def test_figure7_prefers_d1_over_d2():
    fig, nodes = figure7_nodes()
    ic = interconnect(nodes)
    assert ic.link_distance == 16
    assert sorted(ic.links) == sorted(tuple(sorted(e)) for e in fig["links"])
    choice = densest(ic, 4, [n.id for n in nodes])
    assert list(choice.nodes) == fig["D1"]
    assert choice.density == 1.5 and choice.mean_distance == 16  # one hop between every pair

    def mean_hops(s):
        return sum((ic.pair_distance(a, b) - 10) / 6 for a, b in itertools.combinations(s, 2)) / 6
    assert mean_hops(fig["D1"]) == 1.0
    assert round(mean_hops(fig["D2"]), 2) == 1.33
    links_d2, _ = ic.score(fig["D2"])
    assert links_d2 / 4 == 1.0 < choice.density
    # The same through the CP-SAT path.
    assert list(densest(ic, 4, [n.id for n in nodes], exhaustive_limit=0).nodes) == fig["D1"]


def test_figure7_through_deploy():
    """A plan needing four nodes lands on D1 of a Figure 7 machine."""
    fig, nodes = figure7_nodes()
    base = machines.load("magnycours")  # 8 nodes of 6 cores: replace the distances
    by_id = {n.id: n for n in nodes}
    m = dataclasses.replace(base, numa_nodes=tuple(
        dataclasses.replace(n, distances=by_id[n.id].distances) for n in base.numa_nodes))
    ops = [{"id": f"o{i}", "cpu_util": 0.9, "mem_bw": 1e6} for i in range(22)]  # 22 cores: 4 nodes
    plan = deploy(parse_graph({"operators": ops}), m, Options(exact=False, balance=False))
    assert list(plan.numa.nodes) == fig["D1"]
    assert plan.numa.density == 1.5


def test_unknown_distances_count_every_pair_as_linked():
    nodes = [NumaNode(i, (i,), None) for i in range(3)]
    ic = interconnect(nodes)
    assert ic.link_distance is None and len(ic.links) == 3
    assert densest(ic, 2, [0, 1, 2]).nodes == (0, 1)


def test_link_distance_override():
    m = machines.load("magnycours")
    ic = interconnect(m.numa_nodes, link_distance=22)
    assert len(ic.links) == 28  # every pair within 22
    assert densest(ic, 3, list(range(8))).density == 1.0

"""Phase 4: choose which NUMA nodes, as a densest-k-subgraph of the interconnect.

The interconnect graph has a vertex per NUMA node and an edge (a *link*) for
each pair of nodes one hop apart.  Linux gives no link list, only the SLIT
distance matrix, so a pair is linked when its distance is at most the
machine's smallest remote distance (the one-hop distance on the AMD and Intel
boxes of the paper; ``link_distance`` overrides it).  The density of a set of
k nodes is its links divided by k (Section 4.4).

Among the k-sets of greatest density we prefer the smallest total distance
over all pairs (this separates, e.g., sets that are all two hops apart from
sets that are partly three), then the lowest node numbers.  A candidate set
must also pass ``feasible`` (the clusters must pack onto those very nodes).

Small instances are solved by enumerating every k-set, as the paper does;
beyond ``exhaustive_limit`` sets, by CP-SAT with a time limit (exact when it
proves optimality; a rejected set is cut off and the model solved again).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Sequence

from cod.facts.model import NumaNode


@dataclass(frozen=True)
class Interconnect:
    nodes: tuple[int, ...]
    distance: dict[tuple[int, int], int]  # symmetric, both orders present
    link_distance: int | None  # None: distances unknown, every pair counts as linked
    links: frozenset[tuple[int, int]]  # pairs (a, b) with a < b

    def pair_distance(self, a: int, b: int) -> int:
        return self.distance.get((a, b), 0)

    def score(self, subset: Sequence[int]) -> tuple[int, int]:
        """(links, total distance) of a node set."""
        links = dist = 0
        for a, b in itertools.combinations(sorted(subset), 2):
            links += (a, b) in self.links
            dist += self.pair_distance(a, b)
        return links, dist


def interconnect(nodes: Sequence[NumaNode], link_distance: int | None = None) -> Interconnect:
    """The interconnect graph of ``nodes`` from their SLIT distances."""
    ids = tuple(sorted(n.id for n in nodes))
    by_id = {n.id: n for n in nodes}
    dist: dict[tuple[int, int], int] = {}
    known = True
    for a, b in itertools.combinations(ids, 2):
        dab, dba = by_id[a].distances.get(b), by_id[b].distances.get(a)
        if dab is None and dba is None:
            known = False
            continue
        d = max(x for x in (dab, dba) if x is not None)
        dist[a, b] = dist[b, a] = d
    if not known or not dist:
        pairs = frozenset(itertools.combinations(ids, 2))
        return Interconnect(ids, {}, None, pairs)
    threshold = link_distance if link_distance is not None else min(dist.values())
    links = frozenset((a, b) for (a, b), d in dist.items() if a < b and d <= threshold)
    return Interconnect(ids, dist, threshold, links)


@dataclass(frozen=True)
class Choice:
    nodes: tuple[int, ...]
    links: int
    total_distance: int
    method: str  # "single" | "exhaustive" | "cpsat"
    optimal: bool  # proven densest (within the feasible sets)
    sets_examined: int

    @property
    def density(self) -> float:
        return self.links / len(self.nodes) if self.nodes else 0.0

    @property
    def mean_distance(self) -> float | None:
        pairs = len(self.nodes) * (len(self.nodes) - 1) // 2
        return self.total_distance / pairs if pairs else None


def _key(ic: Interconnect, subset: tuple[int, ...]) -> tuple[int, int, tuple[int, ...]]:
    links, dist = ic.score(subset)
    return (-links, dist, subset)


def densest(ic: Interconnect, k: int, candidates: Sequence[int],
            feasible: Callable[[tuple[int, ...]], bool] = lambda s: True, *,
            exhaustive_limit: int = 20_000, time_limit_s: float = 2.0,
            max_cuts: int = 200) -> Choice | None:
    """The densest feasible k-set of ``candidates``, or None if no k-set is feasible."""
    cands = tuple(sorted(candidates))
    if k <= 0 or k > len(cands):
        return None
    if k == 1:
        for c in cands:
            if feasible((c,)):
                return Choice((c,), 0, 0, "single", True, cands.index(c) + 1)
        return None
    if math.comb(len(cands), k) <= exhaustive_limit:
        ranked = sorted(itertools.combinations(cands, k), key=lambda s: _key(ic, s))
        for n, subset in enumerate(ranked, 1):
            if feasible(subset):
                links, dist = ic.score(subset)
                return Choice(subset, links, dist, "exhaustive", True, n)
        return None
    return _densest_cpsat(ic, k, cands, feasible, time_limit_s, max_cuts)


def _densest_cpsat(ic: Interconnect, k: int, cands: tuple[int, ...],
                   feasible: Callable[[tuple[int, ...]], bool], time_limit_s: float,
                   max_cuts: int) -> Choice | None:
    from ortools.sat.python import cp_model

    m = cp_model.CpModel()
    x = {c: m.new_bool_var(f"n{c}") for c in cands}
    m.add(sum(x.values()) == k)
    link_terms, dist_terms = [], []
    for a, b in itertools.combinations(cands, 2):
        y = m.new_bool_var(f"p{a}_{b}")
        # y = x[a] and x[b]
        m.add_bool_and([x[a], x[b]]).only_enforce_if(y)
        m.add_bool_or([x[a].Not(), x[b].Not(), y])
        if (a, b) in ic.links:
            link_terms.append(y)
        d = ic.pair_distance(a, b)
        if d:
            dist_terms.append(d * y)
    # Lexicographic: links, then total distance, then low node numbers.
    max_dist = sum(ic.pair_distance(a, b) for a, b in itertools.combinations(cands, 2)) + 1
    max_rank = sum(range(len(cands))) + 1
    rank = {c: i for i, c in enumerate(cands)}
    m.maximize(sum(link_terms) * max_dist * max_rank
               - sum(dist_terms) * max_rank - sum(rank[c] * x[c] for c in cands))

    deadline_each = max(0.05, time_limit_s)
    proven = True
    for n in range(1, max_cuts + 1):
        s = cp_model.CpSolver()
        s.parameters.num_workers = 1
        s.parameters.random_seed = 0
        s.parameters.max_time_in_seconds = deadline_each
        st = s.solve(m)
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return None
        proven = proven and st == cp_model.OPTIMAL
        subset = tuple(c for c in cands if s.value(x[c]))
        if feasible(subset):
            links, dist = ic.score(subset)
            return Choice(subset, links, dist, "cpsat", proven, n)
        m.add(sum(x[c] for c in subset) <= k - 1)  # cut off this set and look again
    return None

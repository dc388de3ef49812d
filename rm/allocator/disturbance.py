"""O6 as CP-SAT terms, for both models (:mod:`.cpsat` on CPU classes, :mod:`.naive` per CPU).

The objective term is defined on concrete allocations in :func:`.problem.disturbance`: per
unregistered busy process ("other"), the cache-sensitive tasks sharing one of its L3 domains and
the numa-sensitive tasks sharing one of its nodes.  Both models express "task ``t`` uses unit
``u``" by their own indicator variables (``y[t, domain]`` and ``z[t, node]``), so the pairs are
built here once over those.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from ortools.sat.python import cp_model

from .model import TaskSpec

Uses = Mapping[tuple[str, int], cp_model.IntVar]


def disturbance_pairs(m: cp_model.CpModel, others: Sequence[TaskSpec], cache_sensitive: Sequence[TaskSpec],
                      numa_sensitive: Sequence[TaskSpec], y: Uses, z: Uses, domains: Iterable[int],
                      nodes: Iterable[int]) -> list[cp_model.IntVar]:
    """One indicator per (other, sensitive task) pair, at least 1 when they share a domain
    (cache) or a node (numa); O6 minimises their sum."""
    domains, nodes = tuple(domains), tuple(nodes)
    pairs = []
    for o in others:
        for t, use, units in [(t, y, domains) for t in cache_sensitive] + [(t, z, nodes) for t in numa_sensitive]:
            pv = m.new_bool_var(f"near{o.name}_{t.name}")
            for u in units:
                m.add(pv >= use[o.name, u] + use[t.name, u] - 1)
            pairs.append(pv)
    return pairs

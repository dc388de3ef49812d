"""Phase 1: collapse pipelines of blocking operators into compound operators.

An edge u -> v is *collapsible* when both operators are blocking and the flow
between them does not branch: u feeds only v and v is fed only by u.  Then v
can only run after u has produced its whole result, so the two never overlap
and may share a core one after the other (the paper's Section 4.1).  A maximal
run of collapsible edges is an operator pipeline; it becomes one compound
operator whose RAV is the sum of its members' (Eq. 3 and 4).

Beyond the paper: a pipeline whose summed cpu_util would exceed one core is
cut into consecutive compound operators that each fit, since a compound
operator is placed on a single core.
"""

from __future__ import annotations

from dataclasses import dataclass

from .graph import UTIL_SCALE, Graph, Operator


@dataclass(frozen=True)
class Compound:
    """One schedulable unit after phase 1: a pipeline of operators, or a single one."""

    id: str
    members: tuple[str, ...]
    util: int  # millionths of a core (Eq. 3)
    mem_bw: int  # bytes/s (Eq. 4); unknown member bandwidths count as 0
    mem_bw_known: bool
    sibling_groups: frozenset[str]

    @property
    def cpu_util(self) -> float:
        return self.util / UTIL_SCALE


def compound_of(members: list[Operator]) -> Compound:
    return Compound(
        id="+".join(op.id for op in members),
        members=tuple(op.id for op in members),
        util=sum(op.util_units for op in members),
        mem_bw=sum(op.mem_bw_units for op in members),
        mem_bw_known=all(op.mem_bw is not None for op in members),
        sibling_groups=frozenset(op.siblings for op in members if op.siblings is not None),
    )


def pipelines(graph: Graph) -> list[list[str]]:
    """Maximal chains of collapsible edges, each in dataflow order (singletons included)."""
    ops = {op.id: op for op in graph.operators}
    out_deg: dict[str, int] = {i: 0 for i in ops}
    in_deg: dict[str, int] = {i: 0 for i in ops}
    for a, b in graph.edges:
        out_deg[a] += 1
        in_deg[b] += 1
    nxt: dict[str, str] = {}
    prev: dict[str, str] = {}
    for a, b in graph.edges:
        if ops[a].blocking and ops[b].blocking and out_deg[a] == 1 and in_deg[b] == 1:
            nxt[a] = b
            prev[b] = a

    order = {op.id: i for i, op in enumerate(graph.operators)}
    chains: list[list[str]] = []
    done: set[str] = set()

    def walk(head: str) -> None:
        chain, cur = [], head
        while cur is not None and cur not in done:
            chain.append(cur)
            done.add(cur)
            cur = nxt.get(cur)
        chains.append(chain)

    for op in graph.operators:
        if op.id not in prev:
            walk(op.id)
    # What is left lies on cycles of collapsible edges: cut each at its first operator.
    for op in graph.operators:
        if op.id not in done:
            walk(op.id)
    chains.sort(key=lambda c: order[c[0]])
    return chains


def collapse(graph: Graph, capacity: int = UTIL_SCALE) -> list[Compound]:
    """Phase 1: the compound operators, in the order of their first member in the input.

    ``capacity`` is one core in millionths; a pipeline is cut where its running
    sum of cpu_util would exceed it.
    """
    ops = {op.id: op for op in graph.operators}
    out: list[Compound] = []
    for chain in pipelines(graph):
        part: list[Operator] = []
        load = 0
        for op_id in chain:
            op = ops[op_id]
            if part and load + op.util_units > capacity:
                out.append(compound_of(part))
                part, load = [], 0
            part.append(op)
            load += op.util_units
        out.append(compound_of(part))
    return out

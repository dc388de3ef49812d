"""The input of plan deployment: a dataflow graph of operator threads with their RAVs.

The JSON shape (docs/deploy.md)::

    {"operators": [{"id": "scan0_1", "cpu_util": 0.42, "mem_bw": 2.0e9,
                    "blocking": false, "siblings": "scan0"}, ...],
     "edges": [["scan0_1", "join3"], ...]}

``cpu_util`` is the share of one core the thread uses over the workload (the
paper's Eq. 1), in [0, 1]; ``mem_bw`` its memory traffic in bytes/s averaged
over the same window (Eq. 2), or null when unknown (no PMU); ``blocking``
whether the operator consumes its whole input before producing output;
``siblings`` names the parallel operator whose threads these are (two siblings
never share a core).  Other keys are allowed and ignored, so a profile can carry
its raw counters along.

Resource amounts are kept as integers from here on (cpu_util in millionths of
a core, bandwidth in bytes/s) so every packing, heuristic or exact, compares
the same numbers.
"""

from __future__ import annotations

import graphlib
import math
from dataclasses import dataclass
from typing import Any

from .errors import GraphError

# cpu_util is carried in millionths of a core.
UTIL_SCALE = 1_000_000


@dataclass(frozen=True)
class Operator:
    id: str
    cpu_util: float
    mem_bw: float | None  # bytes/s; None = unknown
    blocking: bool = False
    siblings: str | None = None

    @property
    def util_units(self) -> int:
        return round(self.cpu_util * UTIL_SCALE)

    @property
    def mem_bw_units(self) -> int:
        """Bytes/s as an integer; an unknown bandwidth counts as 0 (callers warn)."""
        return 0 if self.mem_bw is None else round(self.mem_bw)


@dataclass(frozen=True)
class Graph:
    operators: tuple[Operator, ...]
    edges: tuple[tuple[str, str], ...]

    def operator(self, op_id: str) -> Operator:
        for op in self.operators:
            if op.id == op_id:
                return op
        raise KeyError(op_id)

    def to_dict(self) -> dict[str, Any]:
        ops = []
        for op in self.operators:
            d: dict[str, Any] = {"id": op.id, "cpu_util": op.cpu_util, "mem_bw": op.mem_bw,
                                 "blocking": op.blocking}
            if op.siblings is not None:
                d["siblings"] = op.siblings
            ops.append(d)
        return {"operators": ops, "edges": [list(e) for e in self.edges]}


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def parse_graph(data: Any) -> Graph:
    """Validate ``data`` (parsed JSON) and return the graph; GraphError says what is wrong."""
    if not isinstance(data, dict):
        raise GraphError(f"graph: expected a JSON object with 'operators' and 'edges', got {type(data).__name__}")
    raw_ops = data.get("operators")
    if not isinstance(raw_ops, list) or not raw_ops:
        raise GraphError("graph: 'operators' must be a non-empty list")
    raw_edges = data.get("edges", [])
    if not isinstance(raw_edges, list):
        raise GraphError("graph: 'edges' must be a list of [from, to] pairs")

    ops: list[Operator] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_ops):
        where = f"operator {i}"
        if not isinstance(raw, dict):
            raise GraphError(f"{where}: expected an object, got {type(raw).__name__}")
        op_id = raw.get("id")
        if not isinstance(op_id, str) or not op_id:
            raise GraphError(f"{where}: id: must be a non-empty string, got {op_id!r}")
        where = f"operator {i} ({op_id!r})"
        if op_id in seen:
            raise GraphError(f"{where}: id: appears more than once")
        seen.add(op_id)
        util = raw.get("cpu_util")
        if not _is_number(util) or not 0 <= util <= 1:
            raise GraphError(f"{where}: cpu_util: must be a number in [0, 1], got {util!r}")
        bw = raw.get("mem_bw")
        if bw is not None and (not _is_number(bw) or bw < 0):
            raise GraphError(f"{where}: mem_bw: must be a number of bytes/s >= 0 or null, got {bw!r}")
        blocking = raw.get("blocking", False)
        if not isinstance(blocking, bool):
            raise GraphError(f"{where}: blocking: must be true or false, got {blocking!r}")
        siblings = raw.get("siblings")
        if siblings is not None and (not isinstance(siblings, str) or not siblings):
            raise GraphError(f"{where}: siblings: must be a non-empty string or null, got {siblings!r}")
        ops.append(Operator(op_id, float(util), None if bw is None else float(bw), blocking, siblings))

    edges: list[tuple[str, str]] = []
    seen_edges: set[tuple[str, str]] = set()
    for j, e in enumerate(raw_edges):
        if (not isinstance(e, (list, tuple)) or len(e) != 2
                or not all(isinstance(x, str) for x in e)):
            raise GraphError(f"edge {j}: expected [from, to] with two operator ids, got {e!r}")
        a, b = e
        for end in (a, b):
            if end not in seen:
                raise GraphError(f"edge {j} ({a!r} -> {b!r}): unknown operator {end!r}")
        if a == b:
            raise GraphError(f"edge {j} ({a!r} -> {b!r}): an operator cannot feed itself")
        if (a, b) not in seen_edges:
            seen_edges.add((a, b))
            edges.append((a, b))
    _refuse_cycles(edges)
    return Graph(tuple(ops), tuple(edges))


def _refuse_cycles(edges: list[tuple[str, str]]) -> None:
    """A query plan's dataflow is acyclic: GraphError naming a cycle (of two operators or more)."""
    feeders: dict[str, set[str]] = {}
    for a, b in edges:
        feeders.setdefault(b, set()).add(a)
    try:
        graphlib.TopologicalSorter(feeders).prepare()
    except graphlib.CycleError as err:
        cycle = err.args[1]  # [first, ..., first], each operator feeding the next
        shown = " -> ".join(repr(op) for op in cycle[:9]) + (" -> ..." if len(cycle) > 9 else "")
        raise GraphError(f"edges: {shown} is a cycle of {len(cycle) - 1} operators; "
                         "a plan's dataflow must be acyclic") from None

"""The checks made before any planning: a graph's size against its caller's limits, and the
fewest cores any packing of it needs.

Cheap on purpose, so that a caller (the RM, on its event loop) can refuse a graph
that is too large or cannot fit before it spends anything on it: the counts in
constant time, :func:`quick_demand` in one pass over the raw JSON, without
validating or building anything.  Phase 1 gives the full bound
(:func:`demand_of`, sibling groups included), which :func:`.plan.deploy`
checks before phase 2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from .collapse import Compound
from .errors import GraphTooLarge
from .graph import UTIL_SCALE


@dataclass(frozen=True)
class GraphLimits:
    """The largest graph a caller takes (the RM's deploy_max_* settings); None: no bound."""

    operators: int | None = None
    edges: int | None = None
    json_bytes: int | None = None  # as compact JSON (UTF-8)


def check_size(data: Any, limits: GraphLimits) -> None:
    """GraphTooLarge when ``data`` has more operators or edges than ``limits`` allow (constant time)."""
    if not isinstance(data, dict):
        return  # parse_graph says what is wrong with it
    for key, limit, setting in (("operators", limits.operators, "deploy_max_operators"),
                                ("edges", limits.edges, "deploy_max_edges")):
        items = data.get(key)
        if limit is not None and isinstance(items, list) and len(items) > limit:
            raise GraphTooLarge(f"graph: {len(items)} {key}; at most {limit} (setting {setting})", setting, limit,
                                len(items))


def check_bytes(size: int, limits: GraphLimits) -> None:
    """GraphTooLarge when the graph's compact JSON (``size`` bytes) is larger than ``limits`` allow."""
    if limits.json_bytes is not None and size > limits.json_bytes:
        raise GraphTooLarge(f"graph: {size} bytes of JSON; at most {limits.json_bytes} "
                            f"(setting deploy_max_graph_bytes)", "deploy_max_graph_bytes", limits.json_bytes, size)


@dataclass(frozen=True)
class Demand:
    """The fewest cores any packing of a plan needs."""

    cores: int
    why: str  # which bound it is, in words


def quick_demand(data: Any, capacity: float = 1.0) -> Demand:
    """A lower bound on the cores of the raw graph ``data``, in one pass and without validating it
    (what is malformed counts for nothing here; parse_graph refuses it later): its cpu_util over the
    capacity, and its operators over half the capacity (no two of them share a core, not even
    collapsed into one compound operator, which never exceeds the capacity)."""
    cap = round(capacity * UTIL_SCALE)
    ops = data.get("operators") if isinstance(data, dict) else None
    units = [round(op["cpu_util"] * UTIL_SCALE) for op in ops if _util_of(op)] if isinstance(ops, list) else []
    return _bound(units, cap, {})


def demand_of(compounds: Sequence[Compound], cap: int) -> Demand:
    """The lower bound after phase 1 (``cap`` in millionths of a core): the sibling groups count too."""
    counts: dict[str, int] = {}
    for c in compounds:
        for name in c.sibling_groups:
            counts[name] = counts.get(name, 0) + 1
    return _bound([c.util for c in compounds], cap, counts)


def _util_of(op: Any) -> bool:
    if not isinstance(op, dict):
        return False
    u = op.get("cpu_util")
    return isinstance(u, (int, float)) and not isinstance(u, bool) and 0 <= u <= 1


def _bound(sizes: list[int], cap: int, siblings: dict[str, int]) -> Demand:
    """binpack.lower_bound's three bounds, and which one holds."""
    total = max(1, math.ceil(sum(sizes) / cap)) if sizes else 0
    big = sum(1 for s in sizes if 2 * s > cap)
    group = max(siblings, key=lambda k: (siblings[k], k)) if siblings else None
    cores = max(total, big, siblings[group] if group is not None else 0)
    if total == cores:
        why = f"their cpu_util adds up to {sum(sizes) / UTIL_SCALE:.2f} cores of capacity {cap / UTIL_SCALE:g}"
    elif big == cores:
        why = f"{big} operator(s) need more than half the capacity of a core each"
    else:
        why = f"the {cores} threads of sibling group {group!r} may not share a core"
    return Demand(cores, why)

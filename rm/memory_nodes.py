"""A task's memory nodes: the nodes of its CPUs, or more when its working set does not fit there
(issue 26; policy, no I/O).

The allocator places a task's CPUs; its working set (``working_set_bytes`` per CPU) belongs on
the nodes of those CPUs.  The allocator checks that against the free memory the facts gave it
when the plan was made (C4); when the pages are placed, other processes may have taken that
memory, or the free memory was not known.  Then the task's pages would not fit on its CPUs'
nodes, and a cpuset of those nodes alone would make the kernel reclaim and swap (or kill the
task) instead of placing the rest one hop away.  `choose_memory_nodes` adds the nodes nearest
to the task's CPUs (SLIT distance, then the most free memory, then the lowest id) until their
free memory, with what the task already holds on them, holds its working set; the choice
carries the reason, which the allocation (``memory_reason``), ``:explain`` and the log show.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cod.facts.text import human_bytes


@dataclass(frozen=True)
class MemoryChoice:
    nodes: tuple[int, ...]        # the task's memory nodes
    reason: str | None = None     # why they are not (only) the nodes of its CPUs; None when they are


def choose_memory_nodes(cpus_per_node: Mapping[int, int], working_set_per_cpu: int,
                        free: Mapping[int, int | None], own: Mapping[int, int],
                        distances: Mapping[int, Mapping[int, int]]) -> MemoryChoice:
    """The memory nodes of a task holding ``cpus_per_node[n]`` CPUs on node ``n``.

    ``free``: free bytes per node of the machine (None: not known); ``own``: bytes the task
    already has resident per node (they count as room: they are its own); ``distances``: SLIT
    rows by node.  With no working set, or the free memory of a CPU node not known, the nodes
    of the CPUs (nothing to decide on)."""
    home = tuple(sorted(n for n, k in cpus_per_node.items() if k > 0))
    if not home or working_set_per_cpu <= 0 or any(free.get(n) is None for n in home):
        return MemoryChoice(home)
    need = working_set_per_cpu * sum(cpus_per_node[n] for n in home)

    def room(n: int) -> int:
        return (free.get(n) or 0) + own.get(n, 0)

    have = sum(room(n) for n in home)
    if have >= need:
        return MemoryChoice(home)

    def hops(n: int) -> int:
        return min(distances.get(h, {}).get(n, 255) for h in home)

    others = sorted((n for n in free if n not in home and free[n] is not None), key=lambda n: (hops(n), -room(n), n))
    added: list[int] = []
    total = have
    for n in others:
        if total >= need:
            break
        added.append(n)
        total += room(n)
    asked = (f"its working set, {human_bytes(need)} ({human_bytes(working_set_per_cpu)} per CPU x "
             f"{need // working_set_per_cpu} CPUs), does not fit in the {human_bytes(have)} free on "
             f"node{'s' if len(home) > 1 else ''} {','.join(map(str, home))} of its CPUs")
    nearest = "; ".join(f"node {n} (distance {hops(n)}, {human_bytes(room(n))} free)" for n in added)
    if total < need:
        return MemoryChoice(tuple(sorted((*home, *added))),
                            f"{asked}, nor on every node ({human_bytes(total)} free in all): "
                            f"every node{': ' + nearest if added else ''}")
    return MemoryChoice(tuple(sorted((*home, *added))), f"{asked}: also the nearest with room, {nearest}")

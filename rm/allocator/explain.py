"""Why each task got what it got: the constraints that bound it.

For every task: ``"max"`` when it holds ``max_cores``; ``"min"`` when it holds
exactly ``min_cores``; otherwise (or in addition) what stops it from taking any
further available CPU: ``"exclusive neighbour T"``, ``"SMT sibling of T"``,
``"memory of node N"``, ``"cache polluter T"``, ``"cache-sensitive T"``.
``"unavailable CPUs"`` is added when other (unregistered) work holds CPUs.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from .check import effective_max
from .greedy import GreedyState
from .model import TaskAllocation, TaskSpec
from .topology import View


def explain(
    view: View, tasks: Sequence[TaskSpec], alloc: Mapping[str, Sequence[int]], n_unavailable: int = 0
) -> tuple[TaskAllocation, ...]:
    state = GreedyState(view, tasks)
    for t in tasks:
        for c in alloc.get(t.name, ()):
            state.take(t, c)
    out = []
    for t in sorted(tasks, key=lambda t: t.name):
        cpus = tuple(sorted(alloc.get(t.name, ())))
        binding: list[str] = []
        if len(cpus) == t.min_cores:
            binding.append("min")
        if len(cpus) >= effective_max(t, view):
            if t.max_cores is not None and t.max_cores <= len(view.cpus):
                binding.append("max")
            else:
                binding.append("machine size")
        else:
            reasons: set[str] = set()
            for c in view.cpus:
                b = state.blocker(t, c)
                if b is not None and b != "held":
                    reasons.add(b)
            binding.extend(sorted(reasons))
            if n_unavailable:
                binding.append("unavailable CPUs")
        nodes = tuple(sorted({view.node_of[c] for c in cpus}))
        out.append(TaskAllocation(t.name, cpus, nodes, tuple(binding)))
    return tuple(out)

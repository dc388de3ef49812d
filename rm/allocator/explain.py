"""Why each task got what it got: the constraints that bound it.

For every task: ``"max"`` when it holds ``max_cores``; ``"min"`` when it holds
exactly ``min_cores``; otherwise (or in addition) what stops it from taking any
further available CPU: ``"exclusive neighbour T"``, ``"SMT sibling of T"``,
``"memory of node N"``, ``"cache polluter T"``, ``"cache-sensitive T"``.
``"unavailable CPUs"`` is added when other (unregistered) work holds CPUs.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from .problem import effective_max
from .greedy import GreedyState
from .model import TaskAllocation, TaskSpec
from .topology import View


SHARED_FROM_PAIRS = 2048


def explain(
    view: View, tasks: Sequence[TaskSpec], alloc: Mapping[str, Sequence[int]], n_unavailable: int = 0
) -> tuple[TaskAllocation, ...]:
    state = GreedyState(view, tasks)
    for t in tasks:
        for c in alloc.get(t.name, ()):
            state.take(t, c)
    # Few (task, CPU) pairs: ask every CPU (microseconds); many: share the
    # answers between tasks of one profile (_Blockers; 128 tasks: 26 -> 7 ms).
    blockers = _Blockers(view, state) if len(tasks) * len(view.cpus) > SHARED_FROM_PAIRS else None
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
            if blockers is not None:
                binding.extend(sorted(blockers.of(t, cpus)))
            else:
                reasons = {state.blocker(t, c) for c in view.cpus}
                binding.extend(sorted(r for r in reasons if r is not None and r != "held"))
            if n_unavailable:
                binding.append("unavailable CPUs")
        nodes = tuple(sorted({view.node_of[c] for c in cpus}))
        out.append(TaskAllocation(t.name, cpus, nodes, tuple(binding)))
    return tuple(out)


class _Blockers:
    """The set of :meth:`GreedyState.blocker` answers of a task over every CPU.

    Where a task holds nothing in a domain, the answer for a CPU there depends
    only on the task's profile (exclusive, SMT sharing, working set, cache
    flags) and on the CPU's *signature* (who holds it and its siblings, its
    node and domain): computed once per (profile, signature) on a phantom
    task, and counted, instead of once per (task, CPU).  128 tasks on 384
    CPUs: 26 ms -> a few ms.
    """

    def __init__(self, view: View, state: GreedyState) -> None:
        self.view, self.state = view, state
        tasks = state.tasks
        sig_ids: dict[tuple, int] = {}
        self.sig_of: dict[int, int] = {}
        self.rep: list[int] = []
        self.by_domain: dict[int, list[int]] = {}
        for c in view.cpus:
            here = state.holders[c]
            sibs = []
            for s in view.siblings[c]:
                near = sorted(state.holders[s])
                e1 = [o for o in near if tasks[o].exclusive and not tasks[o].allow_smt_sharing]
                sibs.append((near[0] if near else None, e1[0] if e1 else None))
            sig = (min(here) if here else None, any(tasks[o].exclusive for o in here), tuple(sibs),
                   view.node_of[c], view.domain_of[c])
            sid = sig_ids.setdefault(sig, len(sig_ids))
            if sid == len(self.rep):
                self.rep.append(c)
            self.sig_of[c] = sid
            self.by_domain.setdefault(view.domain_of[c], []).append(c)
        self.tables: dict[tuple, tuple[list[str | None], dict[str, int]]] = {}

    def _table(self, t: TaskSpec) -> tuple[tuple, list[str | None], dict[str, int]]:
        profile = (t.exclusive, t.allow_smt_sharing, t.working_set_bytes,
                   "cache" in t.sensitive, t.pollutes_cache)
        if profile not in self.tables:
            phantom = TaskSpec("\0phantom", exclusive=t.exclusive, allow_smt_sharing=t.allow_smt_sharing,
                               working_set_bytes=t.working_set_bytes,
                               sensitive=frozenset({"cache"}) if "cache" in t.sensitive else frozenset(),
                               pollutes_cache=t.pollutes_cache)
            per_sig = [self.state.blocker(phantom, c) for c in self.rep]
            count: dict[str, int] = {}
            for c in self.view.cpus:
                r = per_sig[self.sig_of[c]]
                if r is not None:
                    count[r] = count.get(r, 0) + 1
            self.tables[profile] = (per_sig, count)
        per_sig, count = self.tables[profile]
        return profile, per_sig, count

    def of(self, t: TaskSpec, cpus: Sequence[int]) -> set[str]:
        _, per_sig, count = self._table(t)
        left = dict(count)
        reasons: set[str] = set()
        for d in {self.view.domain_of[c] for c in cpus}:
            for c in self.by_domain[d]:  # where t holds CPUs: exactly
                r = per_sig[self.sig_of[c]]
                if r is not None:
                    left[r] -= 1
                b = self.state.blocker(t, c)
                if b is not None and b != "held":
                    reasons.add(b)
        reasons.update(r for r, n in left.items() if n > 0)
        return reasons

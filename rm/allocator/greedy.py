"""The deterministic greedy allocator: fast, always feasible when it says so.

It is the fallback of the optimal solvers and the reference for "what the RM
did before #5".  Steps:

1. Order tasks by priority (highest first), then by name.
   Every task first keeps up to ``min_cores`` of the CPUs it holds now.
2. Admission: in that order, give every task ``min_cores`` CPUs; if one cannot
   get them, the whole allocation is infeasible and the reason names it.
3. Growth: in the same order, extend every task up to ``max_cores``.

Each CPU is picked among those that keep constraints C1-C6 of
:mod:`cod.rm.allocator.problem` satisfied, preferring, in order: a CPU the task
holds in the current allocation; for an exclusive no-SMT-sharing task, the
sibling of a CPU it already has; for a sensitive task, its domains / nodes
already in use, then the domain with the best fit for what it still needs;
for a cache polluter, domains already polluted; lowest core, then CPU number.
An unregistered process (an other: top priority, min 0) grows first and
prefers CPUs no registered task holds now, then those away from sensitive
tasks, then the CPUs it runs on.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from .problem import allowed_cpus, effective_max, is_other
from .model import TaskSpec
from .topology import View


class GreedyState:
    """Who holds what, and the checks C3-C6 for one more CPU."""

    def __init__(self, view: View, tasks: Sequence[TaskSpec]) -> None:
        self.view = view
        self.tasks = {t.name: t for t in tasks}
        self.holders: dict[int, set[str]] = {c: set() for c in view.cpus}
        self.held: dict[str, list[int]] = {t.name: [] for t in tasks}
        self.mem_used: dict[int, int] = {n: 0 for n in view.nodes}
        self.domain_tasks: dict[int, set[str]] = {d: set() for d in range(view.n_domains)}
        self.domain_polluters: dict[int, set[str]] = {d: set() for d in range(view.n_domains)}
        self.domain_sensitive: dict[int, set[str]] = {d: set() for d in range(view.n_domains)}
        self.allowed = {t.name: allowed_cpus(view, t) for t in tasks if is_other(t)}
        self.others = set(self.allowed)  # names of unregistered processes

    def blocker(self, task: TaskSpec, c: int) -> str | None:
        """Why ``task`` cannot take CPU ``c`` now (None: it can)."""
        v = self.view
        here = self.holders[c]
        if here:
            if task.name in here:
                return "held"
            if task.exclusive or any(self.tasks[o].exclusive for o in here):
                o = min(here)
                return f"reserved for {o}" if o in self.others else f"exclusive neighbour {o}"
        if self.allowed:
            allowed = self.allowed.get(task.name)
            if allowed is not None and c not in allowed:
                return "not allowed"
        for s in v.siblings[c]:
            near = self.holders[s]
            if not near or (len(near) == 1 and task.name in near):
                continue
            for o in sorted(near - {task.name}):
                ot = self.tasks[o]
                if ot.exclusive and not ot.allow_smt_sharing:
                    return f"SMT sibling of {o}"
                if task.exclusive and not task.allow_smt_sharing:
                    return f"SMT sibling {'reserved for' if o in self.others else 'held by'} {o}"
        if task.working_set_bytes:
            node = v.node_of[c]
            free = v.node_free.get(node)
            if free is not None and self.mem_used[node] + task.working_set_bytes > free:
                return f"memory of node {node}"
        d = v.domain_of[c]
        if "cache" in task.sensitive:
            for o in sorted(self.domain_polluters[d] - {task.name}):
                return f"cache polluter {o}"
        if task.pollutes_cache:
            for o in sorted(self.domain_sensitive[d] - {task.name}):
                return f"cache-sensitive {o}"
        return None

    def take(self, task: TaskSpec, c: int) -> None:
        self.holders[c].add(task.name)
        self.held[task.name].append(c)
        self.mem_used[self.view.node_of[c]] += task.working_set_bytes
        d = self.view.domain_of[c]
        self.domain_tasks[d].add(task.name)
        if task.pollutes_cache:
            self.domain_polluters[d].add(task.name)
        if "cache" in task.sensitive:
            self.domain_sensitive[d].add(task.name)

    def pick(self, task: TaskSpec, need: int, current: set[int],
             others_now: Mapping[int, list[TaskSpec]] | None = None) -> int:
        """Take up to ``need`` more CPUs for ``task``; returns how many it got.

        Candidates are ranked once (ranking again after every pick would cost
        O(CPUs) each time) and re-checked just before being taken.
        """
        v = self.view
        if need <= 0:
            return 0
        cands = [c for c in v.cpus if self.blocker(task, c) is None]
        mine = set(self.held[task.name])
        my_domains = {v.domain_of[c] for c in mine}
        my_nodes = {v.node_of[c] for c in mine}
        per_domain: dict[int, int] = {}
        for c in cands:
            per_domain[v.domain_of[c]] = per_domain.get(v.domain_of[c], 0) + 1
        polluted = {d for d, names in self.domain_polluters.items() if names - {task.name}}
        e1 = task.exclusive and not task.allow_smt_sharing
        if is_other(task):
            # registered tasks' current CPUs last, then away from sensitive tasks
            near: dict[tuple[str, int], set[str]] = {}
            held_now = others_now or {}
            for c, hs in held_now.items():
                if c not in v.node_of:
                    continue  # unavailable now
                for h in hs:
                    if "cache" in h.sensitive:
                        near.setdefault(("d", v.domain_of[c]), set()).add(h.name)
                    if "numa" in h.sensitive:
                        near.setdefault(("n", v.node_of[c]), set()).add(h.name)

            def other_key(c: int) -> tuple:
                hs = held_now.get(c, ())
                return (len(hs), any(h.sensitive for h in hs),
                        len(near.get(("d", v.domain_of[c]), ())) + len(near.get(("n", v.node_of[c]), ())),
                        c not in current, c)

            key = other_key
        else:
            key = None

        def task_key(c: int) -> tuple:
            d = v.domain_of[c]
            fits = per_domain[d] >= need
            if task.sensitive:
                domain_rank: tuple = (
                    "cache" in task.sensitive and d not in my_domains,
                    "numa" in task.sensitive and v.node_of[c] not in my_nodes,
                    # best fit: the smallest domain that holds the rest, else the largest
                    not fits, per_domain[d] if fits else -per_domain[d],
                )
            elif task.pollutes_cache:
                domain_rank = (d not in polluted and d not in my_domains, 0, False, 0)
            else:
                domain_rank = (False, False, False, 0)
            return (
                c not in current,
                e1 and not any(s in mine for s in v.siblings[c]),
                domain_rank,
                d,
                v.core_of[c],
                c,
            )

        got = 0
        for c in sorted(cands, key=key or task_key):
            if got == need:
                break
            if self.blocker(task, c) is None:
                self.take(task, c)
                mine.add(c)
                got += 1
        return got


def order(tasks: Sequence[TaskSpec]) -> list[TaskSpec]:
    return sorted(tasks, key=lambda t: (-t.priority, t.name))


def solve_greedy(
    view: View, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]] | None = None
) -> tuple[dict[str, list[int]] | None, str | None]:
    """(allocation, None) or (None, reason) when a task cannot get its min_cores.

    With others (unregistered processes), they are placed first, away from
    where registered tasks sit now (so a registered task moves only when an
    other has no other choice); if that leaves some task short of its
    min_cores, again with the others after every task's admission."""
    current = current or {}
    if any(is_other(t) for t in tasks):
        alloc, reason = _greedy(view, tasks, current, others_first=True)
        if alloc is not None:
            return alloc, reason
    return _greedy(view, tasks, current, others_first=False)


def _greedy(view: View, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]], others_first: bool
            ) -> tuple[dict[str, list[int]] | None, str | None]:
    state = GreedyState(view, tasks)
    ordered = order(tasks)
    # where registered tasks sit now: others keep away from it
    registered_now: dict[int, list[TaskSpec]] = {}
    for t in tasks:
        if not is_other(t):
            for c in current.get(t.name, ()):
                registered_now.setdefault(c, []).append(t)
    if others_first:
        for t in ordered:
            if is_other(t):
                state.pick(t, effective_max(t, view), set(current.get(t.name, ())), registered_now)
    for t in ordered:  # 0. keep up to min_cores of what each task holds now
        mine = set(current.get(t.name, ()))
        for c in sorted(mine & set(view.cpus))[: t.min_cores]:
            if state.blocker(t, c) is None:
                state.take(t, c)
    for t in ordered:
        got = len(state.held[t.name])
        got += state.pick(t, t.min_cores - got, set(current.get(t.name, ())))
        if got < t.min_cores:
            return None, admission_reason(state, t, got)
    for t in ordered:
        state.pick(t, effective_max(t, view) - len(state.held[t.name]), set(current.get(t.name, ())),
                   registered_now)
    return {name: sorted(cpus) for name, cpus in state.held.items()}, None


def admission_reason(state: GreedyState, task: TaskSpec, got: int) -> str:
    """Why ``task`` got only ``got`` of its ``min_cores`` after the tasks before
    it: the blockers, counted by kind ("exclusive neighbour" of any task counts
    once, with up to three names), so a refusal on 1,024 CPUs stays one line."""
    counts: dict[str, int] = {}
    names: dict[str, list[str]] = {}
    for c in state.view.cpus:
        b = state.blocker(task, c)
        if b is None or b == "held":
            continue
        kind, _, who = b.rpartition(" ") if b.split(" ")[-1] in state.tasks else (b, "", "")
        counts[kind] = counts.get(kind, 0) + 1
        if who and who not in names.setdefault(kind, []):
            names[kind].append(who)
    parts = []
    for kind, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        who = names.get(kind, [])
        shown = f" ({', '.join(who[:3])}{f' and {len(who) - 3} more' if len(who) > 3 else ''})" if who else ""
        parts.append(f"{n} CPUs: {kind}{shown}")
    total = len(state.view.cpus)
    return (f"task {task.name!r} needs min_cores={task.min_cores}; after the tasks placed before it, "
            f"{got} of the {total} available CPUs can be given to it" + (f" ({'; '.join(parts)})" if parts else ""))

"""Why each task got what it got: the constraints that bound it.

For every task: ``"max"`` when it holds ``max_cores``; ``"min"`` when it holds
exactly ``min_cores``; otherwise (or in addition) what stops it from taking any
further available CPU: ``"exclusive neighbour T"``, ``"SMT sibling of T"``,
``"memory of node N"``, ``"cache polluter T"``, ``"cache-sensitive T"``.
``"unavailable CPUs"`` is added when other (unregistered) work holds CPUs;
a CPU kept for an unregistered process (an other) reads ``"reserved for
other.1234"``, and a task that lost CPUs to one names it in ``displaced_by``.
Reservations get their own explanation (:func:`explain_reservations`).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from .problem import allowed_cpus, effective_max, is_other
from .greedy import GreedyState
from .model import Reservation, TaskAllocation, TaskSpec
from .topology import View


SHARED_FROM_PAIRS = 2048


def explain(
    view: View, tasks: Sequence[TaskSpec], alloc: Mapping[str, Sequence[int]], n_unavailable: int = 0,
    current: Mapping[str, Sequence[int]] | None = None,
) -> tuple[TaskAllocation, ...]:
    """One :class:`TaskAllocation` per registered task (others: :func:`explain_reservations`)."""
    state = GreedyState(view, tasks)
    for t in tasks:
        for c in alloc.get(t.name, ()):
            state.take(t, c)
    # Few (task, CPU) pairs: ask every CPU (microseconds); many: share the
    # answers between tasks of one profile (_Blockers; 128 tasks: 26 -> 7 ms).
    blockers = _Blockers(view, state) if len(tasks) * len(view.cpus) > SHARED_FROM_PAIRS else None
    out = []
    culprits = displaced_by(tasks, alloc, current) if current and any(is_other(t) for t in tasks) else {}
    for t in sorted(tasks, key=lambda t: t.name):
        if is_other(t):
            continue
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
        out.append(TaskAllocation(t.name, cpus, nodes, tuple(binding), culprits.get(t.name, ())))
    return tuple(out)


def displaced_by(tasks: Sequence[TaskSpec], alloc: Mapping[str, Sequence[int]],
                 current: Mapping[str, Sequence[int]]) -> dict[str, tuple[str, ...]]:
    """Per registered task that lost current CPUs: the others that caused it,
    directly (they hold a lost CPU) or through a chain (a registered task that
    holds the lost CPU lost CPUs to them in turn)."""
    holder: dict[int, list[TaskSpec]] = {}
    for t in tasks:
        for c in alloc.get(t.name, ()):
            holder.setdefault(c, []).append(t)
    lost = {t.name: set(current.get(t.name, ())) - set(alloc.get(t.name, ()))
            for t in tasks if not is_other(t)}
    blame: dict[str, set[str]] = {n: set() for n, cpus in lost.items() if cpus}
    via: dict[str, set[str]] = {n: set() for n in blame}
    for name in blame:
        for c in lost[name]:
            for h in holder.get(c, ()):
                (blame[name] if is_other(h) else via[name]).add(h.name)
    changed = True
    while changed:  # chains: a task displaced by a task that was displaced by an other
        changed = False
        for name in blame:
            more = set().union(*(blame.get(u, set()) for u in via[name])) - blame[name]
            if more:
                blame[name] |= more
                changed = True
    return {n: tuple(sorted(b)) for n, b in blame.items() if b}


def explain_reservations(view: View, tasks: Sequence[TaskSpec], alloc: Mapping[str, Sequence[int]],
                         current: Mapping[str, Sequence[int]]) -> tuple[Reservation, ...]:
    """Why each other got the CPUs it got: fewer than it needs (registered
    tasks' min_cores, or its allowed CPUs), or not the CPUs it runs on (a
    registered task keeps them, they are gone, or they lie beside a sensitive task)."""
    registered = [t for t in tasks if not is_other(t)]
    held_by = {}
    for t in registered:
        for c in alloc.get(t.name, ()):
            held_by.setdefault(c, t.name)
    out = []
    for o in sorted((t for t in tasks if is_other(t)), key=lambda t: t.name):
        cpus = tuple(sorted(alloc.get(o.name, ())))
        binding: list[str] = []
        if len(cpus) < o.max_cores:
            allowed = allowed_cpus(view, o)
            if allowed is not None and len(allowed) < o.max_cores:
                binding.append(f"allowed CPUs ({len(allowed)})")
            else:
                binding.append(f"{o.max_cores - len(cpus)} short: registered tasks' min_cores")
        for c in sorted(set(current.get(o.name, ())) - set(cpus)):
            if c not in view.node_of:
                binding.append(f"CPU {c} unavailable")
                continue
            near = sorted({t.name for t in registered for d in alloc.get(t.name, ())
                           if ("cache" in t.sensitive and view.domain_of[d] == view.domain_of[c])
                           or ("numa" in t.sensitive and view.node_of[d] == view.node_of[c])})
            if near:
                binding.append(f"CPU {c} beside sensitive {', '.join(near)}")
            elif c in held_by:
                binding.append(f"CPU {c} kept by {held_by[c]}")
            else:
                binding.append(f"CPU {c} not allowed")
        moved = bool(set(cpus) - set(current.get(o.name, ())))
        out.append(Reservation(o.name, cpus, o.max_cores, moved, tuple(binding)))
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


def infeasibility_reason(view: View, tasks: Sequence[TaskSpec], fallback: str | None) -> str:
    """Why no allocation gives every task its ``min_cores``, with the figures:
    the first of these that holds, else ``fallback`` (greedy's account of the
    task it could not place)."""
    from .bounds import task_caps
    from .problem import is_e1

    registered = [t for t in tasks if not is_other(t)]
    n = len(view.cpus)
    caps = task_caps(view, registered)
    for t in registered:
        allowed_n = min(n, t.max_cores or n)
        if t.min_cores > n:
            return f"task {t.name!r} needs min_cores={t.min_cores} but only {n} CPUs are available"
        cap = caps[t.name][0]
        if t.min_cores <= cap:
            continue
        node_caps = caps[t.name][1]
        if t.working_set_bytes and sum(node_caps) < t.min_cores:
            per_node = []
            for node in sorted(view.nodes):
                free = view.node_free.get(node)
                if free is not None:
                    per_node.append(f"node {node}: {_gib(free)} free -> {free // t.working_set_bytes}")
            return (f"task {t.name!r} needs min_cores={t.min_cores} with a working set of "
                    f"{_gib(t.working_set_bytes)} per CPU, but the NUMA nodes' free memory holds at most "
                    f"{sum(node_caps)} such CPUs ({_summary(per_node)})")
        if "cache" in t.sensitive and cap < allowed_n:
            pol = sorted(u.name for u in registered if u.pollutes_cache and u.name != t.name)
            return (f"task {t.name!r} needs min_cores={t.min_cores}, cache-sensitive: it shares no L3 domain with "
                    f"{', '.join(pol[:3])}{' ...' if len(pol) > 3 else ''}, which leaves it at most {cap} CPUs")
    k = min((g.threads for g in view.classes), default=1)
    use = {t.name: k * -(-t.min_cores // k) if is_e1(t) and k > 1 else t.min_cores for t in registered}
    excl = sum(use[t.name] for t in registered if t.exclusive)
    shared = max((t.min_cores for t in registered if not t.exclusive), default=0)
    if excl + shared > n:
        return (f"the tasks' min_cores need {excl + shared} CPUs together ({_largest(registered, use)}"
                + ("; whole cores where SMT siblings stay idle" if k > 1 else "")
                + ("; shared tasks share theirs" if shared else "") + f") but {n} are available")
    if all(f is not None for f in view.node_free.values()):
        need = {t.name: t.min_cores * t.working_set_bytes for t in registered if t.working_set_bytes}
        have = sum(view.node_free.values())
        if sum(need.values()) > have:
            return (f"the tasks' working sets at their min_cores need {_gib(sum(need.values()))} together "
                    f"({_largest([t for t in registered if t.name in need], need, _gib)}) but the NUMA nodes "
                    f"have {_gib(have)} free")
    return fallback or "no allocation satisfies every task's min_cores and the constraints together"


def _largest(tasks: Sequence[TaskSpec], amount: Mapping[str, int], fmt=str) -> str:
    """The three largest amounts by task, and the lowest-priority task (the one
    a refusal is about), e.g. "'db' 32, 'late' 1 and 3 more"."""
    ordered = sorted(tasks, key=lambda t: (-amount[t.name], t.name))
    shown = ordered[:3]
    last = min(tasks, key=lambda t: (t.priority, -amount[t.name], t.name))
    if last not in shown:
        shown.append(last)
    text = ", ".join(f"{t.name!r} {fmt(amount[t.name])}" for t in shown)
    return text + (f" and {len(tasks) - len(shown)} more" if len(tasks) > len(shown) else "")


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.3g} GiB"


def _summary(items: list[str]) -> str:
    """Identical figures are counted, not repeated (64 nodes make one short line)."""
    seen: dict[str, int] = {}
    for item in items:
        figure = item.split(": ", 1)[1]
        seen[figure] = seen.get(figure, 0) + 1
    if len(seen) == 1 and len(items) > 1:
        figure = next(iter(seen))
        return f"{len(items)} nodes with {figure} each"
    return ", ".join(items[:8]) + (" ..." if len(items) > 8 else "")

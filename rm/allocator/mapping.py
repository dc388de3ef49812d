"""From counts per class to CPU numbers, keeping the CPUs tasks already hold.

Classes are independent here (a core lies in one class; memory and the cache
rule are settled by the counts), so each class is mapped on its own.  Per
class, in order (ties: lowest CPU number, tasks by name):

1. each E1 task (exclusive, no SMT sharing) takes whole cores: first the cores
   where it holds the most CPUs now, then (after every E1 task kept its own)
   the core whose loss costs the other tasks least: a task loses a CPU it
   holds there only if it cannot keep enough of its CPUs elsewhere in the
   class (its *surplus*); then fewest PUs anyone holds, lowest core;
   its PUs: current first;
2. each registered E2 task (exclusive, SMT sharing allowed) takes the free
   PUs it holds now;
3. the shared pool takes the free PUs shareable tasks hold now (most holders
   first); then unregistered processes (others, E2) take the free PUs they run on;
4. E2 tasks fill up from the free PUs nobody holds now, then the lowest; then the pool;
5. each shareable task takes its PUs from the pool, current ones first.

How many current CPUs a class can keep at most is sum over tasks of
min(count, CPUs held there) (what the count model assumes).  When the steps
above keep fewer in a small class, the class is mapped again exactly
(:func:`_map_class_exact`, CP-SAT over its PUs, registered tasks' CPUs before
others').  When the whole mapping then misses the bound of what any mapping
of these counts keeps (:func:`_bound`: registered tasks' CPUs, tasks touched,
others' CPUs) on a small instance, the CPU-level model with the counts fixed
decides (:func:`.naive.solve_naive`): the mapping of a count vector is then
exact, which the count model's optimality proof relies on (:mod:`.cpsat`).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ortools.sat.python import cp_model

from .model import TaskSpec
from .problem import is_e1, is_other
from .topology import CpuClass, View

# A class whose heuristic mapping keeps fewer current CPUs than its bound is
# mapped exactly (one small CP-SAT model) up to this many PUs.
EXACT_CLASS_PUS = 64
# The whole mapping is made exact (CPU-level model, counts fixed) when it
# misses its bound, up to this many (task, CPU) pairs.
EXACT_MAPPING_PAIRS = 4096


def map_counts(
    view: View,
    tasks: Sequence[TaskSpec],
    current: Mapping[str, Sequence[int]],
    counts: Mapping[str, Mapping[int, int]],
    cores: Mapping[str, Mapping[int, int]],
    classes: set[int] | None = None,
) -> dict[str, list[int]]:
    """CPUs per task for these counts; ``classes``: only those classes (an
    incremental re-plan keeps the CPUs of every other class as they are)."""
    out: dict[str, list[int]] = {t.name: [] for t in tasks}
    cur = {t.name: set(current.get(t.name, ())) for t in tasks}
    by_name = sorted(tasks, key=lambda t: t.name)
    for g in view.classes:
        if classes is not None and g.index not in classes:
            continue
        here = [t for t in by_name if counts[t.name].get(g.index, 0)]
        if not here:
            continue
        got = _map_class(g, here, counts, cores, cur)
        bound = class_kept_bound(g, here, counts, cur)
        if g.size <= EXACT_CLASS_PUS and kept(got, cur, here) < bound:
            exact = _map_class_exact(g, here, counts, cores, cur)
            if exact is not None and kept(exact, cur, here) > kept(got, cur, here):
                got = exact
        for name, cpus in got.items():
            out[name].extend(cpus)
    out = {name: sorted(cpus) for name, cpus in out.items()}
    if classes is None and any(cur.values()) and len(tasks) * len(view.cpus) <= EXACT_MAPPING_PAIRS:
        bound = _bound(view, tasks, counts, cur)
        if _value(tasks, out, cur) < bound:
            from .naive import solve_naive  # the CPU-level model, counts fixed

            st, exact = solve_naive(view, tasks, current, 1.0, counts=counts)
            if exact is not None and _value(tasks, exact, cur) > _value(tasks, out, cur):
                out = exact
    return out


def class_kept_bound(g: CpuClass, here: Sequence[TaskSpec], counts: Mapping[str, Mapping[int, int]],
                     cur: Mapping[str, set[int]]) -> tuple[int, int]:
    """Current CPUs class ``g`` can keep at most with these counts: (registered, others)."""
    pus = set(g.cpus)
    out = [0, 0]
    for t in here:
        out[is_other(t)] += min(counts[t.name][g.index], len(cur[t.name] & pus))
    return out[0], out[1]


def kept(alloc: Mapping[str, Sequence[int]], cur: Mapping[str, set[int]], tasks: Sequence[TaskSpec]
         ) -> tuple[int, int]:
    """Current CPUs kept: (by registered tasks, by others)."""
    out = [0, 0]
    for t in tasks:
        out[is_other(t)] += len(cur[t.name].intersection(alloc.get(t.name, ())))
    return out[0], out[1]


def _value(tasks: Sequence[TaskSpec], alloc: Mapping[str, Sequence[int]], cur: Mapping[str, set[int]]
           ) -> tuple[int, int, int]:
    """What a mapping decides: (registered CPUs kept, -tasks touched, others' CPUs kept)."""
    reg, oth = kept(alloc, cur, tasks)
    touched = sum(1 for t in tasks if not is_other(t) and cur[t.name] - set(alloc.get(t.name, ())))
    return reg, -touched, oth


def _bound(view: View, tasks: Sequence[TaskSpec], counts: Mapping[str, Mapping[int, int]],
           cur: Mapping[str, set[int]]) -> tuple[int, int, int]:
    """No mapping of ``counts`` beats this :func:`_value`."""
    reg = oth = touched = 0
    for t in tasks:
        k = sum(min(n, len(cur[t.name].intersection(view.classes[gi].cpus))) for gi, n in counts[t.name].items())
        if is_other(t):
            oth += k
        else:
            reg += k
            touched += k < len(cur[t.name])
    return reg, -touched, oth


def _map_class(g: CpuClass, here: Sequence[TaskSpec], counts: Mapping[str, Mapping[int, int]],
               cores: Mapping[str, Mapping[int, int]], cur: Mapping[str, set[int]]) -> dict[str, list[int]]:
    gi = g.index
    out: dict[str, list[int]] = {t.name: [] for t in here}
    free_cores = list(g.cores)
    # 1. whole cores for E1 tasks: first the cores they hold now, then free ones
    e1 = [t for t in here if is_e1(t)]
    want = {t.name: (cores.get(t.name, {}).get(gi, 0) if g.threads > 1 else counts[t.name][gi]) for t in e1}
    taken: dict[str, list[tuple[int, ...]]] = {t.name: [] for t in e1}
    for t in e1:
        mine = sorted((core for core in free_cores if cur[t.name].intersection(core)),
                      key=lambda core: (-len(cur[t.name].intersection(core)), core[0]))[: want[t.name]]
        taken[t.name] += mine
        free_cores = [core for core in free_cores if core not in mine]
    if any(len(taken[t.name]) < want[t.name] for t in e1):
        # Which cores to give up: a task keeps min(count, CPUs it holds on the
        # cores left), so a core costs each holder what that minimum drops by.
        others = [t for t in here if not is_e1(t)]
        need = {u.name: counts[u.name][gi] for u in others}
        have = {u.name: sum(len(cur[u.name].intersection(core)) for core in free_cores) for u in others}
        held_now = {p for u in here for p in cur[u.name]}

        def loss(core: tuple[int, ...]) -> int:
            out = 0
            for u in others:
                k = len(cur[u.name].intersection(core))
                if k:
                    out += min(need[u.name], have[u.name]) - min(need[u.name], have[u.name] - k)
            return out

        for t in e1:
            for _ in range(want[t.name] - len(taken[t.name])):
                core = min(free_cores, key=lambda core: (loss(core), len(held_now.intersection(core)), core[0]))
                free_cores.remove(core)
                taken[t.name].append(core)
                for u in others:
                    have[u.name] -= len(cur[u.name].intersection(core))
    for t in e1:
        pus = sorted((p for core in taken[t.name] for p in core), key=lambda p: (p not in cur[t.name], p))
        out[t.name].extend(pus[: counts[t.name][gi]])
    free = {p for core in free_cores for p in core}
    # registered before others: where both run now, the registered task keeps it
    e2 = sorted((t for t in here if t.exclusive and not is_e1(t)), key=lambda t: (is_other(t), t.name))
    shared = [t for t in here if not t.exclusive]
    need2 = {t.name: counts[t.name][gi] for t in e2}
    # 2. registered E2 tasks keep their current PUs
    def keep_current(t: TaskSpec) -> None:
        nonlocal free
        keep = sorted(cur[t.name] & free)[: need2[t.name]]
        out[t.name].extend(keep)
        need2[t.name] -= len(keep)
        free -= set(keep)

    for t in e2:
        if not is_other(t):
            keep_current(t)
    # 3. pool keeps PUs shareable tasks hold now
    pool_size = max((counts[t.name][gi] for t in shared), default=0)
    holders = {p: sum(1 for t in shared if p in cur[t.name]) for p in free}
    pool = sorted((p for p in free if holders[p]), key=lambda p: (-holders[p], p))[:pool_size]
    free -= set(pool)
    # 2b. then others keep theirs (a registered task's CPU before an other's)
    for t in e2:
        if is_other(t):
            keep_current(t)
    # 4. E2 fill up (PUs nobody holds now first), then the pool
    anyone = {p for t in here for p in cur[t.name]}
    for t in e2:
        take = sorted(free, key=lambda p: (p in anyone, p))[: need2[t.name]]
        out[t.name].extend(take)
        free -= set(take)
    pool += sorted(free)[: pool_size - len(pool)]
    # 5. shareable tasks draw from the pool
    for t in shared:
        out[t.name].extend(sorted(pool, key=lambda p: (p not in cur[t.name], p))[: counts[t.name][gi]])
    return out


def _map_class_exact(g: CpuClass, here: Sequence[TaskSpec], counts: Mapping[str, Mapping[int, int]],
                     cores: Mapping[str, Mapping[int, int]], cur: Mapping[str, set[int]]
                     ) -> dict[str, list[int]] | None:
    """The mapping of one class keeping the most current CPUs: one boolean per
    (task, PU), whole cores for E1 tasks, exclusive PUs for exclusive tasks."""
    gi = g.index
    m = cp_model.CpModel()
    pus = g.cpus
    b = {(t.name, p): m.new_bool_var("") for t in here for p in pus}
    for t in here:
        m.add(sum(b[t.name, p] for p in pus) == counts[t.name][gi])
        if is_e1(t):
            n = cores.get(t.name, {}).get(gi, 0) if g.threads > 1 else counts[t.name][gi]
            own = {core: m.new_bool_var("") for core in g.cores}
            m.add(sum(own.values()) == n)
            for core, v in own.items():
                for p in core:
                    m.add_implication(b[t.name, p], v)
                    for u in here:
                        if u.name != t.name:
                            m.add_bool_or([v.Not(), b[u.name, p].Not()])
        elif t.exclusive:
            for p in pus:
                for u in here:
                    if u.name != t.name:
                        m.add_bool_or([b[t.name, p].Not(), b[u.name, p].Not()])
    # registered tasks' CPUs first, then others'
    weight = 1 + sum(len(cur[t.name]) for t in here if is_other(t))
    m.maximize(sum((1 if is_other(t) else weight) * b[t.name, p]
                   for t in here for p in cur[t.name] if (t.name, p) in b))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = 1.0
    if solver.solve(m) not in (cp_model.OPTIMAL,):
        return None
    return {t.name: [p for p in pus if solver.value(b[t.name, p])] for t in here}

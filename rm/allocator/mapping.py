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
2. each E2 task (exclusive, SMT sharing allowed) takes the free PUs it holds now;
3. the shared pool takes the free PUs shareable tasks hold now (most holders first);
4. E2 tasks fill up from the free PUs nobody holds now, then the lowest; then the pool;
5. each shareable task takes its PUs from the pool, current ones first.

How many current CPUs a class can keep at most is sum over tasks of
min(count, CPUs held there) (what the count model assumes).  When the steps
above keep fewer in a small class, the class is mapped again exactly
(:func:`_map_class_exact`, CP-SAT over PUs); :func:`class_kept_bound` and
:func:`kept` let callers check whether a mapping kept all it could.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ortools.sat.python import cp_model

from .model import TaskSpec
from .problem import is_e1
from .topology import CpuClass, View

# A class whose heuristic mapping keeps fewer current CPUs than its bound is
# mapped exactly (one small CP-SAT model) up to this many PUs.
EXACT_CLASS_PUS = 64


def map_counts(
    view: View,
    tasks: Sequence[TaskSpec],
    current: Mapping[str, Sequence[int]],
    counts: Mapping[str, Mapping[int, int]],
    cores: Mapping[str, Mapping[int, int]],
) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {t.name: [] for t in tasks}
    cur = {t.name: set(current.get(t.name, ())) for t in tasks}
    by_name = sorted(tasks, key=lambda t: t.name)
    for g in view.classes:
        here = [t for t in by_name if counts[t.name].get(g.index, 0)]
        if not here:
            continue
        got = _map_class(g, here, counts, cores, cur)
        bound = class_kept_bound(g, here, counts, cur)
        if g.size <= EXACT_CLASS_PUS and kept(got, cur) < bound:
            exact = _map_class_exact(g, here, counts, cores, cur)
            if exact is not None and kept(exact, cur) > kept(got, cur):
                got = exact
        for name, cpus in got.items():
            out[name].extend(cpus)
    return {name: sorted(cpus) for name, cpus in out.items()}


def class_kept_bound(g: CpuClass, here: Sequence[TaskSpec], counts: Mapping[str, Mapping[int, int]],
                     cur: Mapping[str, set[int]]) -> int:
    """Current CPUs class ``g`` can keep at most with these counts."""
    pus = set(g.cpus)
    return sum(min(counts[t.name][g.index], len(cur[t.name] & pus)) for t in here)


def kept(alloc: Mapping[str, Sequence[int]], cur: Mapping[str, set[int]]) -> int:
    return sum(len(cur[name].intersection(cpus)) for name, cpus in alloc.items())


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
    e2 = [t for t in here if t.exclusive and not is_e1(t)]
    shared = [t for t in here if not t.exclusive]
    need2 = {t.name: counts[t.name][gi] for t in e2}
    # 2. E2 tasks keep their current PUs
    for t in e2:
        keep = sorted(cur[t.name] & free)[: need2[t.name]]
        out[t.name].extend(keep)
        need2[t.name] -= len(keep)
        free -= set(keep)
    # 3. pool keeps PUs shareable tasks hold now
    pool_size = max((counts[t.name][gi] for t in shared), default=0)
    holders = {p: sum(1 for t in shared if p in cur[t.name]) for p in free}
    pool = sorted((p for p in free if holders[p]), key=lambda p: (-holders[p], p))[:pool_size]
    free -= set(pool)
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
    m.maximize(sum(b[t.name, p] for t in here for p in cur[t.name] if (t.name, p) in b))
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    solver.parameters.max_time_in_seconds = 1.0
    if solver.solve(m) not in (cp_model.OPTIMAL,):
        return None
    return {t.name: [p for p in pus if solver.value(b[t.name, p])] for t in here}

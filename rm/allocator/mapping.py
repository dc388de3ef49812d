"""From counts per class to CPU numbers, keeping the CPUs tasks already hold.

Per class, in order (ties: lowest CPU number, tasks by name):

1. each E1 task (exclusive, no SMT sharing) takes whole cores: first the cores
   where it holds the most CPUs now, then (after every E1 task kept its own)
   cores with the fewest PUs other tasks will keep; then its PUs, current first;
2. each E2 task (exclusive, SMT sharing allowed) takes the free PUs it holds now;
3. the shared pool takes the free PUs shareable tasks hold now (most holders first);
4. E2 tasks fill up from the lowest free PUs, then the pool does;
5. each shareable task takes its PUs from the pool, current ones first.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from .cpsat import is_e1
from .model import TaskSpec
from .topology import View


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
        free_cores = list(g.cores)
        # 1. whole cores for E1 tasks: first the cores they hold now, then free ones
        e1 = [t for t in by_name if is_e1(t) and counts[t.name].get(g.index, 0)]
        want = {t.name: (cores.get(t.name, {}).get(g.index, 0) if g.threads > 1 else counts[t.name][g.index])
                for t in e1}
        taken: dict[str, list[tuple[int, ...]]] = {t.name: [] for t in e1}
        for t in e1:
            mine = sorted((core for core in free_cores if cur[t.name].intersection(core)),
                          key=lambda core: (-len(cur[t.name].intersection(core)), core[0]))[: want[t.name]]
            taken[t.name] += mine
            free_cores = [core for core in free_cores if core not in mine]
        # PUs the other tasks will keep here (as many current ones as their count)
        class_cpus = set(g.cpus)
        reserved: set[int] = set()
        for u in by_name:
            n_u = counts[u.name].get(g.index, 0)
            if n_u and not is_e1(u):
                reserved.update(sorted(cur[u.name] & class_cpus)[:n_u])
        held_now = {p for u in by_name for p in cur[u.name] & class_cpus}
        for t in e1:
            # fewest PUs others keep, then fewest PUs anyone holds now (those
            # others could keep instead of their reserved ones)
            free_cores.sort(key=lambda core: (len(reserved.intersection(core)),
                                              len(held_now.intersection(core)), core[0]))
            n_more = want[t.name] - len(taken[t.name])
            taken[t.name] += free_cores[:n_more]
            free_cores = free_cores[n_more:]
            pus = sorted((p for core in taken[t.name] for p in core), key=lambda p: (p not in cur[t.name], p))
            out[t.name].extend(pus[: counts[t.name][g.index]])
        free = {p for core in free_cores for p in core}
        e2 = [t for t in by_name if t.exclusive and not is_e1(t) and counts[t.name].get(g.index, 0)]
        shared = [t for t in by_name if not t.exclusive and counts[t.name].get(g.index, 0)]
        need = {t.name: counts[t.name].get(g.index, 0) for t in e2}
        # 2. E2 tasks keep their current PUs
        for t in e2:
            keep = sorted(cur[t.name] & free)[: need[t.name]]
            out[t.name].extend(keep)
            need[t.name] -= len(keep)
            free -= set(keep)
        # 3. pool keeps PUs shareable tasks hold now
        pool_size = max((counts[t.name].get(g.index, 0) for t in shared), default=0)
        holders = {p: sum(1 for t in shared if p in cur[t.name]) for p in free}
        pool = sorted((p for p in free if holders[p]), key=lambda p: (-holders[p], p))[:pool_size]
        free -= set(pool)
        # 4. E2 fill up, then the pool
        for t in e2:
            take = sorted(free)[: need[t.name]]
            out[t.name].extend(take)
            free -= set(take)
        pool += sorted(free)[: pool_size - len(pool)]
        # 5. shareable tasks draw from the pool
        for t in shared:
            n = counts[t.name][g.index]
            out[t.name].extend(sorted(pool, key=lambda p: (p not in cur[t.name], p))[:n])
    return {name: sorted(cpus) for name, cpus in out.items()}

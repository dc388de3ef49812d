"""The paper's Figure 4 model: one boolean per (task, CPU), solved by CP-SAT.

Kept as the reference model (``--solver naive``) to compare with the count
model of :mod:`cod.rm.allocator.cpsat` in one run.  Same problem, same
objective; only the encoding differs.

Variables: b[t,c] = task t holds CPU c; sh[c] = some shareable task holds c;
z[t,node], y[t,dom] usage booleans of sensitive tasks.
Constraints (numbered as in :mod:`cod.rm.allocator.problem`):
  C2  min_t <= sum_c b[t,c] <= max_t  (the paper's MinCores / MaxCores row sums);
  C3  per CPU: sum over exclusive t of b[t,c] + sh[c] <= 1, b[u,c] <= sh[c] for shareable u;
  C4  per node: sum_t ws_t * sum_{c on node} b[t,c] <= free (WorkingSetSize);
  C5  y[t,D] + y[u,D] <= 1 for cache-sensitive t, polluter u != t;
  C6  b[t,c] + b[u,s] <= 1 for E1 task t, sibling s of c, u != t;
  C7  b[o,c] = 0 outside an other's allowed CPUs.
Objective: O2 per priority level, O3 spread, O4 kept current CPUs (and with
others O5 touched tasks, O6 disturbance, O7 others' kept CPUs),
lexicographic by weights.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ortools.sat.python import cp_model

from .problem import allowed_cpus, effective_max, is_e1, is_other, lexicographic_weights, priority_levels
from .model import TaskSpec
from .topology import View


NAIVE_LIMIT = 2_000_000  # tasks^2 x CPUs: beyond this the model alone takes seconds to build


def solve_naive(
    view: View,
    tasks: Sequence[TaskSpec],
    current: Mapping[str, Sequence[int]],
    time_limit_s: float,
    workers: int = 1,
    counts: Mapping[str, Mapping[int, int]] | None = None,
) -> tuple[str, dict[str, list[int]] | None]:
    """``counts`` (task -> class -> PUs) fixes how many PUs each task holds per
    class: the exact mapping of a count vector (:mod:`.cpsat`)."""
    cpus = view.cpus
    size = len(tasks) * len(tasks) * len(cpus)
    if size > NAIVE_LIMIT:
        raise ValueError(
            f"naive model too large ({len(tasks)} tasks x {len(cpus)} CPUs needs ~{size} SMT "
            f"constraints, limit {NAIVE_LIMIT}); use the cpsat solver"
        )
    m = cp_model.CpModel()
    b = {(t.name, c): m.new_bool_var(f"b{t.name}_{c}") for t in tasks for c in cpus}
    for t in tasks:  # C2
        m.add_linear_constraint(sum(b[t.name, c] for c in cpus), t.min_cores, effective_max(t, view))
        allowed = allowed_cpus(view, t)
        if allowed is not None:  # C7
            for c in cpus:
                if c not in allowed:
                    m.add(b[t.name, c] == 0)
        if counts is not None:
            for g in view.classes:
                m.add(sum(b[t.name, c] for c in g.cpus) == counts[t.name].get(g.index, 0))
    shared = [t for t in tasks if not t.exclusive]
    excl = [t for t in tasks if t.exclusive]
    for c in cpus:  # C3
        terms = [b[t.name, c] for t in excl]
        if shared:
            sh = m.new_bool_var(f"sh{c}")
            for u in shared:
                m.add(b[u.name, c] <= sh)
            terms.append(sh)
        if len(terms) > 1:
            m.add(sum(terms) <= 1)
    for node, free in view.node_free.items():  # C4
        if free is None:
            continue
        on = [c for c in cpus if view.node_of[c] == node]
        terms = [t.working_set_bytes * b[t.name, c] for t in tasks if t.working_set_bytes for c in on]
        if terms:
            m.add(sum(terms) <= free)
    for t in tasks:  # C6
        if not is_e1(t):
            continue
        for c in cpus:
            for s in view.siblings[c]:
                for u in tasks:
                    if u.name != t.name:
                        m.add(b[t.name, c] + b[u.name, s] <= 1)
    polluters = [t for t in tasks if t.pollutes_cache]
    cache_sens = [t for t in tasks if "cache" in t.sensitive]
    numa_sens = [t for t in tasks if "numa" in t.sensitive]
    others = [t for t in tasks if is_other(t)]
    y: dict[tuple[str, int], cp_model.IntVar] = {}
    z: dict[tuple[str, int], cp_model.IntVar] = {}
    for t in tasks:
        if "cache" in t.sensitive or (t.pollutes_cache and cache_sens) or (is_other(t) and cache_sens):
            for d in range(view.n_domains):
                y[t.name, d] = m.new_bool_var(f"y{t.name}_{d}")
            for c in cpus:
                m.add(b[t.name, c] <= y[t.name, view.domain_of[c]])
        if "numa" in t.sensitive or (is_other(t) and numa_sens):
            for node in view.nodes:
                z[t.name, node] = m.new_bool_var(f"z{t.name}_{node}")
            for c in cpus:
                m.add(b[t.name, c] <= z[t.name, view.node_of[c]])
    for t in cache_sens:  # C5
        for u in polluters:
            if u.name != t.name:
                for d in range(view.n_domains):
                    m.add(y[t.name, d] + y[u.name, d] <= 1)

    terms: list[tuple[cp_model.LinearExprT, int]] = []
    for p in priority_levels(tasks):
        level = [t for t in tasks if t.priority == p]
        terms.append((sum(b[t.name, c] for t in level for c in cpus), sum(effective_max(t, view) for t in level)))
    spread = [z[t.name, n] for t in numa_sens for n in view.nodes] + \
        [y[t.name, d] for t in cache_sens for d in range(view.n_domains)]
    terms.append((-sum(spread) if spread else 0, len(spread)))
    kept = [b[t.name, c] for t in tasks if not is_other(t) for c in current.get(t.name, ()) if (t.name, c) in b]
    terms.append((sum(kept) if kept else 0, len(kept)))
    if others:
        # O5: a task with current CPUs is touched unless it keeps them all
        touched = []
        for t in tasks:
            cur = set(current.get(t.name, ()))
            if is_other(t) or not cur:
                continue
            tv = m.new_bool_var(f"touched{t.name}")
            if cur - set(cpus):
                m.add(tv == 1)
            for c in cur & set(cpus):
                m.add(b[t.name, c] + tv >= 1)
            touched.append(tv)
        terms.append((-sum(touched) if touched else 0, len(touched)))
        # O6: (other, sensitive task) pairs sharing a domain (cache) or node (numa)
        pairs = []
        for o in others:
            for t, use, units in [(t, y, range(view.n_domains)) for t in cache_sens] + \
                                 [(t, z, view.nodes) for t in numa_sens]:
                pv = m.new_bool_var(f"near{o.name}_{t.name}")
                for u in units:
                    m.add(pv >= use[o.name, u] + use[t.name, u] - 1)
                pairs.append(pv)
        terms.append((-sum(pairs) if pairs else 0, len(pairs)))
        other_kept = [b[o.name, c] for o in others for c in current.get(o.name, ()) if (o.name, c) in b]
        terms.append((sum(other_kept) if other_kept else 0, len(other_kept)))
    weights = lexicographic_weights([ub for _, ub in terms])
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = workers
    solver.parameters.max_time_in_seconds = time_limit_s
    if weights is None:
        raise ValueError("naive model: too many priority levels for one weighted objective")
    m.maximize(sum(w * e for (e, _), w in zip(terms, weights)))
    st = solver.solve(m)
    if st == cp_model.INFEASIBLE:
        return "infeasible", None
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return "unknown", None
    alloc = {t.name: [c for c in cpus if solver.value(b[t.name, c])] for t in tasks}
    return ("optimal" if st == cp_model.OPTIMAL else "feasible"), alloc

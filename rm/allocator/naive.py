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

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ortools.sat.python import cp_model

from .disturbance import disturbance_pairs
from .problem import allowed_cpus, effective_max, is_e1, is_other, lexicographic_weights, priority_levels
from .model import TaskSpec
from .topology import View


NAIVE_LIMIT = 2_000_000  # tasks^2 x CPUs: beyond this the model alone takes seconds to build


@dataclass
class _Naive:
    """The boolean model while it is built: the variables each constraint group reads."""

    view: View
    tasks: Sequence[TaskSpec]
    m: cp_model.CpModel = field(default_factory=cp_model.CpModel)
    y: dict[tuple[str, int], cp_model.IntVar] = field(default_factory=dict)  # t uses domain d
    z: dict[tuple[str, int], cp_model.IntVar] = field(default_factory=dict)  # t uses node n

    def __post_init__(self) -> None:
        self.b = {(t.name, c): self.m.new_bool_var(f"b{t.name}_{c}") for t in self.tasks for c in self.view.cpus}
        self.others = [t for t in self.tasks if is_other(t)]
        self.polluters = [t for t in self.tasks if t.pollutes_cache]
        self.cache_sens = [t for t in self.tasks if "cache" in t.sensitive]
        self.numa_sens = [t for t in self.tasks if "numa" in t.sensitive]


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
    n = _Naive(view, tasks)
    _c2_c7_rows(n, counts)
    _c3_cpu_sharing(n)
    _c4_node_memory(n)
    _c6_smt_siblings(n)
    _usage_indicators(n)
    _c5_cache_rule(n)
    terms = _o2_o4_terms(n, current)
    if n.others:
        terms += _o5_o7_terms(n, current)
    weights = lexicographic_weights([ub for _, ub in terms])
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = workers
    solver.parameters.max_time_in_seconds = time_limit_s
    if weights is None:
        raise ValueError("naive model: too many priority levels for one weighted objective")
    n.m.maximize(sum(w * e for (e, _), w in zip(terms, weights)))
    st = solver.solve(n.m)
    if st == cp_model.INFEASIBLE:
        return "infeasible", None
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return "unknown", None
    alloc = {t.name: [c for c in cpus if solver.value(n.b[t.name, c])] for t in tasks}
    return ("optimal" if st == cp_model.OPTIMAL else "feasible"), alloc


def _c2_c7_rows(n: _Naive, counts: Mapping[str, Mapping[int, int]] | None) -> None:
    """C2 (min_t <= sum_c b[t,c] <= max_t), C7 (b[o,c] = 0 outside an other's allowed CPUs) and
    the fixed counts per class when ``counts`` is given."""
    m, b, cpus = n.m, n.b, n.view.cpus
    for t in n.tasks:  # C2
        m.add_linear_constraint(sum(b[t.name, c] for c in cpus), t.min_cores, effective_max(t, n.view))
        allowed = allowed_cpus(n.view, t)
        if allowed is not None:  # C7
            for c in cpus:
                if c not in allowed:
                    m.add(b[t.name, c] == 0)
        if counts is not None:
            for g in n.view.classes:
                m.add(sum(b[t.name, c] for c in g.cpus) == counts[t.name].get(g.index, 0))


def _c3_cpu_sharing(n: _Naive) -> None:
    """C3, per CPU: sum over exclusive t of b[t,c] + sh[c] <= 1, b[u,c] <= sh[c] for shareable u."""
    m, b = n.m, n.b
    shared = [t for t in n.tasks if not t.exclusive]
    excl = [t for t in n.tasks if t.exclusive]
    for c in n.view.cpus:
        terms = [b[t.name, c] for t in excl]
        if shared:
            sh = m.new_bool_var(f"sh{c}")
            for u in shared:
                m.add(b[u.name, c] <= sh)
            terms.append(sh)
        if len(terms) > 1:
            m.add(sum(terms) <= 1)


def _c4_node_memory(n: _Naive) -> None:
    """C4, per node: sum_t ws_t * sum_{c on node} b[t,c] <= free (WorkingSetSize)."""
    view = n.view
    for node, free in view.node_free.items():
        if free is None:
            continue
        on = [c for c in view.cpus if view.node_of[c] == node]
        terms = [t.working_set_bytes * n.b[t.name, c] for t in n.tasks if t.working_set_bytes for c in on]
        if terms:
            n.m.add(sum(terms) <= free)


def _c6_smt_siblings(n: _Naive) -> None:
    """C6: b[t,c] + b[u,s] <= 1 for E1 task t, sibling s of c, u != t."""
    for t in n.tasks:
        if not is_e1(t):
            continue
        for c in n.view.cpus:
            for s in n.view.siblings[c]:
                for u in n.tasks:
                    if u.name != t.name:
                        n.m.add(n.b[t.name, c] + n.b[u.name, s] <= 1)


def _usage_indicators(n: _Naive) -> None:
    """y[t,dom] and z[t,node] of sensitive tasks (O3) and of those C5 and O6 compare them with."""
    m, b, view = n.m, n.b, n.view
    for t in n.tasks:
        if "cache" in t.sensitive or (t.pollutes_cache and n.cache_sens) or (is_other(t) and n.cache_sens):
            for d in range(view.n_domains):
                n.y[t.name, d] = m.new_bool_var(f"y{t.name}_{d}")
            for c in view.cpus:
                m.add(b[t.name, c] <= n.y[t.name, view.domain_of[c]])
        if "numa" in t.sensitive or (is_other(t) and n.numa_sens):
            for node in view.nodes:
                n.z[t.name, node] = m.new_bool_var(f"z{t.name}_{node}")
            for c in view.cpus:
                m.add(b[t.name, c] <= n.z[t.name, view.node_of[c]])


def _c5_cache_rule(n: _Naive) -> None:
    """C5: y[t,D] + y[u,D] <= 1 for cache-sensitive t, polluter u != t."""
    for t in n.cache_sens:
        for u in n.polluters:
            if u.name != t.name:
                for d in range(n.view.n_domains):
                    n.m.add(n.y[t.name, d] + n.y[u.name, d] <= 1)


def _o2_o4_terms(n: _Naive, current: Mapping[str, Sequence[int]]) -> list[tuple[cp_model.LinearExprT, int]]:
    """O2 per priority level, O3 spread, O4 kept current CPUs: (expression to maximise, cap)."""
    b, view, tasks = n.b, n.view, n.tasks
    terms: list[tuple[cp_model.LinearExprT, int]] = []
    for p in priority_levels(tasks):
        level = [t for t in tasks if t.priority == p]
        terms.append((sum(b[t.name, c] for t in level for c in view.cpus),
                      sum(effective_max(t, view) for t in level)))
    spread = [n.z[t.name, node] for t in n.numa_sens for node in view.nodes] + \
        [n.y[t.name, d] for t in n.cache_sens for d in range(view.n_domains)]
    terms.append((-sum(spread) if spread else 0, len(spread)))
    kept = [b[t.name, c] for t in tasks if not is_other(t) for c in current.get(t.name, ()) if (t.name, c) in b]
    terms.append((sum(kept) if kept else 0, len(kept)))
    return terms


def _o5_o7_terms(n: _Naive, current: Mapping[str, Sequence[int]]) -> list[tuple[cp_model.LinearExprT, int]]:
    """With others: O5 touched tasks, O6 disturbance, O7 others' kept CPUs."""
    m, b, cpus = n.m, n.b, n.view.cpus
    # O5: a task with current CPUs is touched unless it keeps them all
    touched = []
    for t in n.tasks:
        cur = set(current.get(t.name, ()))
        if is_other(t) or not cur:
            continue
        tv = m.new_bool_var(f"touched{t.name}")
        if cur - set(cpus):
            m.add(tv == 1)
        for c in cur & set(cpus):
            m.add(b[t.name, c] + tv >= 1)
        touched.append(tv)
    # O6: (other, sensitive task) pairs sharing a domain (cache) or node (numa)
    pairs = disturbance_pairs(m, n.others, n.cache_sens, n.numa_sens, n.y, n.z, range(n.view.n_domains), n.view.nodes)
    other_kept = [b[o.name, c] for o in n.others for c in current.get(o.name, ()) if (o.name, c) in b]
    return [(-sum(touched) if touched else 0, len(touched)), (-sum(pairs) if pairs else 0, len(pairs)),
            (sum(other_kept) if other_kept else 0, len(other_kept))]

"""The count model: how many CPUs each task gets in each class, solved by CP-SAT.

CPUs of one class (same L3 domain, NUMA node and SMT width, see
:mod:`cod.rm.allocator.topology`) are interchangeable, so the model decides
integer counts per (task, class) and :mod:`cod.rm.allocator.mapping` turns them
into CPU numbers, keeping the CPUs tasks already hold.  Size: tasks x classes
integer variables instead of tasks x CPUs booleans.

Task kinds: E1 = exclusive without SMT sharing (takes whole cores), E2 =
exclusive with SMT sharing, S = shareable (all S tasks of a class draw from
one shared pool of PUs).

Variables, per task t and class g (k threads per core, n cores):
  x[t,g] in [0, k*n]   PUs of t in g;
  c[t,g] in [0, n]     cores of E1 task t in g (only when k > 1);
  s[g]   in [0, k*n]   PUs of the shared pool in g (only with S tasks);
  kept[t,g]            PUs of t's current allocation in g it keeps;
  z[t,node], y[t,dom]  booleans: t uses that node / domain (sensitive tasks).

Constraints (numbered as in :mod:`cod.rm.allocator.problem`):
  C2  min_t <= sum_g x[t,g] <= max_t;
  C3+C6  per g: sum_E1 k*c + sum_E2 x + s <= k*n; c <= x <= k*c for E1; x <= s for S;
  C4  per node N with known free memory: sum_t ws_t * sum_{g on N} x[t,g] <= free_N;
  C5  per domain D, cache-sensitive t, polluter u != t: y[t,D] + y[u,D] <= 1;
  link x[t,g] <= min(k*n, max_t) * y[t,dom(g)] and likewise with z[t,node(g)].
Objective terms (lexicographic, O1 is C2's lower bound):
  O2  per priority level, highest first: maximise sum of x;
  O3  minimise sum z over numa-sensitive tasks + sum y over cache-sensitive ones;
  O4  maximise sum kept (kept <= x, kept <= current PUs of t in g): fewest moves.
O2 is not weighted: the levels are fixed to the optimum of a class-free
relaxation (:func:`.relaxation.relaxed_levels`) when that is reachable, else solved in
stages (see :func:`solve_counts`); O3 and O4 are one weighted objective,
(kept_max + 1) * -O3 + O4, which is exactly lexicographic.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Sequence

from ortools.sat.python import cp_model

from .disturbance import disturbance_pairs
from .problem import effective_max, is_e1, is_other, lexicographic_weights, priority_levels
from .model import TaskSpec
from .relaxation import relaxed_levels
from .topology import View

if TYPE_CHECKING:
    from .bounds import RelaxedBound

_DEBUG = bool(os.environ.get("COD_ALLOC_DEBUG"))
_PARAMS: dict = {}  # overrides for experiments (bench)


@dataclass
class CountSolution:
    status: str  # "optimal" | "feasible" | "infeasible" | "unknown"
    counts: dict[str, dict[int, int]]  # task -> class index -> PUs
    cores: dict[str, dict[int, int]]  # E1 task -> class index -> whole cores
    pool: dict[int, int]  # class index -> shared pool PUs
    # feasible only: relative gap of the term being optimised when time ran out
    # (a priority level's sum, or the weighted O3/O4 once every level is proven)
    gap: float | None = None


@dataclass
class _Model:
    m: cp_model.CpModel
    x: dict[tuple[str, int], cp_model.IntVar]
    c: dict[tuple[str, int], cp_model.IntVar]
    pool: dict[int, cp_model.IntVar]
    levels: list[cp_model.LinearExprT]  # O2 per priority level, highest first
    level_caps: list[int]
    spread: cp_model.LinearExprT  # O3 (to minimise)
    spread_cap: int
    kept: cp_model.LinearExprT  # O4 (to maximise)
    kept_cap: int
    # with others (problem.OtherSpec) only: O5-O7 as (expression to maximise, cap)
    tail: list[tuple[cp_model.LinearExprT, int]] = field(default_factory=list)


@dataclass
class _Builder:
    """The count model while it is built: the variables each constraint group reads."""

    view: View
    tasks: Sequence[TaskSpec]
    current: Mapping[str, Sequence[int]]
    m: cp_model.CpModel = field(default_factory=cp_model.CpModel)
    x: dict[tuple[str, int], cp_model.IntVar] = field(default_factory=dict)
    c: dict[tuple[str, int], cp_model.IntVar] = field(default_factory=dict)
    pool: dict[int, cp_model.IntVar] = field(default_factory=dict)
    kept: list[cp_model.IntVar] = field(default_factory=list)  # of registered tasks (O4)
    kept_of: dict[str, list[cp_model.IntVar]] = field(default_factory=dict)
    kept_at: dict[tuple[str, int], cp_model.IntVar] = field(default_factory=dict)
    total_current: int = 0
    y: dict[tuple[str, int], cp_model.IntVar] = field(default_factory=dict)  # t uses domain d
    z: dict[tuple[str, int], cp_model.IntVar] = field(default_factory=dict)  # t uses node n

    def __post_init__(self) -> None:
        self.class_of = {c: g.index for g in self.view.classes for c in g.cpus}
        self.others = [t for t in self.tasks if is_other(t)]
        self.polluters = [t for t in self.tasks if t.pollutes_cache]
        self.cache_sens = [t for t in self.tasks if "cache" in t.sensitive]
        self.numa_sens = [t for t in self.tasks if "numa" in t.sensitive]


def _build(view: View, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]]) -> _Model:
    b = _Builder(view, tasks, current)
    if any(not t.exclusive for t in tasks):
        b.pool = {g.index: b.m.new_int_var(0, g.size, f"s{g.index}") for g in view.classes}
    for t in tasks:
        _task_vars(b, t)
    _kept_of_shared_cpus(b)
    _c3_c6_class_capacity(b)
    _c4_node_memory(b)
    _usage_indicators(b)
    _c5_cache_rule(b)
    levels, caps = _o2_levels(b)
    spread = [b.z[t.name, n] for t in b.numa_sens for n in view.nodes] + \
        [b.y[t.name, d] for t in b.cache_sens for d in range(view.n_domains)]
    tail = _o5_o7_other_terms(b) if b.others else []
    return _Model(b.m, b.x, b.c, b.pool, levels, caps, sum(spread) if spread else 0, len(spread),
                  sum(b.kept) if b.kept else 0, b.total_current, tail)


def _task_vars(b: _Builder, t: TaskSpec) -> None:
    """x, c and kept of task t in each class; C3+C6's per-task links (c <= x <= k*c for E1, x <= s
    for S), C7 (an other's allowed classes) and C2 (min_t <= sum_g x[t,g] <= max_t)."""
    m, view = b.m, b.view
    hi = effective_max(t, view)
    cur_in: dict[int, int] = {}
    for cpu in b.current.get(t.name, ()):
        if cpu in b.class_of:
            cur_in[b.class_of[cpu]] = cur_in.get(b.class_of[cpu], 0) + 1
    if not is_other(t):
        b.total_current += sum(cur_in.values())
    allowed = view.allowed_classes(t.allowed) if is_other(t) else None  # C7
    for g in view.classes:
        v = m.new_int_var(0, min(g.size, hi) if allowed is None or g.index in allowed else 0,
                          f"x{t.name}_{g.index}")
        b.x[t.name, g.index] = v
        if is_e1(t) and g.threads > 1:
            cv = m.new_int_var(0, len(g.cores), f"c{t.name}_{g.index}")
            b.c[t.name, g.index] = cv
            m.add(cv <= v)
            m.add(v <= g.threads * cv)
        if not t.exclusive:
            m.add(v <= b.pool[g.index])
        if cur_in.get(g.index):
            kv = m.new_int_var(0, cur_in[g.index], f"k{t.name}_{g.index}")
            m.add(kv <= v)
            b.kept_of.setdefault(t.name, []).append(kv)
            b.kept_at[t.name, g.index] = kv
            if not is_other(t):
                b.kept.append(kv)
    m.add_linear_constraint(sum(b.x[t.name, g.index] for g in view.classes), t.min_cores, hi)  # C2


def _kept_of_shared_cpus(b: _Builder) -> None:
    """A CPU two tasks hold now (a current allocation from elsewhere, or tasks
    changed) can be kept by both only if both are shareable: per class, the
    total kept is at most what the CPUs held now can give.  Without it every
    count vector claimed one kept CPU too many and the exactness loop of
    solve_counts excluded vectors until the time limit (14 in 1 s on a
    MagnyCours family instance)."""
    holders: dict[int, list[TaskSpec]] = {}
    for t in b.tasks:
        for cpu in set(b.current.get(t.name, ())):
            if cpu in b.class_of:
                holders.setdefault(cpu, []).append(t)
    if not any(len(h) > 1 for h in holders.values()):
        return
    can_keep: dict[int, int] = {}
    held_in: dict[int, int] = {}
    for cpu, hs in holders.items():
        gi = b.class_of[cpu]
        shared_h = sum(1 for t in hs if not t.exclusive)
        can_keep[gi] = can_keep.get(gi, 0) + (len(hs) if shared_h == len(hs) else max(1, shared_h))
        held_in[gi] = held_in.get(gi, 0) + len(hs)
    for gi, cap in can_keep.items():
        if cap < held_in[gi]:
            b.m.add(sum(kv for (name, g_i), kv in b.kept_at.items() if g_i == gi) <= cap)


def _c3_c6_class_capacity(b: _Builder) -> None:
    """C3 + C6, per class g: sum_E1 k*c + sum_E2 x + s <= k*n."""
    for g in b.view.classes:
        load = []
        for t in b.tasks:
            if not t.exclusive:
                continue
            if (t.name, g.index) in b.c:
                load.append(g.threads * b.c[t.name, g.index])
            else:
                load.append(b.x[t.name, g.index])
        if b.pool:
            load.append(b.pool[g.index])
        if load:
            b.m.add(sum(load) <= g.size)


def _c4_node_memory(b: _Builder) -> None:
    """C4, per node N with known free memory: sum_t ws_t * sum_{g on N} x[t,g] <= free_N,
    divided by the gcd of the working sets: same solutions, small coefficients."""
    tasks, G = b.tasks, b.view.classes
    unit = math.gcd(*(t.working_set_bytes for t in tasks))
    for node, free in b.view.node_free.items():
        if free is None or not unit:
            continue
        node_size = sum(g.size for g in G if g.node == node)
        if sum(t.working_set_bytes for t in tasks) * node_size <= free:
            continue  # cannot bind
        b.m.add(sum(t.working_set_bytes // unit * b.x[t.name, g.index]
                    for t in tasks if t.working_set_bytes for g in G if g.node == node) <= free // unit)


def _usage_indicators(b: _Builder) -> None:
    """y[t,dom] and z[t,node] for sensitive tasks (O3) and the cache rule (C5), linked:
    x[t,g] <= min(k*n, max_t) * y[t,dom(g)], and likewise with z[t,node(g)]."""
    m, view = b.m, b.view
    need_y = {t.name for t in b.cache_sens}
    if b.cache_sens:
        need_y |= {t.name for t in b.polluters} | {t.name for t in b.others}
    for t in b.tasks:
        if t.name in need_y:
            for d in range(view.n_domains):
                gs = [g for g in view.classes if g.domain == d]
                yv = m.new_bool_var(f"y{t.name}_{d}")
                b.y[t.name, d] = yv
                for g in gs:
                    m.add(b.x[t.name, g.index] <= min(g.size, effective_max(t, view)) * yv)
        if "numa" in t.sensitive or (is_other(t) and b.numa_sens):
            for node in view.nodes:
                zv = m.new_bool_var(f"z{t.name}_{node}")
                b.z[t.name, node] = zv
                for g in view.classes:
                    if g.node == node:
                        m.add(b.x[t.name, g.index] <= min(g.size, effective_max(t, view)) * zv)


def _c5_cache_rule(b: _Builder) -> None:
    """C5, per domain D, cache-sensitive t, polluter u != t: y[t,D] + y[u,D] <= 1."""
    for t in b.cache_sens:
        for u in b.polluters:
            if u.name != t.name:
                for d in range(b.view.n_domains):
                    b.m.add(b.y[t.name, d] + b.y[u.name, d] <= 1)


def _o2_levels(b: _Builder) -> tuple[list[cp_model.LinearExprT], list[int]]:
    """O2: per priority level, highest first, the sum of x (to maximise) and its cap."""
    levels, caps = [], []
    for p in priority_levels(b.tasks):
        level = [t for t in b.tasks if t.priority == p]
        levels.append(sum(b.x[t.name, g.index] for t in level for g in b.view.classes))
        caps.append(sum(effective_max(t, b.view) for t in level))
    return levels, caps


def _o5_o7_other_terms(b: _Builder) -> list[tuple[cp_model.LinearExprT, int]]:
    """With others (problem.OtherSpec): O5-O7 as (expression to maximise, cap)."""
    m, current = b.m, b.current
    # O5: a registered task with current CPUs is touched unless it keeps them all
    touched = []
    for t in b.tasks:
        cur = set(current.get(t.name, ()))
        if is_other(t) or not cur:
            continue
        tv = m.new_bool_var(f"touched{t.name}")
        here = len(cur & set(b.class_of))
        if here < len(cur):
            m.add(tv == 1)  # some of its CPUs are gone
        elif b.kept_of.get(t.name):
            m.add(sum(b.kept_of[t.name]) >= here - here * tv)
        touched.append(tv)
    # O6: (other, sensitive task) pairs sharing a domain (cache) or node (numa)
    pairs = disturbance_pairs(m, b.others, b.cache_sens, b.numa_sens, b.y, b.z, range(b.view.n_domains), b.view.nodes)
    # O7: the CPUs others keep
    other_kept = [kv for o in b.others for kv in b.kept_of.get(o.name, ())]
    other_cap = sum(len(set(current.get(o.name, ())) & set(b.class_of)) for o in b.others)
    return [(-sum(touched) if touched else 0, len(touched)), (-sum(pairs) if pairs else 0, len(pairs)),
            (sum(other_kept) if other_kept else 0, other_cap)]


def _add_hint(view: View, tasks: Sequence[TaskSpec], mod: _Model,
              hint: Mapping[str, Sequence[int]] | None) -> None:
    if not hint:
        return
    class_of = {c: g.index for g in view.classes for c in g.cpus}
    pool: dict[int, int] = {}
    for t in tasks:
        per: dict[int, set[int]] = {}
        for cpu in hint.get(t.name, ()):
            if cpu in class_of:
                per.setdefault(class_of[cpu], set()).add(cpu)
        for g in view.classes:
            cpus = per.get(g.index, set())
            mod.m.add_hint(mod.x[t.name, g.index], len(cpus))
            if (t.name, g.index) in mod.c:
                mod.m.add_hint(mod.c[t.name, g.index], len({view.core_of[c] for c in cpus}))
            if not t.exclusive:
                pool[g.index] = max(pool.get(g.index, 0), len(cpus))
    for gi, v in mod.pool.items():
        mod.m.add_hint(v, pool.get(gi, 0))


def _solver(workers: int, seconds: float) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = workers
    solver.parameters.log_search_progress = _DEBUG
    solver.parameters.max_time_in_seconds = max(0.001, seconds)
    # Presolve dominated on 384 threads (0.3 s before the first solution with
    # 128 tasks); symmetry detection and probing are its costly parts here.
    # 32 tasks: 1.0 s -> 0.29 s to optimal; 128 tasks: no solution -> one.
    solver.parameters.symmetry_level = 0
    solver.parameters.cp_model_probing_level = 0
    for k, v in _PARAMS.items():
        setattr(solver.parameters, k, v)
    return solver


def _lower_terms(mod: _Model) -> list[tuple[cp_model.LinearExprT, int]]:
    """O3, O4 (and O5-O7 with others) as (expression to maximise, cap)."""
    return [(-mod.spread, mod.spread_cap), (mod.kept, mod.kept_cap)] + mod.tail


def _lower_objective(mod: _Model) -> cp_model.LinearExprT:
    """O3, O4 (and O5-O7) as one weighted objective to maximise (exactly
    lexicographic: each weight exceeds the range of every later term)."""
    terms = _lower_terms(mod)
    weights = lexicographic_weights([cap for _, cap in terms])
    if weights is None:
        raise ValueError("count model: O3-O7 too large for one exactly lexicographic weighted objective")
    return sum(w * e for (e, _), w in zip(terms, weights))


def solve_counts(
    view: View,
    tasks: Sequence[TaskSpec],
    current: Mapping[str, Sequence[int]],
    time_limit_s: float,
    workers: int = 1,
    hint: Mapping[str, Sequence[int]] | None = None,
    bound: "RelaxedBound | None" = None,
) -> CountSolution:
    """Solve in the order that makes proofs cheap:

    1. U = lexicographic optimum of O2 in the class-free relaxation
       (:func:`.relaxation.relaxed_levels`); infeasible there means infeasible.
    2. Fix every level sum to U and optimise O3, O4.  Feasible: U is reached,
       so O2 is optimal, and the answer is optimal when this solve is.
    3. Otherwise (the relaxation was not tight): stages.  For each level, a
       fresh relaxation bound with the earlier levels fixed is added as a cut,
       the level is maximised and fixed; then O3, O4 as in 2.

    ``hint`` (e.g. the greedy allocation) seeds every solve with its counts.
    ``bound`` (:func:`cod.rm.allocator.bounds.relaxed_bound`) replaces step 1
    and adds its O3 bound as a cut to step 2.
    Time: each relaxation gets at most a quarter of what is left, step 2 at
    most half; the model build is included in ``time_limit_s`` only loosely
    (it is not interruptible).
    """
    deadline = time.perf_counter() + time_limit_s
    if bound is not None:
        relaxed = list(bound.levels)
    else:
        relaxed = relaxed_levels(view, tasks, [], workers, time_limit_s / 4)
        if relaxed is None:
            return CountSolution("infeasible", {}, {}, {})
    mod = _build(view, tasks, current)
    _add_hint(view, tasks, mod, hint)
    for e, u in zip(mod.levels, relaxed):
        mod.m.add(e == u)
    if bound is not None and mod.spread_cap:
        mod.m.add(mod.spread >= bound.spread)  # valid once the levels are fixed to bound.levels
    mod.m.maximize(_lower_objective(mod))
    solver = _solver(workers, (deadline - time.perf_counter()) / 2)
    st = solver.solve(mod.m)
    if _DEBUG:
        print("fixed-levels", solver.status_name(st), solver.wall_time, file=sys.stderr)
    # Out of time: another model would only overrun the limit further.
    out_of_time = deadline - time.perf_counter() < 0.1 * time_limit_s
    if st == cp_model.UNKNOWN and out_of_time:
        return CountSolution("unknown", {}, {}, {})
    if st in (cp_model.INFEASIBLE, cp_model.UNKNOWN):
        staged = _solve_in_stages(view, tasks, current, workers, hint, deadline, time_limit_s)
        if staged is None:
            return CountSolution("infeasible", {}, {}, {})
        mod, staged_solver, st = staged
        if staged_solver is not None:  # None: out of time before the first stage (st is UNKNOWN)
            solver = staged_solver
    if st == cp_model.INFEASIBLE:
        return CountSolution("infeasible", {}, {}, {})
    if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return CountSolution("unknown", {}, {}, {})
    gap = None
    if st == cp_model.FEASIBLE:
        bound_value, value = solver.best_objective_bound, solver.objective_value
        gap = abs(bound_value - value) / max(1.0, abs(bound_value)) or None  # 0: a later stage timed out
    sol = _solution(view, tasks, mod, solver, "optimal" if st == cp_model.OPTIMAL else "feasible", gap)
    if st == cp_model.OPTIMAL:
        sol = _realised(view, tasks, current, mod, solver, sol, deadline)
    return sol


def _solve_in_stages(view: View, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]], workers: int,
                     hint: Mapping[str, Sequence[int]] | None, deadline: float,
                     time_limit_s: float) -> tuple[_Model, cp_model.CpSolver | None, int] | None:
    """Step 3 of :func:`solve_counts`: each level maximised under a fresh relaxation bound with the
    earlier levels fixed, then fixed; then O3, O4.  None: infeasible (a relaxation says so)."""
    mod = _build(view, tasks, current)
    _add_hint(view, tasks, mod, hint)
    fixed: list[int] = []
    solver: cp_model.CpSolver | None = None
    last_good: cp_model.CpSolver | None = None
    st = cp_model.UNKNOWN
    for i, e in enumerate(mod.levels):
        if deadline - time.perf_counter() < 0.05 * time_limit_s:
            st = cp_model.UNKNOWN
            break
        bound = relaxed_levels(view, tasks, fixed, workers, (deadline - time.perf_counter()) / 4)
        if bound is None:
            return None
        mod.m.add(e <= bound[i])
        mod.m.maximize(e)
        solver = _solver(workers, deadline - time.perf_counter())
        st = solver.solve(mod.m)
        if _DEBUG:
            print("stage", i, solver.status_name(st), solver.wall_time, file=sys.stderr)
        if st != cp_model.OPTIMAL:
            break
        last_good = solver
        fixed.append(int(solver.value(e)))
        mod.m.add(e == fixed[-1])
    else:
        mod.m.maximize(_lower_objective(mod))
        solver = _solver(workers, deadline - time.perf_counter())
        st = solver.solve(mod.m)
    if st == cp_model.UNKNOWN and last_good is not None:
        # time ran out in a later stage: the last proven stage's solution stands
        solver, st = last_good, cp_model.FEASIBLE
    return mod, solver, st


def _solution(view: View, tasks: Sequence[TaskSpec], mod: _Model, solver: cp_model.CpSolver, status: str,
              gap: float | None) -> CountSolution:
    return CountSolution(
        status,
        {t.name: {g.index: int(solver.value(mod.x[t.name, g.index])) for g in view.classes} for t in tasks},
        _cores(solver, mod.c),
        {gi: int(solver.value(v)) for gi, v in mod.pool.items()},
        gap,
    )


def _realised(view: View, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]], mod: _Model,
              solver: cp_model.CpSolver, sol: CountSolution, deadline: float) -> CountSolution:
    """The count model's O4 is a relaxation: ``kept[t,g] <= min(x, CPUs held
    in g)`` does not know which cores an E1 task's whole cores displace, so
    the CPUs of an optimal count vector may keep fewer than the model counted.
    Then that vector is excluded (a no-good on its x and c values) and the
    model solved again, until its optimum is no better than the best mapping
    found: that mapping is optimal (the mapping of one count vector is exact,
    :mod:`.mapping`).  Out of time: the best mapping, "feasible" with the gap.
    Found by the oracle tests: an E1 task took the core another task had to
    keep, while the core of a task with CPUs to spare was free."""
    from .mapping import map_counts  # the mapping imports this module
    from .problem import objective

    if not mod.kept_cap and not mod.tail:
        return sol  # nothing held now: the counts say everything
    claimed = _claimed(tasks, current, mod, solver)
    best = sol
    best_value = objective(view, tasks, map_counts(view, tasks, current, sol.counts, sol.cores), current)
    while best_value < claimed:
        if time.perf_counter() >= deadline:
            return CountSolution("feasible", best.counts, best.cores, best.pool, _tail_gap(best_value, claimed))
        _exclude(mod, solver)
        solver = _solver(1, deadline - time.perf_counter())
        st = solver.solve(mod.m)
        if st == cp_model.INFEASIBLE:
            break  # no other count vector: the best mapping is optimal
        if st != cp_model.OPTIMAL:
            return CountSolution("feasible", best.counts, best.cores, best.pool, _tail_gap(best_value, claimed))
        claimed = _claimed(tasks, current, mod, solver)
        if claimed <= best_value:
            break
        sol = _solution(view, tasks, mod, solver, "optimal", None)
        value = objective(view, tasks, map_counts(view, tasks, current, sol.counts, sol.cores), current)
        if value > best_value:
            best, best_value = sol, value
    return CountSolution("optimal", best.counts, best.cores, best.pool, None)


def _claimed(tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]], mod: _Model,
             solver: cp_model.CpSolver) -> tuple[int, ...]:
    """The objective (as :func:`.problem.objective`) the model's solution claims."""
    held = sum(len(set(current.get(t.name, ()))) for t in tasks if not is_other(t))
    out = tuple(int(solver.value(e)) for e in mod.levels) + (
        -int(solver.value(mod.spread)), -(held - int(solver.value(mod.kept))))
    if mod.tail:
        held_o = sum(len(set(current.get(t.name, ()))) for t in tasks if is_other(t))
        (touched, _), (near, _), (okept, _) = mod.tail
        out += (int(solver.value(touched)), int(solver.value(near)), -(held_o - int(solver.value(okept))))
    return out


def _tail_gap(value: tuple[int, ...], claimed: tuple[int, ...]) -> float:
    """Relative distance of the first term that differs."""
    for v, c in zip(value, claimed):
        if v != c:
            return abs(c - v) / max(1, abs(v))
    return 0.0


def _exclude(mod: _Model, solver: cp_model.CpSolver) -> None:
    """No-good: at least one x or c variable differs from the solution's value."""
    differs = []
    for v in list(mod.x.values()) + list(mod.c.values()):
        d = mod.m.new_bool_var("")
        mod.m.add(v != solver.value(v)).only_enforce_if(d)
        differs.append(d)
    mod.m.add_bool_or(differs)
    mod.m.clear_hints()


def _cores(solver: cp_model.CpSolver, c: dict[tuple[str, int], cp_model.IntVar]) -> dict[str, dict[int, int]]:
    out: dict[str, dict[int, int]] = {}
    for (name, gi), v in c.items():
        out.setdefault(name, {})[gi] = int(solver.value(v))
    return out

"""Differential tests: CP-SAT (count model), the naive matrix model and greedy
against an exhaustive python-constraint search on small random instances."""

from __future__ import annotations

import time

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cod.facts.synthetic import GIB, Shape, build
from cod.rm.allocator import OtherDemand, TaskSpec, allocate
from cod.rm.allocator.bounds import RelaxedBound, relaxed_bound, upper_bound
from cod.rm.allocator.problem import as_tasks, n_tail, objective, violations
from cod.rm.allocator.cpsat import solve_counts
from cod.rm.allocator.mapping import map_counts
from cod.rm.allocator.oracle import best, search_space
from cod.rm.allocator.lns import improve
from cod.rm.allocator.packing import pack
from cod.rm.allocator.topology import build_view
from cod.rm.allocator.waterfill import Fill, waterfill_bound
from helpers.waiting import PROVING_S

MAX_SPACE = 60_000  # keeps one exhaustive search well under a second


@st.composite
def machines(draw):
    shape = Shape(
        name="random",
        packages=draw(st.integers(1, 2)),
        dies_per_package=draw(st.integers(1, 2)),
        cores_per_die=draw(st.integers(1, 3)),
        threads_per_core=draw(st.integers(1, 2)),
        node_per_die=draw(st.booleans()),
        node_memory_bytes=draw(st.sampled_from([2, 4, 8, 64])) * GIB,
        l3_bytes_per_die=draw(st.sampled_from([None, 8 << 20])),
        smt_adjacent=draw(st.booleans()),
    )
    m = build(shape)
    assume(len(m.pus) <= 8)
    return m


@st.composite
def task_lists(draw, n_cpus: int):
    n = draw(st.integers(1, 4))
    out = []
    for i in range(n):
        lo = draw(st.sampled_from([1, 1, 1, 2, 3]))
        hi = draw(st.one_of(st.none(), st.integers(lo, lo + 3)))
        out.append(TaskSpec(
            name=f"t{i}",
            min_cores=lo,
            max_cores=hi,
            working_set_bytes=draw(st.sampled_from([0, 0, 1, 2])) * GIB,
            sensitive=frozenset(draw(st.sets(st.sampled_from(["numa", "cache"])))),
            exclusive=draw(st.sampled_from([True, True, False])),
            priority=draw(st.integers(0, 1)),
            pollutes_cache=draw(st.sampled_from([False, False, False, True])),
            allow_smt_sharing=draw(st.booleans()),
        ))
    return out


@st.composite
def instances(draw):
    m = draw(machines())
    cpus = list(m.cpu_ids())
    unavailable = draw(st.sets(st.sampled_from(cpus), max_size=2))
    tasks = draw(task_lists(len(cpus)))
    view = build_view(m, unavailable)
    assume(search_space(view, tasks) <= MAX_SPACE)
    return m, tasks, sorted(unavailable), view


def check_against_oracle(m, tasks, unavailable, view, current=None, others=()):
    """``others`` (OtherDemand) take part as the solvers see them (problem.as_tasks),
    their CPUs now as their current allocation; ``view`` must be split along their
    allowed sets."""
    registered = tasks
    if others:
        tasks = list(tasks) + as_tasks(others)
        current = dict(current or {}) | {o.name: o.cpus for o in others}
    best_obj, _ = best(view, tasks, current)
    for solver in ("cpsat", "naive"):
        r = allocate(m, registered, _registered(current, others), others=others, unavailable=unavailable,
                     solver=solver, time_limit_s=PROVING_S)
        if best_obj is None:
            assert r.status == "infeasible" and r.reason
            continue
        assert r.status == "optimal", (solver, r)
        alloc = r.as_mapping() | {v.name: v.cpus for v in r.reservations}
        assert violations(view, tasks, alloc) == []
        assert objective(view, tasks, alloc, current) == best_obj, solver
    # The count model itself, without the greedy fast path in front of it.
    sol = solve_counts(view, tasks, current or {}, PROVING_S)
    if best_obj is None:
        assert sol.status == "infeasible"
    else:
        assert sol.status == "optimal"
        alloc = map_counts(view, tasks, current or {}, sol.counts, sol.cores)
        assert violations(view, tasks, alloc) == []
        assert objective(view, tasks, alloc, current) == best_obj
    # The bounds that prove answers optimal without search must be valid.
    wf = waterfill_bound(view, tasks, current or {})
    if wf is None:
        assert best_obj is None, "waterfill says infeasible"
    elif isinstance(wf, Fill) and best_obj is not None:
        assert wf.objective >= best_obj, (wf, best_obj)
        packed = pack(view, tasks, current or {}, wf.totals, (wf.spread, wf.moves))
        if packed is not None:
            alloc = map_counts(view, tasks, current or {}, packed.counts, packed.cores)
            assert violations(view, tasks, alloc) == []
            assert objective(view, tasks, alloc, current) <= best_obj
    rb = relaxed_bound(view, tasks, current or {}, PROVING_S)
    if best_obj is not None:
        assert isinstance(rb, RelaxedBound), rb
        assert rb.objective >= best_obj, (rb, best_obj)
        assert upper_bound(view, tasks, current or {}) >= best_obj
        # a packing of the relaxation's totals is a feasible allocation
        packed = pack(view, tasks, current or {}, rb.totals, (rb.spread, rb.moves))
        if packed is not None:
            alloc = map_counts(view, tasks, current or {}, packed.counts, packed.cores)
            assert violations(view, tasks, alloc) == []
            assert objective(view, tasks, alloc, current) <= best_obj
            if packed.complete:
                assert objective(view, tasks, alloc, current)[:-n_tail(tasks)] == rb.levels
            # the neighbourhood search keeps everything valid and never loses
            counts, cores, _ = improve(view, tasks, current or {}, packed.counts, packed.cores,
                                       time.perf_counter() + 0.2)
            better = map_counts(view, tasks, current or {}, counts, cores)
            assert violations(view, tasks, better) == []
            assert objective(view, tasks, better, current)[:-1] >= objective(view, tasks, alloc, current)[:-1]
            assert objective(view, tasks, better, current) <= best_obj
    g = allocate(m, registered, _registered(current, others), others=others, unavailable=unavailable,
                 solver="greedy")
    if g.status != "infeasible":
        assert best_obj is not None
        alloc = g.as_mapping() | {v.name: v.cpus for v in g.reservations}
        assert violations(view, tasks, alloc) == []
        assert objective(view, tasks, alloc, current) <= best_obj
    return best_obj


def _registered(current, others):
    names = {o.name for o in others}
    return None if current is None else {k: v for k, v in current.items() if k not in names}


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(instances())
def test_optimal_without_current(inst):
    m, tasks, unavailable, view = inst
    check_against_oracle(m, tasks, unavailable, view)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(instances(), st.data())
def test_optimal_with_current(inst, data):
    """The current allocation comes from an earlier run: same tasks, before some CPUs
    became unavailable, or with one task fewer."""
    m, tasks, unavailable, view = inst
    earlier_tasks = tasks[:-1] if len(tasks) > 1 and data.draw(st.booleans()) else tasks
    earlier = allocate(m, earlier_tasks, solver="cpsat", time_limit_s=PROVING_S)
    assume(earlier.status != "infeasible")
    check_against_oracle(m, tasks, unavailable, view, earlier.as_mapping())


def test_regression_e1_core_displaces_no_cpu_another_task_must_keep():
    """Found by the differential test: on one core-pair class, the count model
    keeps t0 on CPU 1 and one of t1's CPUs, but the mapping gave E1 task t2 the
    core (1, 4), taking the only CPU t0 could keep, while core (2, 5) cost only
    t1 a CPU it had to spare: (5, -4, -5) claimed optimal against (5, -4, -4)."""
    m = build(Shape("random", packages=1, dies_per_package=1, cores_per_die=3, threads_per_core=2,
                    node_per_die=True, node_memory_bytes=64 * GIB, l3_bytes_per_die=8 << 20))
    tasks = [
        TaskSpec("t0", min_cores=1, max_cores=1, working_set_bytes=2 * GIB, sensitive=frozenset({"numa", "cache"}),
                 priority=1, pollutes_cache=True, allow_smt_sharing=True),
        TaskSpec("t1", min_cores=2, sensitive=frozenset({"numa"}), exclusive=False, priority=1),
        TaskSpec("t2", min_cores=2, sensitive=frozenset({"numa"}), priority=1),
    ]
    current = {"t0": [1], "t1": [2, 4, 5], "t2": [0, 3]}
    view = build_view(m, [0])
    assert check_against_oracle(m, tasks, [0], view, current) == (5, -4, -4)


@st.composite
def instances_with_others(draw):
    """Unregistered busy processes (issue #18) beside the tasks: 1-2 of them,
    running on CPUs that tasks may hold now, some restricted to a few CPUs."""
    m = draw(machines())
    cpus = list(m.cpu_ids())
    unavailable = draw(st.sets(st.sampled_from(cpus), max_size=1))
    tasks = draw(task_lists(len(cpus)))[:3]
    others = []
    for i in range(draw(st.integers(1, 2))):
        allowed = draw(st.one_of(st.none(), st.sets(st.sampled_from(cpus), min_size=1)))
        others.append(OtherDemand(f"other.{100 + i}", cores=draw(st.integers(1, 2)),
                                  cpus=tuple(draw(st.sets(st.sampled_from(cpus), max_size=2))),
                                  allowed=None if allowed is None else tuple(allowed)))
    view = build_view(m, unavailable, [frozenset(o.allowed) for o in others if o.allowed is not None])
    assume(search_space(view, tasks + as_tasks(others)) <= MAX_SPACE)
    return m, tasks, others, sorted(unavailable), view


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(instances_with_others(), st.data())
def test_optimal_with_others(inst, data):
    """Others' reservations are decided with the objective (O5-O7 included):
    every solver against the oracle, with a current allocation of the tasks
    from a run without the others (where they arrive) or with them."""
    m, tasks, others, unavailable, view = inst
    earlier = allocate(m, tasks, others=others if data.draw(st.booleans()) else (), solver="cpsat",
                       time_limit_s=PROVING_S)
    assume(earlier.status != "infeasible")
    check_against_oracle(m, tasks, unavailable, view, earlier.as_mapping(), others)


@st.composite
def medium_instances(draw):
    """Machines of up to 48 PUs, too large for the exhaustive oracle, with many
    shareable tasks and polluters: where the relaxation's pool cuts
    (bounds._pool_cover_cuts) act.  The count model's proven optimum is the
    reference there."""
    shape = Shape(
        name="medium",
        packages=draw(st.integers(1, 2)),
        dies_per_package=draw(st.integers(1, 3)),
        cores_per_die=draw(st.integers(1, 4)),
        threads_per_core=draw(st.integers(1, 2)),
        node_per_die=draw(st.booleans()),
        node_memory_bytes=draw(st.sampled_from([2, 4, 64])) * GIB,
        l3_bytes_per_die=draw(st.sampled_from([None, 8 << 20, 8 << 20])),
    )
    view = build_view(build(shape))
    n = len(view.cpus)
    tasks = []
    for i in range(draw(st.integers(3, 7))):
        lo = draw(st.integers(1, max(1, n // 4)))
        tasks.append(TaskSpec(
            name=f"t{i}", min_cores=lo,
            max_cores=draw(st.sampled_from([None, None, lo, lo + n // 4, lo + n // 2])),
            working_set_bytes=draw(st.sampled_from([0, 0, GIB // 2, GIB])),
            sensitive=frozenset(draw(st.sets(st.sampled_from(["numa", "cache"])))),
            exclusive=draw(st.sampled_from([True, False, False])),
            priority=draw(st.integers(0, 1)),
            pollutes_cache=draw(st.sampled_from([False, False, True])),
            allow_smt_sharing=draw(st.booleans()),
        ))
    return view, tasks


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(medium_instances())
def test_relaxed_bound_is_valid_on_medium_machines(inst):
    view, tasks = inst
    sol = solve_counts(view, tasks, {}, PROVING_S, workers=2)
    assume(sol.status == "optimal")
    alloc = map_counts(view, tasks, {}, sol.counts, sol.cores)
    assert violations(view, tasks, alloc) == []
    rb = relaxed_bound(view, tasks, {}, PROVING_S)
    assert isinstance(rb, RelaxedBound), rb
    assert rb.objective >= objective(view, tasks, alloc, {}), (rb, tasks)
    wf = waterfill_bound(view, tasks, {})
    assert wf is not None
    if isinstance(wf, Fill):
        assert wf.objective >= objective(view, tasks, alloc, {}), (wf, tasks)

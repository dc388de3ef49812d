"""The stateful Allocator (issue #19): one arrival or departure re-planned from
the published allocation, against the exhaustive oracle; and the generated
Table-4-like families of the benchmark at sizes the oracle can check."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from cod.facts import machines
from cod.facts.synthetic import GIB, Shape, build
from cod.rm.allocator import Allocator, OtherDemand, TaskSpec, allocate
from cod.rm.allocator.oracle import best, search_space
from cod.rm.allocator.problem import as_tasks, moves, objective, violations
from cod.rm.allocator.topology import build_view

from helpers.paths import REPO
from helpers.waiting import PROVING_S
from test_alloc_oracle import MAX_SPACE, instances

ROOT = REPO


def _bench():
    spec = importlib.util.spec_from_file_location("alloc_bench", ROOT / "bench" / "alloc_bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BENCH = _bench()


def check(view, tasks, current, r, others=()):
    """``r`` is valid; "optimal" means the oracle's optimum; never above it."""
    everyone = list(tasks) + as_tasks(others)
    cur = dict(current) | {o.name: o.cpus for o in others}
    best_obj, _ = best(view, everyone, cur)
    if best_obj is None:
        assert r.status == "infeasible"
        return
    assert r.status != "infeasible", r.reason
    alloc = r.as_mapping() | {v.name: v.cpus for v in r.reservations}
    assert violations(view, everyone, alloc) == []
    got = objective(view, everyone, alloc, cur)
    assert got <= best_obj
    if r.status == "optimal":
        assert got == best_obj, (r.via, got, best_obj)


def one_change(inst, data):
    """An allocator that has answered for one task set, and the set one arrival or one departure
    away: (allocator, the tasks after, what it published, unavailable CPUs, the view)."""
    m, tasks, unavailable, view = inst
    assume(len(tasks) >= 2)
    leaving = data.draw(st.booleans())
    before = tasks if leaving else tasks[:-1]
    after = [t for t in tasks if t is not tasks[0]] if leaving else tasks
    allocator = Allocator(m, time_limit_s=PROVING_S)
    first = allocator.allocate(before, unavailable=unavailable)
    assume(first.status != "infeasible")
    published = first.as_mapping()
    return allocator, after, published, unavailable, view


def test_an_arrival_that_takes_a_whole_core_does_not_give_half_of_it_back() -> None:
    """Found by the test below: exclusive t1 arrives where exclusive t0 holds every CPU (one whole
    core of two threads and a lone thread). t0 gave up the whole core, t1's memory let it use
    one of its CPUs, and the other went back to t0: two exclusive tasks on one core, and the
    mapping of counts to CPUs failed (ValueError) instead of the full solve answering."""
    m = build(Shape("pair", packages=2, dies_per_package=1, cores_per_die=1, threads_per_core=2,
                    node_memory_bytes=2 * GIB))
    t0 = TaskSpec("t0", min_cores=1, exclusive=True)
    t1 = TaskSpec("t1", min_cores=2, exclusive=True, working_set_bytes=2 * GIB)
    view = build_view(m, [0])
    assert sorted(len(g.cpus) for g in view.classes) == [1, 2]  # a whole core and a lone thread
    allocator = Allocator(m, time_limit_s=PROVING_S)
    published = allocator.allocate([t0], unavailable=[0]).as_mapping()
    assert sorted(published["t0"]) == [1, 2, 3]
    r = allocator.allocate([t0, t1], published, unavailable=[0])
    check(view, [t0, t1], published, r)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(instances(), st.data())
def test_one_arrival_or_departure_against_the_oracle(inst, data):
    allocator, after, published, unavailable, view = one_change(inst, data)
    r = allocator.allocate(after, published, unavailable=unavailable)
    check(view, after, published, r)
    again = allocator.allocate(after, r.as_mapping(), unavailable=unavailable)  # nothing changed
    if r.status != "infeasible":
        assert again.as_mapping() == r.as_mapping() and again.via == "unchanged"
        assert again.status == r.status


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(instances(), st.data())
def test_repair_answers_as_allocate_does_or_not_at_all(inst, data):
    """``repair`` (the daemon runs it on its event loop) gives allocate's answer when the repair
    is proven, and otherwise None, remembering nothing: allocate then answers as it would have."""
    allocator, after, published, unavailable, view = one_change(inst, data)
    twin = allocator.fork()
    expected = twin.allocate(after, published, unavailable=unavailable)
    repaired = allocator.repair(after, published, unavailable=unavailable)
    if repaired is None:
        assert not expected.via.startswith("incremental") or expected.status != "optimal", expected.via
        r = allocator.allocate(after, published, unavailable=unavailable)
        assert (r.as_mapping(), r.status, r.via) == (expected.as_mapping(), expected.status, expected.via)
    else:
        assert repaired.status == "optimal" and repaired.via.startswith("incremental")
        assert (repaired.as_mapping(), repaired.via) == (expected.as_mapping(), expected.via)
        check(view, after, published, repaired)
        # remembered as allocate remembers: nothing changed is "unchanged"
        assert allocator.allocate(after, repaired.as_mapping(), unavailable=unavailable).via == "unchanged"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(instances(), st.data())
def test_a_newcomer_process_through_the_allocator(inst, data):
    m, tasks, unavailable, view = inst
    cpus = list(view.cpus)
    assume(cpus)
    hog = OtherDemand("other.1", cores=data.draw(st.integers(1, 2)),
                      cpus=tuple(data.draw(st.sets(st.sampled_from(cpus), max_size=1))))
    assume(search_space(view, tasks + as_tasks([hog])) <= MAX_SPACE)
    allocator = Allocator(m, time_limit_s=PROVING_S)
    first = allocator.allocate(tasks, unavailable=unavailable)
    assume(first.status != "infeasible")
    published = first.as_mapping()
    r = allocator.allocate(tasks, published, others=[hog], unavailable=unavailable)
    check(view, tasks, published, r, [hog])


def test_explain_afterwards_gives_the_bindings_of_allocate():
    m = machines.load("magnycours")
    tasks = [TaskSpec("cscs", min_cores=8, max_cores=30, working_set_bytes=GIB, sensitive=frozenset({"numa", "cache"})),
             TaskSpec("hog", min_cores=1, max_cores=1, pollutes_cache=True)]
    allocator = Allocator(m, time_limit_s=PROVING_S)
    quick = allocator.allocate(tasks, explain=False)
    assert all(t.binding == () for t in quick.tasks)
    full = allocate(m, tasks, time_limit_s=PROVING_S)
    assert allocator.explain(quick).tasks == full.tasks


def test_arrival_into_free_cpus_is_proven_without_search():
    """After a proven allocation, a newcomer that gets its cap from free CPUs
    in the fewest domains moves nobody and is optimal (restriction argument)."""
    m = machines.load("magnycours")
    allocator = Allocator(m, time_limit_s=PROVING_S)
    tasks = [TaskSpec("db", min_cores=8, max_cores=12, sensitive=frozenset({"cache"}))]
    published = allocator.allocate(tasks).as_mapping()
    new = TaskSpec("web", min_cores=2, max_cores=6, sensitive=frozenset({"numa"}))
    r = allocator.allocate(tasks + [new], published)
    assert r.status == "optimal" and r.via == "incremental: newcomer at its best"
    assert moves(tasks, r.as_mapping(), published) == 0 and len(r.cores_of("web")) == 6


def test_a_stale_current_allocation_is_planned_from_scratch():
    m = machines.load("barcelona")
    allocator = Allocator(m, time_limit_s=PROVING_S)
    tasks = [TaskSpec("a", min_cores=2, max_cores=4), TaskSpec("b", min_cores=1, max_cores=2)]
    allocator.allocate(tasks)
    r = allocator.allocate(tasks[:1], {"a": [30, 31]})  # not what it published
    assert r.via != "unchanged" and not r.via.startswith("incremental")
    assert r.status == "optimal"


@st.composite
def small_families(draw):
    """The benchmark's Table-4-like generator on machines the oracle can search."""
    shape = Shape("small", packages=draw(st.integers(1, 2)), dies_per_package=draw(st.integers(1, 2)),
                  cores_per_die=draw(st.integers(1, 3)), threads_per_core=draw(st.integers(1, 2)),
                  node_per_die=draw(st.booleans()), node_memory_bytes=draw(st.sampled_from([2, 4, 16])) * GIB,
                  l3_bytes_per_die=draw(st.sampled_from([None, 8 << 20])))
    m = build(shape)
    assume(len(m.pus) <= 8)
    view = build_view(m)
    tasks, current = BENCH.table4_family(view, draw(st.integers(0, 10**6)))
    tasks = tasks[:3]
    current = {k: v for k, v in current.items() if k in {t.name for t in tasks}}
    assume(search_space(view, tasks) <= MAX_SPACE)
    return m, view, tasks, current


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(small_families())
def test_generated_family_at_small_sizes_against_the_oracle(inst):
    """Every fast path the family takes on the reference machines (greedy or
    the packing proven by the closed-form or waterfill bound, the CP-SAT
    relaxation, the count model) must give the oracle's optimum."""
    m, view, tasks, current = inst
    for solver in ("cpsat", "naive"):
        r = allocate(m, tasks, current, solver=solver, time_limit_s=PROVING_S)
        check(view, tasks, current, r)
        assert r.status in ("optimal", "infeasible"), (solver, r.status, r.via)

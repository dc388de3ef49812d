"""The daemon's runner uses the incremental allocator (issue #24): for one arrival
or one departure it repairs its last answer, and what it returns is the full
solve's answer, or one with the same objective proven optimal.  Checked on every
reference machine and hwloc topology of the tests, step by step against the
stateless full solve; and through :class:`cod.rm.allocator_runner.AllocatorRunner` itself."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cod.facts import machines
from cod.rm.allocator import Allocator, OtherDemand, TaskSpec, allocate
from cod.rm.allocator.problem import as_tasks, objective, violations
from cod.rm.allocator.topology import build_view
from cod.rm.allocator_runner import AllocatorRunner

from test_alloc_machines import SOURCES, load, mixed_tasks
from test_alloc_oracle import task_lists

TIME_LIMIT_S = 5.0  # generous: the comparison is of answers, not of speed on a loaded machine


def compare(m, allocator: Allocator, tasks: list[TaskSpec], published: dict, others=()):
    """One step through ``allocator`` and through the full solve, on the same inputs;
    returns the allocator's result."""
    inc = allocator.allocate(tasks, published, others=others)
    full = allocate(m, tasks, published, others=others, time_limit_s=TIME_LIMIT_S)
    assert (inc.status == "infeasible") == (full.status == "infeasible"), (inc.via, full.via)
    if full.status == "infeasible":
        return inc
    view = build_view(m, (), [frozenset(o.allowed) for o in others if o.allowed is not None])
    everyone = list(tasks) + as_tasks(others)
    cur = dict(published) | {o.name: o.cpus for o in others}
    values = []
    for r in (inc, full):
        alloc = r.as_mapping() | {v.name: v.cpus for v in r.reservations}
        assert violations(view, everyone, alloc) == [], r.via
        values.append(objective(view, everyone, alloc, cur))
    if full.status == "optimal" or inc.status == "optimal":
        # the full solve's objective, or a proven-optimal alternative with the same one
        assert values[0] == values[1], (inc.via, inc.status, values[0], full.via, full.status, values[1])
    return inc


@pytest.mark.parametrize("source", SOURCES)
def test_arrivals_and_departures_equal_the_full_solve(source):
    m = load(source)
    tasks = mixed_tasks(m)
    allocator = Allocator(m, time_limit_s=TIME_LIMIT_S)
    allocator.reset([], {})
    published: dict[str, tuple[int, ...]] = {}
    held: list[TaskSpec] = []
    vias = []
    steps = [("arrive", t) for t in tasks] + [("leave", t) for t in (tasks[1], tasks[3], tasks[0], tasks[4])]
    for what, t in steps:
        held = held + [t] if what == "arrive" else [u for u in held if u.name != t.name]
        published = {u.name: published[u.name] for u in held if u.name in published}
        r = compare(m, allocator, held, published)
        vias.append(r.via)
        if r.status == "infeasible":  # a refused admission: the service does not adopt it
            held = [u for u in held if u.name != t.name]
            continue
        published = {u.name: r.cores_of(u.name) for u in held}
    # the runner took the repair (proven) at least once on this machine, not only the full solve
    assert any(v.startswith("incremental") for v in vias), vias


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SOURCES), st.data())
def test_random_arrivals_and_departures_equal_the_full_solve(source, data):
    """Random tasks of every kind (those of the oracle tests, bigger) arrive and leave in a random order."""
    m = load(source)
    n = len(m.cpu_ids())
    tasks = [TaskSpec(t.name, min_cores=t.min_cores, max_cores=None if t.max_cores is None else t.max_cores * 2,
                      working_set_bytes=t.working_set_bytes, sensitive=t.sensitive, exclusive=t.exclusive,
                      priority=t.priority, pollutes_cache=t.pollutes_cache, allow_smt_sharing=t.allow_smt_sharing)
             for t in data.draw(task_lists(n))]
    allocator = Allocator(m, time_limit_s=TIME_LIMIT_S)
    allocator.reset([], {})
    held: list[TaskSpec] = []
    published: dict[str, tuple[int, ...]] = {}
    order = data.draw(st.permutations(tasks))
    for what, t in [("arrive", t) for t in tasks] + [("leave", t) for t in order[:-1]]:
        held = held + [t] if what == "arrive" else [u for u in held if u.name != t.name]
        published = {u.name: published[u.name] for u in held if u.name in published}
        r = compare(m, allocator, held, published)
        if r.status == "infeasible":
            held = [u for u in held if u.name != t.name]
            continue
        published = {u.name: r.cores_of(u.name) for u in held}


@pytest.mark.parametrize("source", ["machine:magnycours", "machine:shanghai"])
def test_a_newcomer_process_and_its_departure_equal_the_full_solve(source):
    m = load(source)
    tasks = mixed_tasks(m)
    allocator = Allocator(m, time_limit_s=TIME_LIMIT_S)
    first = allocator.allocate(tasks)
    published = {k: tuple(v) for k, v in first.as_mapping().items()}
    hog = OtherDemand("other.1", cores=2, cpus=(published["web"][0],))
    r = compare(m, allocator, tasks, published, [hog])
    compare(m, allocator, tasks, {t.name: r.cores_of(t.name) for t in tasks})  # the process left


def test_the_planner_repairs_one_arrival_and_one_departure():
    m = machines.load("magnycours")
    db = TaskSpec("db", min_cores=8, max_cores=12, sensitive=frozenset({"cache"}))
    web = TaskSpec("web", min_cores=2, max_cores=6, sensitive=frozenset({"numa"}))

    async def scenario():
        runner = AllocatorRunner(m, time_limit_s=TIME_LIMIT_S)
        try:
            empty = await runner.run([], {})
            assert empty.cores == {}
            first = await runner.run([db], {})
            assert first.status == "optimal" and first.proof.startswith("incremental"), first.proof
            both = await runner.run([db, web], first.cores)
            assert both.status == "optimal" and both.proof == "incremental: newcomer at its best", both.proof
            assert runner._busy is None  # proven repairs ran on the event loop, not in the worker thread
            assert both.cores["db"] == first.cores["db"] and len(both.cores["web"]) == 6
            alone = await runner.run([db], {"db": both.cores["db"]})
            full = allocate(m, [db], {"db": both.cores["db"]})
            assert alone.proof.startswith("incremental") and alone.status == "optimal", alone.proof
            view = build_view(m)
            assert (objective(view, [db], alone.cores, {"db": both.cores["db"]})
                    == objective(view, [db], full.as_mapping(), {"db": both.cores["db"]}))
        finally:
            runner.close()

    asyncio.run(scenario())


def test_a_plan_the_service_did_not_adopt_leads_to_a_full_solve():
    """An admission planned and then refused (e.g. the SKB write failed): the next run's
    ``current`` is not that plan, so the runner solves from scratch, as the full solve."""
    m = machines.load("barcelona")
    a = TaskSpec("a", min_cores=2, max_cores=30)
    b = TaskSpec("b", min_cores=4, max_cores=8)

    async def scenario():
        runner = AllocatorRunner(m, time_limit_s=TIME_LIMIT_S)
        try:
            first = await runner.run([a], {})  # a new runner: nothing allocated, so one arrival
            assert first.proof.startswith("incremental"), first.proof
            trial = await runner.run([a, b], first.cores)  # b takes CPUs of a: not adopted
            assert set(trial.cores["a"]) < set(first.cores["a"])
            c = TaskSpec("c", min_cores=1, max_cores=2)
            after = await runner.run([a, c], first.cores)  # two changes from the trial: b gone, c came
            assert not after.proof.startswith("incremental") and after.proof != "unchanged", after.proof
            full = allocate(m, [a, c], first.cores)
            assert after.cores == {t.name: tuple(t.cores) for t in full.tasks}
        finally:
            runner.close()

    asyncio.run(scenario())


def test_a_failing_repair_is_not_taken_for_bad_input(monkeypatch):
    """A bug of the incremental repair that raises ValueError (the mapping did, for an exclusive
    newcomer, until session 15) is the allocator's own failure: the runner plans from scratch and
    admits the task. It used to pass the ValueError on as bad input, refusing the admission."""
    m = machines.load("barcelona")
    a = TaskSpec("a", min_cores=2, max_cores=8)
    b = TaskSpec("b", min_cores=4, max_cores=8)

    def broken(self, req, deadline):
        raise ValueError("min() arg is an empty sequence")

    async def scenario():
        runner = AllocatorRunner(m, time_limit_s=TIME_LIMIT_S)
        try:
            first = await runner.run([a], {})
            monkeypatch.setattr(Allocator, "_incremental", broken)
            both = await runner.run([a, b], first.cores)
            full = allocate(m, [a, b], first.cores)
            assert both.cores == {t.name: tuple(t.cores) for t in full.tasks}
            assert not both.proof.startswith("incremental"), both.proof
        finally:
            runner.close()

    asyncio.run(scenario())

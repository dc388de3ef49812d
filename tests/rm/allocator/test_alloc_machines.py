"""Table-driven over the real machines of tests/data/topologies/hwloc (hwloc's exports) and the
paper's reference machines: every allocation satisfies C1-C6, and recomputing
with one task removed or added moves no core of an unaffected task."""

from __future__ import annotations

import pytest

from cod.facts import hwloc_xml, machines
from cod.facts.synthetic import GIB
from cod.rm.allocator import TaskSpec, allocate
from cod.rm.allocator.problem import moves, objective, violations
from cod.rm.allocator.topology import build_view
from helpers.data import HWLOC_DIR

HWLOC_FILES = sorted(HWLOC_DIR.glob("*.xml"))


def load(source: str):
    if source.startswith("machine:"):
        return machines.load(source.removeprefix("machine:"))
    return hwloc_xml.load(HWLOC_DIR / source)


SOURCES = [f"machine:{n}" for n in machines.names()] + [p.name for p in HWLOC_FILES]


def mixed_tasks(m) -> list[TaskSpec]:
    """Bounded demands that fit together, of every kind the model knows.  A cache
    polluter only where there is an L3 domain apart from the cache-sensitive task."""
    n_cpus = len(m.cpu_ids())
    pollutes = build_view(m).n_domains > 1
    eighth = max(1, n_cpus // 8)
    return [
        TaskSpec("db", min_cores=max(1, n_cpus // 16), max_cores=max(1, n_cpus // 4),
                 working_set_bytes=GIB // 4, sensitive=frozenset({"numa", "cache"})),
        TaskSpec("web", min_cores=1, max_cores=eighth, allow_smt_sharing=True),
        TaskSpec("batch", min_cores=1, max_cores=eighth, exclusive=False, pollutes_cache=pollutes),
        TaskSpec("log", min_cores=1, max_cores=1, exclusive=False),
        TaskSpec("hpc", min_cores=1, max_cores=eighth, sensitive=frozenset({"numa"}), priority=1),
    ]


def test_every_hwloc_file_is_covered():
    assert len(HWLOC_FILES) >= 10


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("solver", ["cpsat", "greedy"])
def test_allocation_satisfies_constraints(source, solver):
    m = load(source)
    tasks = mixed_tasks(m)
    if len(m.cpu_ids()) < 4:
        tasks = tasks[:2]
    r = allocate(m, tasks, solver=solver)
    assert r.status in ("optimal", "feasible"), r
    view = build_view(m)
    assert violations(view, tasks, r.as_mapping()) == []
    assert r.solve_ms > 0
    for t in r.tasks:
        assert t.binding, t
        assert set(t.numa_nodes) == {view.node_of[c] for c in t.cores}


@pytest.mark.parametrize("source", SOURCES)
def test_removing_a_task_moves_no_other(source):
    m = load(source)
    tasks = mixed_tasks(m)[: 2 if len(m.cpu_ids()) < 4 else None]
    view = build_view(m)
    before = allocate(m, tasks)
    for gone in tasks:
        rest = [t for t in tasks if t is not gone]
        stay = {t.name: before.cores_of(t.name) for t in rest}
        after = allocate(m, rest, before.as_mapping())
        assert violations(view, rest, after.as_mapping()) == []
        got, kept = objective(view, rest, after.as_mapping(), stay), objective(view, rest, stay, stay)
        assert got >= kept
        if got[:-1] == kept[:-1]:  # nothing better to gain: nothing may move
            assert moves(rest, after.as_mapping(), stay) == 0, gone.name


@pytest.mark.parametrize("source", SOURCES)
def test_adding_a_task_moves_no_other(source):
    m = load(source)
    n = len(m.cpu_ids())
    tasks = mixed_tasks(m)[: 1 if n < 4 else None]  # 2 CPUs: leave one free
    view = build_view(m)
    before = allocate(m, tasks)
    newcomer = TaskSpec("new", min_cores=1, max_cores=1, exclusive=False)
    after = allocate(m, tasks + [newcomer], before.as_mapping())
    assert after.status in ("optimal", "feasible")
    assert violations(view, tasks + [newcomer], after.as_mapping()) == []
    # The newcomer is shareable and needs one CPU: it fits beside everyone.
    assert moves(tasks, after.as_mapping(), before.as_mapping()) == 0
    for t in tasks:
        assert after.cores_of(t.name) == before.cores_of(t.name)


@pytest.mark.parametrize("source", ["machine:magnycours", "machine:nehalem-ex"])
def test_unavailable_cpus_are_never_given(source):
    m = load(source)
    busy = list(m.cpu_ids())[: len(m.cpu_ids()) // 3]
    tasks = mixed_tasks(m)
    r = allocate(m, tasks, unavailable=busy)
    assert r.status in ("optimal", "feasible")
    assert not {c for t in r.tasks for c in t.cores} & set(busy)

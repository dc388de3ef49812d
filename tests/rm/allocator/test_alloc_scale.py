"""The allocator at the scale of issue #5: the largest real machine of
tests/data/topologies (384 threads, 24 L3/NUMA domains) and a synthetic
2-socket 192-core/384-thread machine with 8 NUMA nodes, with the benchmark's
seeded task mixes.  Every answer is valid and never above the relaxation's
bound; what the bound proves (status, gap) is consistent with the objective."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from cod.facts import hwloc_xml
from cod.facts.synthetic import GIB, MIB, Shape, build
from cod.rm.allocator import allocate
from cod.rm.allocator.bounds import RelaxedBound, relaxed_bound
from cod.rm.allocator.problem import objective, violations
from cod.rm.allocator.solve import lexicographic_gap
from cod.rm.allocator.topology import build_view
from helpers.paths import REPO
from helpers.data import HWLOC_DIR
from helpers.waiting import PROVING_S

ROOT = REPO


def _bench():
    """The benchmark's task generator (one definition of the scale scenarios)."""
    spec = importlib.util.spec_from_file_location("alloc_bench", ROOT / "bench" / "alloc_bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BENCH = _bench()
MACHINES = {
    "real-192em64t-24n8c2t": lambda: hwloc_xml.load(HWLOC_DIR / "192em64t-24n8c2t.xml"),
    "synthetic-2s192c384t": lambda: build(Shape(
        "synthetic-2s192c384t", packages=2, dies_per_package=4, cores_per_die=24, threads_per_core=2,
        node_per_die=True, l3_bytes_per_die=32 * MIB, node_memory_bytes=64 * GIB)),
}
_LOADED: dict = {}


def machine(name: str):
    if name not in _LOADED:
        _LOADED[name] = MACHINES[name]()
    return _LOADED[name]


@pytest.mark.parametrize("name", sorted(MACHINES))
@pytest.mark.parametrize("n_tasks,seed,limit", [(32, 32, 1.0), (32, 1032, 0.3), (128, 128, 0.3), (128, 1128, 0.3)])
def test_scale_answers_are_valid_and_bounded(name, n_tasks, seed, limit):
    m = machine(name)
    view = build_view(m)
    tasks = BENCH.mixed(n_tasks, len(view.cpus), seed=seed)
    r = allocate(m, tasks, time_limit_s=limit)
    assert r.status in ("optimal", "feasible", "fallback"), r.reason
    alloc = r.as_mapping()
    assert violations(view, tasks, alloc) == []
    got = objective(view, tasks, alloc)
    rb = relaxed_bound(view, tasks, {}, PROVING_S)
    assert isinstance(rb, RelaxedBound)
    assert got <= rb.objective
    gap = lexicographic_gap(got, rb.objective, 0)
    if r.gap is not None:
        # A gap is only claimed with O2 proven, and never smaller than the true one. It is
        # measured against the allocator's own bound: the relaxation's optimum when the time
        # limit let it finish, else the solver's weaker bound (bounds.py), so at load 9 on 2
        # CPUs it claimed 0.41 for an answer the finished relaxation proves optimal.
        assert gap is not None and r.gap >= gap - 1e-9, (r.gap, gap, r.via)


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_benchmark_mix_of_32_tasks_is_proven_optimal(name):
    """The bound + packing path proves the issue's 32-task scenario optimal
    without search (the figure behind the 20 ms target)."""
    m = machine(name)
    view = build_view(m)
    tasks = BENCH.mixed(32, len(view.cpus), seed=32)
    r = allocate(m, tasks, time_limit_s=PROVING_S)
    rb = relaxed_bound(view, tasks, {}, PROVING_S)
    assert r.status == "optimal"
    assert objective(view, tasks, r.as_mapping()) == rb.objective


@pytest.mark.parametrize("name", sorted(MACHINES))
def test_benchmark_mix_of_128_tasks_is_proven_optimal(name):
    """The pool cover cuts of the relaxation make the bound of the issue's
    128-task scenario tight, and the packing reaches it (the 100 ms target)."""
    m = machine(name)
    view = build_view(m)
    tasks = BENCH.mixed(128, len(view.cpus), seed=128)
    r = allocate(m, tasks, time_limit_s=PROVING_S)
    rb = relaxed_bound(view, tasks, {}, PROVING_S)
    assert r.status == "optimal"
    assert objective(view, tasks, r.as_mapping()) == rb.objective

"""Unregistered busy processes ("others", issue #18) as demands of the allocator:
a newcomer moves, the registered task stays; free CPUs first, then the task
that loses least; the explanation names the reservation."""

from __future__ import annotations

import json

import pytest

from cod.cli.main import main
from cod.facts import hwloc_xml
from cod.facts.synthetic import GIB, Shape, build
from cod.rm.allocator import OtherDemand, TaskSpec, TaskSpecError, allocate
from cod.rm.allocator.topology import build_view
from helpers.data import HWLOC_DIR

SOLVERS = ("cpsat", "naive", "greedy")
ZEN = HWLOC_DIR / "AMD-17h-Zen-2xEpyc-7451.xml"  # 2 x 4 NUMA nodes, 2 L3 domains of 3 cores x 2 threads each


def two_cpus():
    """This VM: 2 CPUs, one node."""
    return build(Shape("two-cpus", packages=1, dies_per_package=1, cores_per_die=2))


@pytest.mark.parametrize("solver", SOLVERS)
def test_hog_on_the_registered_tasks_cpu_gets_the_other_cpu(solver):
    """The issue's scenario: a task on CPU 0 (min = max = 1), a hog seen on CPU 0:
    the hog gets CPU 1 and the task stays, every time."""
    m = two_cpus()
    db = TaskSpec("db", min_cores=1, max_cores=1)
    hog = OtherDemand("other.4242", cores=1, cpus=(0,))
    for _ in range(20):
        r = allocate(m, [db], {"db": [0]}, others=[hog], solver=solver)
        assert r.cores_of("db") == (0,)
        assert r.reservations[0].cpus == (1,) and r.reservations[0].moved
        assert r.tasks[0].displaced_by == ()
        assert "CPU 0 kept by db" in r.reservations[0].binding


@pytest.mark.parametrize("solver", SOLVERS)
def test_registered_task_moves_only_when_the_hog_has_no_choice(solver):
    """A hog that may only run on CPU 0 (its affinity) gets CPU 0; the task moves
    and its allocation names the hog, for the upcall's reason."""
    m = two_cpus()
    r = allocate(m, [TaskSpec("db", min_cores=1, max_cores=1)], {"db": [0]},
                 others=[OtherDemand("other.7", cpus=(0,), allowed=(0,))], solver=solver)
    assert r.cores_of("db") == (1,)
    assert r.reservations[0].cpus == (0,) and not r.reservations[0].moved
    assert r.tasks[0].displaced_by == ("other.7",)


@pytest.mark.parametrize("solver", ["cpsat", "naive"])
def test_hog_takes_from_the_task_that_loses_least(solver):
    """No free CPU: the hog takes one from the lower-priority task; at equal
    priority from the task that is not cache-sensitive, and both CPUs of a
    two-core hog from one task (fewest tasks touched)."""
    m = build(Shape("4x2", packages=1, dies_per_package=2, cores_per_die=2, node_per_die=True,
                    l3_bytes_per_die=8 << 20))  # L3 0-1 and 2-3
    plain = TaskSpec("plain", min_cores=1, max_cores=2)
    cache = TaskSpec("cache", min_cores=1, max_cores=2, sensitive=frozenset({"cache"}))
    current = {"cache": [0, 1], "plain": [2, 3]}
    r = allocate(m, [plain, cache], current, others=[OtherDemand("other.1", cpus=(0,))], solver=solver)
    assert r.cores_of("cache") == (0, 1)  # the hog ran on CPU 0, but cache stays whole
    assert len(r.cores_of("plain")) == 1 and r.tasks[1].displaced_by == ("other.1",)
    assert set(r.reservations[0].cpus) <= {2, 3}

    low = TaskSpec("cache", min_cores=1, max_cores=2, sensitive=frozenset({"cache"}), priority=-1)
    r = allocate(m, [plain, low], current, others=[OtherDemand("other.1", cpus=(2,))], solver=solver)
    assert r.cores_of("plain") == (2, 3) and len(r.cores_of("cache")) == 1  # priority first

    # 6 CPUs, a and b hold 3 each: the hog's 2 CPUs come from one of them,
    # although it ran on one CPU of each (tasks touched before its own move)
    m = build(Shape("6", packages=1, dies_per_package=2, cores_per_die=3, l3_bytes_per_die=8 << 20))
    a, b = TaskSpec("a", min_cores=1, max_cores=3), TaskSpec("b", min_cores=1, max_cores=3)
    r = allocate(m, [a, b], {"a": [0, 1, 2], "b": [3, 4, 5]},
                 others=[OtherDemand("other.2", cores=2, cpus=(2, 3))], solver=solver)
    assert sorted(len(t.cores) for t in r.tasks) == [1, 3]
    assert len([t for t in r.tasks if t.displaced_by]) == 1, r


@pytest.mark.parametrize("solver", SOLVERS)
def test_free_cpus_first_and_hogs_never_cost_a_min_core(solver):
    m = two_cpus()
    db = TaskSpec("db", min_cores=1, max_cores=1)
    r = allocate(m, [db], {"db": [1]}, others=[OtherDemand("other.1", cpus=(0,))], solver=solver)
    assert r.cores_of("db") == (1,) and r.reservations[0].cpus == (0,) and not r.reservations[0].moved
    # two hogs, one free CPU: the task keeps its min_cores, one hog goes short
    r = allocate(m, [db], {"db": [1]}, others=[OtherDemand("other.1", cpus=(0,)), OtherDemand("other.2", cpus=(1,))],
                 solver=solver)
    assert r.status != "infeasible" and r.cores_of("db") == (1,)
    short = [v for v in r.reservations if not v.cpus]
    assert len(short) == 1 and any("min_cores" in b for b in short[0].binding)


def test_newcomer_lands_away_from_the_cache_sensitive_task_and_is_explained(tmp_path, capsys):
    """cod plan --hwloc on a machine with 16 L3 domains in 8 NUMA nodes: a hog
    running inside the L3 domain of a cache- and numa-sensitive task is
    reserved a CPU of another domain and node; the task stays where it is."""
    m = hwloc_xml.load(ZEN)
    view = build_view(m)
    l3 = sorted(c for c in view.cpus if view.domain_of[c] == view.domain_of[0])  # 0-2,48-50
    db = l3[:4]
    hog_cpu = l3[4]
    tasks = tmp_path / "tasks.json"
    tasks.write_text(json.dumps({"tasks": [
        {"name": "db", "min_cores": 4, "max_cores": 4, "sensitive": ["cache", "numa"],
         "working_set_bytes": GIB // 4, "allow_smt_sharing": True},
        {"name": "web", "min_cores": 2, "max_cores": 8, "exclusive": False},
    ]}))
    current = tmp_path / "current.json"
    current.write_text(json.dumps({"db": db}))
    others = tmp_path / "others.toml"
    others.write_text(f'[[others]]\nname = "other.4242"\ncores = 1\ncpus = [{hog_cpu}]\n')
    args = ["plan", "--hwloc", str(ZEN), "--tasks", str(tasks), "--current", str(current), "--others", str(others)]
    assert main(args + ["--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    by_name = {t["name"]: t for t in out["tasks"]}
    assert by_name["db"]["cores"] == db and "displaced_by" not in by_name["db"]
    (res,) = out["reservations"]
    assert res["name"] == "other.4242" and len(res["cpus"]) == 1 and res["moved"]
    (cpu,) = res["cpus"]
    assert view.domain_of[cpu] != view.domain_of[0] and view.node_of[cpu] != view.node_of[0]
    assert any("beside sensitive db" in b for b in res["binding"])

    assert main(args) == 0
    text = capsys.readouterr().out
    row = "".join(line for line in text.splitlines() if line.startswith("other.4242 "))  # every block's
    assert row.count("R") == 1
    assert "other.4242: reserved CPUs" in text and "moved" in text


def test_a_task_that_cannot_grow_names_the_reservation():
    m = two_cpus()
    r = allocate(m, [TaskSpec("grow", min_cores=1)], {"grow": [0, 1]}, others=[OtherDemand("other.9", cpus=(1,))])
    assert r.cores_of("grow") == (0,)
    assert "reserved for other.9" in r.tasks[0].binding
    assert r.tasks[0].displaced_by == ("other.9",)


@pytest.mark.parametrize(
    "data, words",
    [
        ({"name": "other.1", "cores": 0}, ["'other.1'", "cores"]),
        ({"name": "other.1", "cpus": "0"}, ["'other.1'", "cpus"]),
        ({"name": "other.1", "allowed": [-1]}, ["'other.1'", "allowed"]),
        ({"name": "other.1", "pid": 3}, ["'other.1'", "pid"]),
        ({"cores": 1}, ["name"]),
    ],
)
def test_bad_other_names_process_and_key(data, words):
    with pytest.raises(TaskSpecError) as err:
        OtherDemand.from_dict(data)
    for w in words:
        assert w in str(err.value)


def test_other_names_are_checked():
    m = two_cpus()
    with pytest.raises(TaskSpecError, match="'db'"):
        allocate(m, [TaskSpec("db")], others=[OtherDemand("db")])
    with pytest.raises(ValueError, match="CPU 9"):
        allocate(m, [TaskSpec("db")], others=[OtherDemand("other.1", cpus=(9,))])

"""The constructors of the facts the daemon writes (cod.rm.system_facts): the exact text of each,
its patterns, and a real SKB storing and answering them with the names as given."""

from __future__ import annotations

import pytest

from cod.rm.system_facts import (
    ANY, allocated_fact, allocation_epoch_fact, cpu_load_fact, numa_free_fact, other_task_fact, task_cpu_use_fact,
    task_fact, task_facts, task_numa_pages_fact, task_property_fact,
)
from cod.skb import SKB


@pytest.mark.parametrize("fact, text", [
    (task_fact("scan", 4242, "tpch"), "task(scan, 4242, tpch)"),
    (task_fact("Scan 1", 7, "it's"), "task('Scan 1', 7, 'it\\'s')"),
    (task_fact("scan", ANY, ANY), "task(scan, _, _)"),
    (task_property_fact("scan", "max_cores", 4), "task_property(scan, max_cores, 4)"),
    (task_property_fact("scan", "memory_bound", True), "task_property(scan, memory_bound, true)"),
    (task_property_fact("scan", "cpus", [0, 2]), "task_property(scan, cpus, [0, 2])"),
    (task_property_fact("scan", "weight", 0.25), "task_property(scan, weight, 0.25)"),
    (task_property_fact("scan", "numa", "local"), "task_property(scan, numa, local)"),
    (task_property_fact("scan", "numa", None), "task_property(scan, numa, none)"),
    (task_property_fact("a\\b", ANY, ANY), "task_property('a\\\\b', _, _)"),
    (other_task_fact(99, "postgres", (3, 4)), "other_task(99, postgres, [3, 4])"),
    (other_task_fact(99, "kworker/0:1", []), "other_task(99, 'kworker/0:1', [])"),
    (other_task_fact(99, "a\u2028b", [1]), "other_task(99, 'a\\x2028\\b', [1])"),
    (other_task_fact(ANY, ANY, ANY), "other_task(_, _, _)"),
    (allocated_fact("scan", 3), "allocated(scan, 3)"),
    (allocated_fact("My DB", ANY), "allocated('My DB', _)"),
    (allocated_fact(ANY, ANY), "allocated(_, _)"),
    (allocation_epoch_fact(17), "allocation_epoch(17)"),
    (allocation_epoch_fact(ANY), "allocation_epoch(_)"),
    (cpu_load_fact(5, 87), "cpu_load(5, 87)"),
    (cpu_load_fact(ANY, ANY), "cpu_load(_, _)"),
    (numa_free_fact(1, 8589934592), "numa_free(1, 8589934592)"),
    (numa_free_fact(ANY, ANY), "numa_free(_, _)"),
    (task_cpu_use_fact("scan", 150), "task_cpu_use(scan, 150)"),
    (task_cpu_use_fact("Q1", 0), "task_cpu_use('Q1', 0)"),
    (task_cpu_use_fact(ANY, ANY), "task_cpu_use(_, _)"),
    (task_numa_pages_fact("scan", 0, 1024), "task_numa_pages(scan, 0, 1024)"),
    (task_numa_pages_fact(ANY, ANY, ANY), "task_numa_pages(_, _, _)"),
])
def test_fact_text(fact: str, text: str) -> None:
    assert fact == text


def test_task_facts_are_task_and_one_property_per_key_sorted_without_the_name() -> None:
    facts = task_facts("scan", 12, "db", {"name": "scan", "max_cores": 2, "cpus": [1], "min_cores": 1})
    assert facts == ["task(scan, 12, db)", "task_property(scan, cpus, [1])",
                     "task_property(scan, max_cores, 2)", "task_property(scan, min_cores, 1)"]


def test_a_real_skb_stores_the_facts_and_answers_with_the_names_as_given() -> None:
    names = ["scan", "Scan 1", "it's", "a\\b", "x), halt, (y", "数据库"]
    with SKB(load_library=False) as skb:
        skb.add_system_facts([task_fact(n, 100 + i, "app") for i, n in enumerate(names)]
                             + [allocated_fact(n, i) for i, n in enumerate(names)]
                             + [other_task_fact(7, "kworker/0:1", [2, 3]), allocation_epoch_fact(4)])
        rows = skb.execute_query("t", "task(N, P, A), allocated(N, C)")
        assert [(r["N"], r["P"], r["A"], r["C"]) for r in rows] == [
            (n, 100 + i, "app", i) for i, n in enumerate(names)]
        assert skb.execute_query("t", "other_task(P, C, L), allocation_epoch(E)") == [
            {"P": 7, "C": "kworker/0:1", "L": [2, 3], "E": 4}]
        assert skb.remove_system_facts(allocated_fact("x), halt, (y", ANY)) == 1
        assert skb.remove_system_facts(task_fact(ANY, ANY, ANY)) == len(names)
        assert len(skb.execute_query("t", "allocated(N, C)")) == len(names) - 1


NAMES = ["scan", "Scan 1", "it's", "a\\b", "数据库", "q-1", "_x"]


@pytest.mark.parametrize("name", NAMES)
def test_the_constructors_write_what_the_daemon_wrote_with_f_strings(name: str) -> None:
    """The text of rm/service.py's and rm/monitor.py's f-strings (before they use these
    constructors), so switching them over changes no byte the SKB receives."""
    from cod.protocol.prolog_text import atom, term

    assert task_fact(name, 12, "db") == f"task({atom(name)}, {12}, {atom('db')})"
    assert task_property_fact(name, "cpus", [1, 2]) == f"task_property({atom(name)}, cpus, {term([1, 2])})"
    assert task_fact(name, ANY, ANY) == f"task({atom(name)}, _, _)"
    assert task_property_fact(name, ANY, ANY) == f"task_property({atom(name)}, _, _)"
    assert other_task_fact(7, name, (0, 3)) == f"other_task({7}, {atom(name)}, {term(list((0, 3)))})"
    assert allocated_fact(name, 3) == f"allocated({atom(name)}, {3})"
    assert allocated_fact(name, ANY) == f"allocated({atom(name)}, _)"
    assert allocation_epoch_fact(9) == f"allocation_epoch({9})"
    assert cpu_load_fact(1, 55) == f"cpu_load({1}, {55})"
    assert numa_free_fact(0, 1 << 30) == f"numa_free({0}, {1 << 30})"
    assert task_cpu_use_fact(name, 120) == f"task_cpu_use({atom(name)}, {120})"
    assert task_numa_pages_fact(name, 1, 64) == f"task_numa_pages({atom(name)}, {1}, {64})"

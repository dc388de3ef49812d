"""The daemon's facts are written by one helper (rm/skbfacts.py), as they were by hand before."""

from __future__ import annotations

import pytest

from cod.rm import skbfacts as f


@pytest.mark.parametrize("made, text", [
    (f.fact("allocated", "db", 3), "allocated(db, 3)"),
    (f.fact("allocated", "Pg main", 3), "allocated('Pg main', 3)"),
    (f.fact("allocated", "it's", 0), "allocated('it\\'s', 0)"),
    (f.ALLOCATED, "allocated(_, _)"),
    (f.allocated_of("Zürich"), "allocated('Zürich', _)"),
    (f.allocation(7, {"b": (2,), "a": (0, 1)}), {"allocated(_, _)": ["allocated(a, 0)", "allocated(a, 1)",
                                                                      "allocated(b, 2)"],
                                                  "allocation_epoch(_)": ["allocation_epoch(7)"]}),
    (f.task("olap1", 42, "db"), "task(olap1, 42, db)"),
    (f.task_property("olap1", "min_cores", 2), "task_property(olap1, min_cores, 2)"),
    (f.task_property("olap1", "sensitive", True), "task_property(olap1, sensitive, true)"),
    (f.task_property("olap1", "max_cores", None), "task_property(olap1, max_cores, none)"),
    (f.task_properties_of("olap1"), "task_property(olap1, _, _)"),
    (f.task_of("A"), "task('A', _, _)"),
    (f.other_task(99, "post gres", (0, 3)), "other_task(99, 'post gres', [0, 3])"),
    (f.OTHER_TASKS, "other_task(_, _, _)"),
    (f.cpu_load(5, 87), "cpu_load(5, 87)"),
    (f.numa_free(1, 1 << 30), "numa_free(1, 1073741824)"),
    (f.task_cpu_use("x\ny", 50), "task_cpu_use('x\\ny', 50)"),
    (f.task_numa_pages("t", 0, 12), "task_numa_pages(t, 0, 12)"),
    (f.TASK_NUMA_PAGES, "task_numa_pages(_, _, _)"),
])
def test_each_fact_is_written_as_before(made, text):
    assert made == text

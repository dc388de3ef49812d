"""When the RM says a task's pages drift off its memory nodes (rm/memory_drift.py, pure)."""

from __future__ import annotations

import pytest

from cod.rm.memory_drift import DRIFT_MIN_PAGES, DriftWatch, drift_of

MIB = 256  # pages


@pytest.mark.parametrize("pages,nodes,off", [
    ({3: 100 * MIB}, [3], None),                          # all home
    ({3: 100 * MIB, 0: 4 * MIB}, [3], None),              # 3.8 %: under the share
    ({3: 100 * MIB, 0: 6 * MIB}, [3], {0: 6 * MIB}),      # 5.7 %
    ({3: 10, 0: DRIFT_MIN_PAGES - 1}, [3], None),         # most of it, but under 1 MiB: library pages
    ({0: 8 * MIB, 1: 8 * MIB, 3: MIB // 2}, [0, 1], None),  # two nodes: both are home
    ({0: 8 * MIB, 2: 2 * MIB, 3: 2 * MIB}, [0], {2: 2 * MIB, 3: 2 * MIB}),
    ({0: 8 * MIB}, [], None),                             # no nodes yet (no CPU): nothing to say
    ({}, [3], None),                                      # no pages measured
])
def test_drift_table(pages, nodes, off):
    d = drift_of("db", pages, nodes)
    assert (d.off if d else None) == off


def test_the_text_says_how_much_where_and_why():
    d = drift_of("db", {3: 90 * MIB, 0: 10 * MIB}, [3])
    assert d.text() == ("task db: 10% of its resident pages are off its memory nodes 3 (node 0: 10 MiB); automatic "
                        "NUMA balancing, memory it allocated elsewhere, or pages that could not be moved")


def test_the_watch_speaks_when_drift_starts_and_stops_only():
    w = DriftWatch()
    assert w.observe("db", {3: 100 * MIB}, [3]) is None
    kind, text = w.observe("db", {3: 80 * MIB, 0: 20 * MIB}, [3])
    assert kind == "drift" and "20%" in text
    assert w.observe("db", {3: 70 * MIB, 0: 30 * MIB}, [3]) is None  # still drifting: said once
    kind, text = w.observe("db", {3: 70 * MIB, 0: 30 * MIB}, [0, 1])  # moved: new nodes, said again
    assert kind == "drift" and "nodes 0,1" in text
    kind, text = w.observe("db", {0: 100 * MIB}, [0, 1])
    assert kind == "back" and text == "task db: its pages are back on its memory nodes 0,1"
    assert w.observe("db", {0: 100 * MIB}, [0, 1]) is None


def test_gone_tasks_are_forgotten():
    w = DriftWatch()
    w.observe("a", {0: 100 * MIB}, [3])
    w.observe("b", {0: 100 * MIB}, [3])
    w.forget(["b"])
    assert set(w.drifting) == {"b"}

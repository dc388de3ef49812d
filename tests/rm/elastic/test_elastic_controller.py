"""The elastic policy: a pure function (state, observation, limits) -> (state, decision)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cod.facts import machines
from cod.rm.elastic import controller as ctl
from cod.rm.elastic.controller import Limits, Observation
from cod.rm.elastic.errors import ElasticError
from cod.rm.elastic.facts import as_text, group_facts
from cod.rm.elastic.modes import Layout
from cod.rm.elastic.settings import ElasticSettings

PAPER = Layout.from_machine(machines.load("shanghai"))  # 4 nodes x 4 cores
DENSE = ElasticSettings(mode="dense")


def run(loads, settings=DENSE, limits=Limits(), layout=PAPER, pages=None):
    state, _ = ctl.start(layout, settings, limits, pages)
    out = []
    for i, u in enumerate(loads):
        state, decision = ctl.step(state, Observation(at=1000.0 + i, load=u, pages=pages), limits, layout, settings)
        out.append((decision.action, state.cpus))
    return state, out


# (case, loads, expected actions, CPU count after each period)
TABLE = [
    ("Fig. 7: up at 99 %, down at 8 %", [99, 99, 99, 40, 8, 8, 8],
     ["allocate"] * 3 + ["hold"] + ["release"] * 3, [2, 3, 4, 4, 3, 2, 1]),
    ("stable load holds", [40, 50, 60], ["hold"] * 3, [1, 1, 1]),
    ("idle at the floor holds", [0, 0], ["hold"] * 2, [1, 1]),
]


@pytest.mark.parametrize("case,loads,actions,counts", TABLE, ids=[t[0] for t in TABLE])
def test_sequences(case, loads, actions, counts):
    _, out = run(loads)
    assert [a for a, _ in out] == actions
    assert [len(c) for _, c in out] == counts


def test_start_gives_the_minimum_by_mode():
    state, decision = ctl.start(PAPER, ElasticSettings(mode="sparse", min_cores=3))
    assert state.cpus == (0, 4, 8) and decision.after == (0, 4, 8)
    assert state.marking == (1, 0, 0, 0, 3)


def test_cap_stops_growth_and_revokes_the_surplus():
    _, out = run([99] * 6, limits=Limits(cap=3))
    assert [len(c) for _, c in out] == [2, 3, 3, 3, 3, 3]
    state, _ = run([99] * 5)  # 6 CPUs without a cap
    state, d = ctl.step(state, Observation(2000.0, 99), Limits(cap=2), PAPER, DENSE)
    assert d.action == "revoke" and d.after == (0, 1) and d.evaluation is None
    assert state.marking[-1] == 2  # the net's Provision follows


def test_cpus_taken_by_the_global_allocation_are_dropped_and_replaced():
    state, _ = run([99, 99])  # holds 0, 1, 2
    limits = Limits(available=frozenset(PAPER.cpus) - {0, 1, 2})
    state, d = ctl.step(state, Observation(2000.0, 50), limits, PAPER, DENSE)
    assert d.action == "restore" and state.cpus == (3,)
    assert any("no longer available" in n for n in d.notes)


def test_max_cores_and_min_cores():
    _, out = run([99] * 5, settings=ElasticSettings(mode="dense", max_cores=2))
    assert [len(c) for _, c in out] == [2, 2, 2, 2, 2]
    _, out = run([0] * 3, settings=ElasticSettings(mode="dense", min_cores=2))
    assert [len(c) for _, c in out] == [2, 2, 2]


def test_cap_below_the_minimum_wins_but_never_below_one():
    b = ctl.bounds_for(16, ElasticSettings(min_cores=4), Limits(cap=2))
    assert (b.n_min, b.n_cap) == (2, 2)
    b = ctl.bounds_for(16, ElasticSettings(), Limits(cap=0))
    assert (b.n_min, b.n_cap) == (1, 1)


def test_adaptive_grows_where_the_pages_are():
    settings = ElasticSettings(mode="adaptive")
    _, out = run([99, 99, 99], settings=settings, pages={3: 1000, 1: 10})
    assert [c for _, c in out][-1] == (12, 13, 14, 15)


def test_firings_are_kept_for_inspection_and_bounded():
    state, _ = run([99, 40, 8], settings=ElasticSettings(mode="dense", history=4))
    assert [f.transition for f in state.firings] == ["t2", "t3", "t0", "t4"]
    assert state.firings[-1].at == 1002.0
    assert state.last.state == "Idle"


def test_no_cpu_available_is_an_error():
    with pytest.raises(ElasticError, match="no CPU is available"):
        ctl.start(PAPER, DENSE, Limits(available=frozenset()))


def test_facts_of_a_group():
    state, _ = run([99, 40])
    facts = group_facts("pg", ("cgroup", "/sys/fs/cgroup/pg"), DENSE, state, 40.0)
    text = as_text(facts)
    assert "elastic_group(pg, cgroup('/sys/fs/cgroup/pg'), dense, cpu_load).\n" in text
    assert "elastic_cores(pg, [0,1]).\n" in text
    assert "elastic_marking(pg, checks, 40).\n" in text and "elastic_marking(pg, provision, 2).\n" in text
    assert "elastic_marking(pg, idle, 0).\n" in text
    assert "elastic_state(pg, stable).\n" in text
    assert "elastic_transition(pg, t1, 1000.0).\n" in text and "elastic_transition(pg, t3, 1001.0).\n" in text
    assert "elastic_thresholds(pg, 10.0, 70.0).\n" in text
    assert "elastic_load(pg, 40.0).\n" in text
    assert all(p.startswith("elastic_") and "(pg," in p for p in facts)  # patterns name the group
    pid_facts = group_facts("My DB", ("pids", [12, 3]), DENSE, state, None)
    assert pid_facts["elastic_group('My DB', _, _, _)"] == ["elastic_group('My DB', pids([12,3]), dense, cpu_load)"]
    assert pid_facts["elastic_load('My DB', _)"] == []


@pytest.mark.parametrize("bad,match", [
    ({"th_min": 80, "th_max": 70}, "th_min < th_max"),
    ({"th_max": 120}, "th_max <= 100"),
    ({"mode": "random"}, "unknown elastic mode"),
    ({"metric": "ht_imc"}, "unknown elastic metric"),
    ({"min_cores": 0}, "min_cores"),
    ({"max_cores": 1, "min_cores": 2}, "below min_cores"),
    ({"period_s": 0}, "period_s"),
    ({"th_min": "ten"}, "must be a number"),
    ({"colour": "red"}, "unknown key"),
])
def test_settings_refuse_bad_values(bad, match):
    with pytest.raises(ElasticError, match=match):
        ElasticSettings.from_mapping(bad)


@settings(max_examples=200, deadline=None)
@given(loads=st.lists(st.floats(0, 400), min_size=1, max_size=40),
       caps=st.lists(st.one_of(st.none(), st.integers(0, 20)), min_size=1, max_size=40),
       mode=st.sampled_from(["dense", "sparse", "adaptive"]),
       max_cores=st.one_of(st.none(), st.integers(1, 16)))
def test_never_below_one_nor_above_any_limit(loads, caps, mode, max_cores):
    settings = ElasticSettings(mode=mode, max_cores=max_cores)
    state, _ = ctl.start(PAPER, settings)
    for i, u in enumerate(loads):
        cap = caps[i % len(caps)]
        limits = Limits(cap=cap)
        before = state.n
        state, d = ctl.step(state, Observation(float(i), u, {1: 5}), limits, PAPER, settings)
        upper = min(x for x in (16, max_cores, cap) if x is not None)
        assert 1 <= state.n <= max(1, upper)
        assert len(set(state.cpus)) == state.n  # no CPU twice
        if d.evaluation is not None:
            assert abs(state.n - before) <= 1  # one core per firing

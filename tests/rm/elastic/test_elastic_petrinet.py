"""The Petri net of Dominico et al. (ICDE 2018), table-driven from the paper's own examples."""

from __future__ import annotations

import pytest

from cod.rm.elastic import petrinet as pn
from cod.rm.elastic.errors import ElasticError
from cod.rm.elastic.petrinet import Bounds, Thresholds

PAPER = Thresholds(10, 70)  # th_min, th_max of Sections III-B and V


def column(matrix, t):
    return [row[t] for row in matrix]


# (case, u, n, n_total, fired, state, cores after) -- Figures 9, 10, 11 first.
CASES = [
    ("Fig. 9: u=99 % with 3 of 16 cores allocates one", 99, 3, 16, ("t1", "t5"), "Overload", 4),
    ("Fig. 10: u=8 % with 5 cores releases one", 8, 5, 16, ("t0", "t4"), "Idle", 4),
    ("Fig. 11: u=40 % stays", 40, 3, 16, ("t2", "t3"), "Stable", 3),
    ("Fig. 10's text: u=10 % (= th_min) releases", 10, 5, 16, ("t0", "t4"), "Idle", 4),
    ("u=70 % (= th_max) allocates", 70, 3, 16, ("t1", "t5"), "Overload", 4),
    ("u just above th_min stays", 11, 5, 16, ("t2", "t3"), "Stable", 5),
    ("u just below th_max stays", 69, 5, 16, ("t2", "t3"), "Stable", 5),
    ("overloaded with every core: t6 keeps 16", 100, 16, 16, ("t1", "t6"), "Overload", 16),
    ("idle with one core: t7 keeps the last", 0, 1, 16, ("t0", "t7"), "Idle", 1),
    ("idle load rounds to 1 token", 0.2, 2, 16, ("t0", "t4"), "Idle", 1),
    ("load above 100 % (demand) counts as 100", 250, 2, 4, ("t1", "t5"), "Overload", 3),
    ("Q6 of Fig. 7: overload at 99 % from one core", 99, 1, 16, ("t1", "t5"), "Overload", 2),
]


@pytest.mark.parametrize("case,u,n,total,fired,state,after", CASES, ids=[c[0] for c in CASES])
def test_one_evaluation(case, u, n, total, fired, state, after):
    ev = pn.evaluate(pn.initial_marking(n), u, PAPER, Bounds(n_min=1, n_cap=total))
    assert ev.fired == fired
    assert ev.state == state
    assert ev.after == (pn.load_tokens(u), 0, 0, 0, after)
    assert ev.delta == after - n


def test_fig9_incidence_of_the_overload_subnet():
    # A^T rows of Fig. 9 (Checks, Over, Provision): t1 = (-u, n, -n); t5 = (u, -n, n [+1 core]).
    u, n = 99, 3
    a = pn.incidence(u, n)
    t1, t5 = column(a, 1), column(a, 5)
    assert (t1[pn.CHECKS], t1[pn.OVERLOAD], t1[pn.PROVISION]) == (-u, n, -n)
    assert (t5[pn.CHECKS], t5[pn.OVERLOAD], t5[pn.PROVISION]) == (u, -n, n + 1)
    pre, post = pn.pre_matrix(u, n), pn.post_matrix(u, n)
    # Pre arcs {Checks-t1, Provision-t1, Overload-t5}; Post arcs {t1-Overload, t5-Checks, t5-Provision}.
    assert column(pre, 1) == [u, 0, 0, 0, n] and column(pre, 5) == [0, 0, 0, n, 0]
    assert column(post, 1) == [0, 0, 0, n, 0] and column(post, 5) == [u, 0, 0, 0, n + 1]
    # "Overload-t6 is not set in the Pre matrix": with cores left, t6 is not enabled.
    m = pn.fire(pn.initial_marking(n, u), 1, u, n)
    assert pn.enabled(m, u, n, PAPER, Bounds(1, 16)) == [5]


def test_fig10_incidence_of_the_idle_subnet():
    u, n = 8, 5
    a = pn.incidence(u, n)
    t0, t4 = column(a, 0), column(a, 4)
    assert (t0[pn.CHECKS], t0[pn.IDLE], t0[pn.PROVISION]) == (-u, n, -n)
    assert (t4[pn.CHECKS], t4[pn.IDLE], t4[pn.PROVISION]) == (u, -n, n - 1)
    m = pn.fire(pn.initial_marking(n, u), 0, u, n)
    assert pn.enabled(m, u, n, PAPER, Bounds(1, 16)) == [4]  # "Idle-t7 is not set"


def test_fig11_incidence_of_the_stable_subnet():
    u, n = 40, 3
    a = pn.incidence(u, n)
    assert (column(a, 2)[pn.CHECKS], column(a, 2)[pn.STABLE]) == (-u, u)
    assert (column(a, 3)[pn.CHECKS], column(a, 3)[pn.STABLE]) == (u, -u)
    assert column(a, 2)[pn.PROVISION] == column(a, 3)[pn.PROVISION] == 0  # no core moves


def test_matrices_are_5_by_8_and_a_is_post_minus_pre():
    for u, n in [(1, 1), (50, 7), (100, 384)]:
        pre, post, a = pn.pre_matrix(u, n), pn.post_matrix(u, n), pn.incidence(u, n)
        assert len(pre) == len(pn.PLACES) == 5 and all(len(r) == len(pn.TRANSITIONS) == 8 for r in pre)
        assert a == [[post[p][t] - pre[p][t] for t in range(8)] for p in range(5)]


@pytest.mark.parametrize("u", range(0, 101))
def test_exactly_one_path_for_every_load(u):
    # Guards of t0/t1/t2 partition the loads; every evaluation fires two transitions.
    for n, cap in [(1, 1), (1, 4), (2, 4), (4, 4)]:
        ev = pn.evaluate(pn.initial_marking(n), u, PAPER, Bounds(1, cap))
        assert len(ev.fired) == 2
        assert 1 <= ev.after[pn.PROVISION] <= cap


@pytest.mark.parametrize("n,n_min,n_cap,u,expected", [
    (3, 3, 8, 5, 3),    # the group's minimum holds (t7)
    (4, 3, 8, 5, 3),    # above it, release (t4)
    (4, 1, 4, 90, 4),   # external cap reached (t6)
    (3, 1, 4, 90, 4),   # below it, allocate (t5)
])
def test_bounds_hold(n, n_min, n_cap, u, expected):
    ev = pn.evaluate(pn.initial_marking(n), u, PAPER, Bounds(n_min, n_cap))
    assert ev.after[pn.PROVISION] == expected


def test_thresholds_are_settings():
    ev = pn.evaluate(pn.initial_marking(2), 40, Thresholds(50, 90), Bounds(1, 4))
    assert ev.fired == ("t0", "t4")
    ev = pn.evaluate(pn.initial_marking(2), 40, Thresholds(5, 30), Bounds(1, 4))
    assert ev.fired == ("t1", "t5")


def test_a_sequence_of_periods_follows_the_load():
    m, th, b = pn.initial_marking(1), PAPER, Bounds(1, 16)
    trace = []
    for u in [99, 95, 80, 60, 40, 8, 5, 3, 2]:
        ev = pn.evaluate(m, u, th, b)
        m = ev.after
        trace.append(m[pn.PROVISION])
    assert trace == [2, 3, 4, 4, 4, 3, 2, 1, 1]


def test_bad_input_is_refused():
    with pytest.raises(ElasticError, match="NaN"):
        pn.evaluate(pn.initial_marking(1), float("nan"), PAPER, Bounds(1, 2))
    with pytest.raises(ElasticError, match="at least one core"):
        pn.initial_marking(0)
    with pytest.raises(ElasticError, match="not at rest"):
        pn.evaluate((10, 2, 0, 0, 0), 50, PAPER, Bounds(1, 2))
    with pytest.raises(ElasticError, match="below th_max"):
        Thresholds(70, 10)

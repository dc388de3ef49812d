"""Properties of the phase-2 packings against their CP-SAT optimum (hypothesis)."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cod.rm.deploy import binpack

CAP = 1_000_000

sizes_st = st.lists(st.integers(min_value=1, max_value=CAP), min_size=1, max_size=14)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(sizes_st)
def test_ffd_within_doesa_bound_of_the_optimum(sizes):
    """Dósa (2007): FFD(I) <= 11/9 OPT(I) + 6/9, the bound the paper cites."""
    groups = [frozenset()] * len(sizes)
    ffd = binpack.first_fit_decreasing(sizes, CAP, groups)
    assert binpack.is_valid_packing(ffd, sizes, CAP, groups)
    exact = binpack.exact_min_bins(sizes, CAP, groups, ffd, time_limit_s=20)
    assert exact.status == "optimal"
    assert binpack.is_valid_packing(exact.bins, sizes, CAP, groups)
    assert binpack.lower_bound(sizes, CAP, groups) <= exact.count <= len(ffd)
    assert 9 * len(ffd) <= 11 * exact.count + 6


def brute_force(sizes, groups) -> int:
    n = len(sizes)
    best = n
    # Canonical assignments (restricted growth strings): each set partition once.
    def rec(i, assign, k):
        nonlocal best
        if k >= best:
            return
        if i == n:
            bins = [[j for j in range(n) if assign[j] == b] for b in range(k)]
            if binpack.is_valid_packing(bins, sizes, CAP, groups):
                best = k
            return
        for b in range(k + 1):
            assign.append(b)
            rec(i + 1, assign, max(k, b + 1))
            assign.pop()
    rec(0, [], 0)
    return best


@SETTINGS
@given(st.lists(st.tuples(st.integers(min_value=1, max_value=CAP), st.sampled_from([None, "p", "q"])),
                min_size=1, max_size=7))
def test_exact_with_siblings_matches_brute_force(items):
    sizes = [s for s, _ in items]
    groups = [frozenset([g]) if g else frozenset() for _, g in items]
    ffd = binpack.first_fit_decreasing(sizes, CAP, groups)
    assert binpack.is_valid_packing(ffd, sizes, CAP, groups)  # the sibling rule holds
    exact = binpack.exact_min_bins(sizes, CAP, groups, ffd, time_limit_s=20)
    assert exact.count == brute_force(sizes, groups)
    assert binpack.is_valid_packing(exact.bins, sizes, CAP, groups)


@SETTINGS
@given(st.lists(st.tuples(st.integers(min_value=1, max_value=CAP), st.sampled_from([None, "p"])),
                min_size=2, max_size=10))
def test_balance_never_adds_a_core_nor_raises_the_busiest(items):
    sizes = [s for s, _ in items]
    groups = [frozenset([g]) if g else frozenset() for _, g in items]
    ffd = binpack.first_fit_decreasing(sizes, CAP, groups)
    bal = binpack.balance(sizes, CAP, groups, ffd, time_limit_s=5)
    assert len(bal.bins) == len(ffd)
    assert binpack.is_valid_packing(bal.bins, sizes, CAP, groups)
    loads = [sum(sizes[i] for i in b) for b in bal.bins]
    assert max(loads) == bal.max_after <= bal.max_before
    assert sorted(itertools.chain.from_iterable(bal.bins)) == list(range(len(sizes)))

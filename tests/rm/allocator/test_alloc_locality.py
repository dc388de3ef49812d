"""SLS (cod.rm.allocator.locality): weak-locality tasks off the L3 domains of strong/moderate ones
when the machine has a choice; tables on the real allocator, properties on the pure split."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cod.facts.synthetic import Shape, build
from cod.rm.allocator import TaskSpec, TaskSpecError, allocate
from cod.rm.allocator.locality import sls_split
from cod.rm.allocator.topology import build_view

TWO_L3 = build(Shape("2xL3", packages=1, dies_per_package=2, cores_per_die=4, l3_bytes_per_die=8 << 20))
ONE_L3 = build(Shape("1xL3", packages=1, dies_per_package=1, cores_per_die=4, l3_bytes_per_die=8 << 20))
FOUR_L3 = build(Shape("4xL3", packages=2, dies_per_package=2, cores_per_die=2, l3_bytes_per_die=4 << 20))


def T(name, n, loc=None, **kw):
    return TaskSpec(name, min_cores=n, max_cores=n, locality=loc, **kw)


def domains_of(machine, cpus):
    view = build_view(machine)
    return {view.domain_of[c] for c in cpus}


CASES = [
    # description, machine, tasks, expected mode, pairs that must not share a domain
    ("hash and index join on two L3s are split", TWO_L3,
     [T("hash", 2, "strong"), T("index", 2, "weak")], "sls", [("hash", "index")]),
    ("moderate and weak split, neutral anywhere", TWO_L3,
     [T("hj", 3, "moderate"), T("scan", 3, "weak"), T("etl", 2)], "sls", [("hj", "scan")]),
    ("one L3 domain: no choice", ONE_L3,
     [T("hash", 2, "strong"), T("index", 2, "weak")], "co-located", []),
    ("weak too big for any side", TWO_L3,
     [T("hash", 2, "strong"), T("index", 6, "weak")], "co-located", []),
    ("same strength only: nothing to do", TWO_L3,
     [T("a", 4, "weak"), T("b", 4, "weak")], "none", []),
    ("four domains, two weak two strong", FOUR_L3,
     [T("s1", 2, "strong"), T("s2", 2, "moderate"), T("w1", 2, "weak"), T("w2", 2, "weak")], "sls",
     [("s1", "w1"), ("s1", "w2"), ("s2", "w1"), ("s2", "w2")]),
]


@pytest.mark.parametrize("desc,machine,tasks,mode,apart", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("solver", ["cpsat", "greedy", "naive"])
def test_sls_table(desc, machine, tasks, mode, apart, solver):
    res = allocate(machine, tasks, solver=solver, time_limit_s=2.0)
    assert res.status != "infeasible", res.reason
    cpus = {t.name: t.cores for t in res.tasks}
    if solver == "greedy" and res.cache_policy.startswith("SLS not possible"):
        return  # greedy is a heuristic (C5 a preference, no search): it may fail to split, and says so
    for a, b in apart:
        assert not domains_of(machine, cpus[a]) & domains_of(machine, cpus[b]), (a, b, cpus)
    assert res.cache_policy.startswith({"sls": "SLS:", "co-located": "SLS not possible", "none": ""}[mode])
    if mode != "none":
        assert "cache_policy" in res.to_dict()


def test_derived_locality_must_be_one_of_the_classes():
    from cod.rm.taskprops import derived_value

    assert derived_value("locality", "weak") == "weak"
    with pytest.raises(ValueError, match="locality must come out as one of strong, moderate, weak, not 'hot'"):
        derived_value("locality", "hot")
    with pytest.raises(ValueError):
        derived_value("locality", 3)


def test_locality_is_checked():
    with pytest.raises(TaskSpecError, match="locality: must be one of strong, moderate, weak"):
        TaskSpec("x", locality="hot")
    assert "locality" not in TaskSpec("x").to_dict() and TaskSpec("x", locality="weak").to_dict()["locality"] == "weak"


# ---- properties of the pure split over many random task sets (fast: no solver) ----
def brute_force_avoidable(sizes, weak, clean, neutral):
    total = sum(sizes)
    if weak + clean + neutral > total:
        return False
    return any(weak <= sum(sizes[i] for i in s) <= total - clean
               for r in range(len(sizes) + 1) for s in itertools.combinations(range(len(sizes)), r))



def random_task_set(rnd):
    """Domain sizes, weak and strong/moderate tasks' min_cores, neutral CPUs."""
    return ([rnd.randint(0, 16) for _ in range(rnd.randint(1, 6))],
            [rnd.randint(1, 8) for _ in range(rnd.randint(0, 4))],
            [rnd.randint(1, 8) for _ in range(rnd.randint(0, 4))], rnd.randint(0, 8))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**64))
def test_sls_split_is_exact(seed):
    """Over 10,000 random task sets (200 hypothesis-drawn seeds of 50 each, so a failure replays
    from its seed): SLS keeps weak and strong/moderate apart exactly when some split of the domains allows
    it, and its split really holds both sides."""
    rnd = random.Random(seed)
    for _ in range(50):
        sizes, weak, clean, neutral = random_task_set(rnd)
        w, c = sum(weak), sum(clean)
        split = sls_split(sizes, w, c, neutral)
        assert (split is not None) == brute_force_avoidable(sizes, w, c, neutral), (sizes, w, c, neutral)
        if split is not None:
            weak_side = sum(sizes[i] for i in split)
            assert w <= weak_side and c <= sum(sizes) - weak_side and len(set(split)) == len(split)


MACHINES = [TWO_L3, FOUR_L3, ONE_L3,
            build(Shape("3xL3", packages=1, dies_per_package=3, cores_per_die=3, l3_bytes_per_die=8 << 20))]


@settings(max_examples=150, deadline=None, derandomize=True)
@given(m=st.sampled_from(MACHINES),
       tasks=st.lists(st.tuples(st.integers(1, 4), st.sampled_from(["strong", "moderate", "weak", None])),
                      min_size=1, max_size=5))
def test_allocator_never_co_locates_when_avoidable(m, tasks):
    """The real allocator (cpsat): whenever a split exists, no weak task shares an L3 domain with a
    strong or moderate one; otherwise the plan says SLS was not possible."""
    specs = [T(f"t{i}", n, loc) for i, (n, loc) in enumerate(tasks)]
    res = allocate(m, specs, solver="cpsat", time_limit_s=2.0)
    sizes = [0] * build_view(m).n_domains
    for cpu in build_view(m).cpus:
        sizes[build_view(m).domain_of[cpu]] += 1
    w = sum(s.min_cores for s in specs if s.locality == "weak")
    c = sum(s.min_cores for s in specs if s.locality in ("strong", "moderate"))
    n = sum(s.min_cores for s in specs if s.locality is None)
    if res.status == "infeasible":
        assert w + c + n > sum(sizes)
        return
    cpus = {t.name: t.cores for t in res.tasks}
    if w and c and len(sizes) > 1 and brute_force_avoidable(sizes, w, c, n):
        for a in specs:
            for b in specs:
                if a.locality == "weak" and b.locality in ("strong", "moderate"):
                    assert not domains_of(m, cpus[a.name]) & domains_of(m, cpus[b.name]), (res.cache_policy, cpus)
    elif w and c:
        assert res.cache_policy.startswith("SLS not possible")

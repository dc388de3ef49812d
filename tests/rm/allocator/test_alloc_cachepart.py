"""MLS (cod.rm.allocator.cachepart): masks and groups, table-driven and over 10,000 random task sets
checked against the fake kernel's rules (tests/helpers/fake_resctrl.py)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from cod.rm.allocator.cachepart import CacheTask, Geometry, partition, weak_ways
from cod.rm.enforce.resctrl import GroupPlan, schemata_text
from cod.rm.enforce.resctrl_info import CacheResource, ResctrlInfo
from helpers import fake_resctrl as fk

MIB = 1 << 20
INTEL = Geometry(ways=20, min_cbm_bits=1, num_closids=16, domains=(0, 1), way_bytes=MIB)  # 20 MB L3


def ct(name, loc, ws_mib=0, doms=(0,)):
    return CacheTask(name, loc, ws_mib * MIB, frozenset(doms))


def test_hash_join_with_index_join_on_one_domain():
    p = partition(INTEL, [ct("hj", "moderate", 6), ct("ij", "weak")])
    g = {x.name: x for x in p.groups}
    assert bin(g["weak"].masks[0]).count("1") == 2          # 1/8 of 20 ways, rounded
    assert g["task_hj"].masks[0] == 0xfffff & ~0x3           # the rest: its 6 ways and the leftovers
    assert g["weak"].masks[1] == g["task_hj"].masks[1] == 0xfffff  # domain 1 is not mixed
    assert p.mixed == (0,) and p.text.startswith("MLS: weak-locality ij capped at 2 of 20 ways")


def test_strong_tasks_get_disjoint_ranges_sized_to_working_sets():
    p = partition(INTEL, [ct("a", "strong", 2), ct("b", "moderate", 8), ct("w", "weak")])
    g = {x.name: x.masks[0] for x in p.groups}
    assert g["weak"] == 0x3 and g["task_a"] == 0b1100 and g["task_b"] == 0xfffff & ~0xf


def test_budget_merges_strong_tasks_into_one_group():
    geo = Geometry(ways=20, min_cbm_bits=2, num_closids=4, domains=(0,), way_bytes=MIB)  # CDP halves 8 -> 4
    p = partition(geo, [ct(f"s{i}", "strong", 1) for i in range(4)] + [ct("w", "weak")])
    assert [g.name for g in p.groups] == ["weak", "clean"] and "CLOS budget is 3" in p.text


def test_no_mixing_no_partition():
    assert partition(INTEL, [ct("a", "strong"), ct("w", "weak", doms=(1,))]).groups == ()
    assert partition(INTEL, [ct("a", "weak"), ct("b", "weak")]).groups == ()
    tiny = Geometry(ways=3, min_cbm_bits=2, num_closids=16, domains=(0,))
    assert partition(tiny, [ct("a", "strong"), ct("w", "weak")]).text.startswith("MLS not possible")


def _spec_for(geo: Geometry, sparse: bool) -> fk.FakeSpec:
    return fk.FakeSpec(kind="random", cbm_len=geo.ways, min_cbm_bits=geo.min_cbm_bits,
                       num_closids=geo.num_closids, sparse=sparse, l3_domains=geo.domains)


def _info(geo: Geometry, cdp: bool) -> ResctrlInfo:
    names = ("L3CODE", "L3DATA") if cdp else ("L3",)
    return ResctrlInfo(caches={n: CacheResource(n, geo.ways, geo.min_cbm_bits, geo.num_closids, False, geo.domains)
                               for n in names})


def random_case(rnd: random.Random):
    n_dom = rnd.randint(1, 4)
    ways = rnd.randint(2, 20)
    geo = Geometry(ways=ways, min_cbm_bits=rnd.randint(0, 3), num_closids=rnd.choice([4, 8, 15, 16]),
                   domains=tuple(range(n_dom)), way_bytes=rnd.choice([0, MIB, 2 * MIB]))
    tasks = [CacheTask(f"t{i}", rnd.choice(["strong", "moderate", "weak", None]), rnd.randint(0, 40) * MIB,
                       frozenset(rnd.sample(range(n_dom), rnd.randint(1, n_dom)))) for i in range(rnd.randint(1, 24))]
    return geo, tasks


@settings(max_examples=200, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**64))
def test_every_partition_is_accepted_by_the_kernel_rules(seed):
    """10,000 random task sets (200 hypothesis seeds x 50): the backend's schemata text of a group
    passes the fake kernel's parser, every mask its cbm_validate (Intel: contiguous; AMD: sparse allowed), the groups fit the CLOS budget,
    and on a mixed domain the weak group is capped and disjoint from the strong/moderate ones."""
    rnd = random.Random(seed)
    for _ in range(50):
        geo, tasks = random_case(rnd)
        p = partition(geo, tasks)
        assert len(p.groups) <= geo.num_closids - 1
        if p.groups:  # the backend's own schemata text of one group through the fake's parser (with and
            cdp = rnd.random() < 0.5  # without CDP), then each distinct mask through cbm_validate
            spec = fk.FakeSpec(**{**_spec_for(geo, False).__dict__, "cdp": cdp})
            g = rnd.choice(p.groups)
            text = schemata_text(_info(geo, cdp), GroupPlan(g.name, g.masks))
            fk.apply_schemata(spec, fk.default_values(spec), text)
        for mask in {m for g in p.groups for m in g.masks.values()}:
            for sparse in (False, True):
                fk.check_cbm(_spec_for(geo, sparse), f"{mask:x}")  # raises Refused on a bad mask
        by = {g.name: g for g in p.groups}
        for d in p.mixed:
            weak = by["weak"].masks[d]
            assert bin(weak).count("1") == weak_ways(geo) < geo.ways
            for g in p.groups:
                if g.name != "weak":
                    assert not g.masks[d] & weak
        members = [t for g in p.groups for t in g.tasks]
        assert len(members) == len(set(members))

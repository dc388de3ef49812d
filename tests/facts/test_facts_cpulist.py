"""CPU set notations: Linux cpulists and masks, hwloc bitmaps."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cod.facts.cpulist import (
    format_cpulist,
    format_hwloc_bitmap,
    parse_cpulist,
    parse_cpumask,
    parse_hwloc_bitmap,
)


@pytest.mark.parametrize("text, cpus", [
    ("", ()),
    ("\n", ()),
    ("0", (0,)),
    ("0-3,8", (0, 1, 2, 3, 8)),
    ("0-3,8\n", (0, 1, 2, 3, 8)),
    ("8,0-1", (0, 1, 8)),
    ("0-7:2/4", (0, 1, 4, 5)),  # kernel stride form: first 2 of every 4
    ("1,1", (1,)),
])
def test_parse_cpulist(text, cpus):
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("text, complaint", [
    ("0-", "bad cpulist item"),
    ("a", "bad cpulist item"),
    ("3-1", "descending"),
    ("0,,1", "bad cpulist item"),
    ("0-7:5/4", "bad stride"),
    ("-1", "bad cpulist item"),
])
def test_parse_cpulist_rejects_garbage(text, complaint):
    with pytest.raises(ValueError, match=complaint):
        parse_cpulist(text)


@given(st.sets(st.integers(0, 1200), max_size=60))
def test_cpulist_round_trip(cpus):
    assert parse_cpulist(format_cpulist(cpus)) == tuple(sorted(cpus))


@pytest.mark.parametrize("text, cpus", [
    ("0000,0000003f", (0, 1, 2, 3, 4, 5)),
    ("00000000,00000001,00000000", (32,)),
    ("f", (0, 1, 2, 3)),
    ("80000000", (31,)),
    ("00000000", ()),
])
def test_parse_cpumask(text, cpus):
    assert parse_cpumask(text) == cpus


@pytest.mark.parametrize("text", ["", "0x3f", "xyz", "000000001", "0f,,0f"])
def test_parse_cpumask_rejects_garbage(text):
    with pytest.raises(ValueError):
        parse_cpumask(text)


@pytest.mark.parametrize("text, cpus, infinite", [
    ("0x0000000f", (0, 1, 2, 3), False),
    ("0x00000001,,,,,,0x00000001", (0, 192), False),   # empty words are zero
    ("0x00006000,,0x00040000", (18, 77, 78), False),
    ("0xf...f", (), True),                              # the full infinite set
    ("0xf...f,0x0000ffff", tuple(range(16)), True),     # plus every bit from 32 up
    ("0x0", (), False),
])
def test_parse_hwloc_bitmap(text, cpus, infinite):
    assert parse_hwloc_bitmap(text) == (cpus, infinite)


@pytest.mark.parametrize("text", ["", "0000000f", "0x", "0xg", "0x123456789", "0xf...f,zz"])
def test_parse_hwloc_bitmap_rejects_garbage(text):
    with pytest.raises(ValueError):
        parse_hwloc_bitmap(text)


@given(st.sets(st.integers(0, 700), max_size=40))
def test_hwloc_bitmap_round_trip(cpus):
    assert parse_hwloc_bitmap(format_hwloc_bitmap(cpus)) == (tuple(sorted(cpus)), False)

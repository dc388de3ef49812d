"""The page mover (rm/enforce/pagemove.py) and its numa_maps reader, on this machine's kernel.

Where pages really move (several nodes) is tested in the NUMA guests (tests/vm/test_memory.py);
here: the parser, move_pages in query mode on a real process, the batch sizing, the errors."""

from __future__ import annotations

import mmap
import os

import pytest

from cod.rm.enforce import EnforceError
from cod.rm.enforce.pagemove import (BUDGET_S, FIRST_BATCH, MAX_BATCH, MIN_BATCH, PageMover, move_pages,
                                     move_pages_number)
from cod.facts.procfs import NumaRange, numa_ranges, parse_numa_ranges
from helpers.procs import spawn, spinner_cmd  # noqa: F401 (fixtures)

MAPS = """\
55d0c0000000-55d0c0002000 r--p 00000000 08:01 123 /usr/bin/python3
7f0000000000-7f0000400000 rw-p 00000000 00:00 0
7f0000400000-7f0000600000 rw-p 00000000 00:00 0
7f1000000000-7f1040000000 rw-s 00000000 00:0f 99 /dev/hugepages/pool
"""
NUMA_MAPS = """\
55d0c0000000 default file=/usr/bin/python3 mapped=2 N0=2 kernelpagesize_kB=4
7f0000000000 default anon=1024 dirty=1024 N0=1000 N3=24 kernelpagesize_kB=4
7f0000400000 default
7f1000000000 bind:1 file=/dev/hugepages/pool huge dirty=3 N1=3 kernelpagesize_kB=2048
7f2000000000 default anon=5 dirty=5 N2=5 kernelpagesize_kB=4
"""


def test_numa_ranges_join_numa_maps_with_the_ends_from_maps():
    assert parse_numa_ranges(MAPS, NUMA_MAPS) == [
        NumaRange(0x55d0c0000000, 0x55d0c0002000, 4096, {0: 2}),
        NumaRange(0x7f0000000000, 0x7f0000400000, 4096, {0: 1000, 3: 24}),
        # nothing resident: left out; a huge page mapping keeps its page size
        NumaRange(0x7f1000000000, 0x7f1040000000, 2 << 20, {1: 3}),
        # 7f2000000000 is not in maps (unmapped between the two reads): left out
    ]


@pytest.mark.parametrize("nodes,off", [([0], 24), ([3], 1000), ([0, 3], 0), ([1], 1024)])
def test_pages_off_the_target_nodes(nodes, off):
    assert NumaRange(0, 1 << 22, 4096, {0: 1000, 3: 24}).pages_off(nodes) == off


def test_numa_ranges_of_a_real_process_hold_its_fresh_mapping():
    m = mmap.mmap(-1, 4 << 20)
    for off in range(0, 4 << 20, 4096):
        m[off] = 1
    import ctypes
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    (rng,) = [r for r in numa_ranges(os.getpid()) if r.start <= addr < r.end]
    assert sum(rng.pages.values()) >= 1024 and rng.page_size == 4096
    where = move_pages(os.getpid(), [addr, addr + 4096], None)  # query mode: where they are
    assert where is not None and all(n in rng.pages for n in where)



def test_a_gone_process_is_none_and_has_no_ranges(spawn):
    task = spawn(1, "sleep")
    pid = task.pid
    task.stop()
    assert move_pages(pid, [0x1000], None) is None
    assert numa_ranges(pid) == []
    assert PageMover().move(pid, [0]).moved == 0


def test_the_batch_follows_the_measured_cost():
    mover = PageMover(budget_s=0.02)
    assert mover._batch(4096) == FIRST_BATCH and BUDGET_S == 0.020
    mover._learn(0.040, 1000)  # twice the budget: aim at half of it
    assert mover._batch(4096) == 250
    assert mover._batch(2 << 20) == 1  # a 2 MiB page weighs 512 base pages
    mover._learn(0.001, 250)  # far under: at most double
    assert mover._batch(4096) == 500
    mover._learn(0.5, 500)  # a fixed cost over the budget: the smallest batch
    assert mover._batch(4096) == MIN_BATCH
    for _ in range(20):
        mover._learn(0.0, mover.batch)
    assert mover._batch(4096) == MAX_BATCH


@pytest.mark.parametrize("args,needle", [
    (dict(budget_s=0), "positive number of seconds"), (dict(budget_s=-1.0), "positive number of seconds"),
])
def test_a_bad_budget_is_refused(args, needle):
    with pytest.raises(EnforceError, match=needle):
        PageMover(**args)


def test_no_target_node_is_refused():
    with pytest.raises(EnforceError, match="at least one target node"):
        PageMover().move(os.getpid(), [])


def test_an_unknown_architecture_is_named():
    with pytest.raises(EnforceError, match="sparc.*move_pages"):
        move_pages_number("sparc")
    assert move_pages_number("x86_64") == 279

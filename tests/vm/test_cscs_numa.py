"""CSCS on a NUMA guest: each partition's memory is on its scan core's node, as the kernel says
(move_pages in query mode), when the table is generated and after a plan moves tuples between
nodes (copied into new chunks on the receiver's node).  The engine standalone (clients/cscs), one
scan core per node, one engine for the module: it generates its table in tens of seconds under TCG.

Partitions of distinct sizes per node (1, 3 chunks on 2 nodes; 1, 2, 4, 5 on 4) make a partition
put on another node's memory show as a wrong page count there, not only as a wrong node."""

from __future__ import annotations

import os
import subprocess
import threading
from collections import Counter

import pytest

from helpers import cscs_ref
from movepages import PAGE, bound_node, mappings, page_nodes
from numa import fmt

SLOW = 300.0  # seconds: generous under TCG, still a failure when nothing happens
pytestmark = pytest.mark.timeout(3 * SLOW)

CHUNK_TUPLES = 65536  # CSCS_CHUNK_TUPLES: a chunk's 48 columns, each a multiple of 64 bytes
CHUNK_PAGES = CHUNK_TUPLES * sum(w for _, w in cscs_ref.SCHEMA) // PAGE  # 5040: every page written


def sizes(nodes: int) -> tuple[int, list[int]]:
    """Chunks per partition before (even) and after the plan (distinct, same total)."""
    half = nodes // 2
    even = half + 1
    deltas = [*range(-half, 0), *range(1, half + 1)] if nodes % 2 == 0 else [*range(-half, half + 1)]
    return even, [even + d for d in deltas]


def plan_line(cpus: list[int], before: int, after: list[int]) -> str:
    """Giver i gives to taker n-1-i (the deltas are symmetric)."""
    parts = ",".join(f"{c}:{n * CHUNK_TUPLES}" for c, n in zip(cpus, after))
    moves = ",".join(f"{cpus[i]}>{cpus[-1 - i]}:{(before - n) * CHUNK_TUPLES}"
                     for i, n in enumerate(after) if n < before)
    return f"plan {parts} moves {moves}"


class Engine:
    """`cscs run` in the background; its stdout collected as it comes."""

    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._cv:
                self.lines.append(line)
                self._cv.notify_all()

    def wait_line(self, marker: str, count: int = 1) -> None:
        def seen() -> bool:
            return sum(marker in line for line in self.lines) >= count

        with self._cv:
            self._cv.wait_for(lambda: seen() or self.proc.poll() is not None, SLOW)
            assert seen(), f"no {marker!r} line (exit {self.proc.poll()}):\n{''.join(self.lines)}"


def pages_by_binding(pid: int) -> dict[int, Counter]:
    """For each node some mapping is bound to: where those mappings' present pages are."""
    out: dict[int, Counter] = {}
    for m in mappings(pid):
        node = bound_node(m)
        if node is not None:
            out.setdefault(node, Counter()).update(page_nodes(pid, m.start, m.end))
    return out


def check_partitions(pid: int, cpus: list[int], chunks: list[int], node_of) -> None:
    """Each scan core's partition (``chunks`` full chunks) is on the core's node, all present."""
    want = {node_of(c): Counter({node_of(c): n * CHUNK_PAGES}) for c, n in zip(cpus, chunks)}
    assert pages_by_binding(pid) == want


@pytest.fixture(scope="module")
def engine(topo, tmp_path_factory):
    binary = cscs_ref.build("cscs")
    tmp = tmp_path_factory.mktemp("cscs")
    fifo = tmp / "control"
    os.mkfifo(fifo)
    cpus = [topo.node_cpus(n)[0] for n in range(topo.nodes)]
    even, _ = sizes(topo.nodes)
    e = Engine([str(binary), "run", "--tuples", str(even * len(cpus) * CHUNK_TUPLES), "--cores", fmt(cpus),
                "--seconds", str(3 * SLOW), "--batch-queries", "8", "--batch-updates", "2", "--think-ms", "500",
                "--control", str(fifo)])
    try:
        with open(fifo, "w") as ctl:  # opens once the engine has opened its end
            e.wait_line("tput_req/s")  # the table exists: its first batch ran
            yield e, ctl, cpus
            ctl.write("stop\n")
            ctl.flush()
        assert e.proc.wait(SLOW) == 0, e.proc.stderr.read()
    finally:
        if e.proc.poll() is None:
            e.proc.kill()
        e.proc.wait()


def test_the_table_is_generated_on_each_scan_cores_node(topo, engine):
    e, _, cpus = engine
    assert "memory bound to each core's NUMA node" in "".join(e.lines)
    # The kernel's view of the scan threads: one pinned to each core.
    masks = [os.sched_getaffinity(int(t)) for t in os.listdir(f"/proc/{e.proc.pid}/task")]
    assert sorted(c for m in masks if len(m) == 1 for c in m) == cpus
    even, _ = sizes(topo.nodes)
    check_partitions(e.proc.pid, cpus, [even] * len(cpus), lambda c: c // topo.cpus_per_node)


def test_tuples_moved_to_another_node_are_copied_onto_it(topo, engine):
    e, ctl, cpus = engine
    even, after = sizes(topo.nodes)
    ctl.write(plan_line(cpus, even, after) + "\n")
    ctl.flush()
    e.wait_line("# reconfigure")
    out = "".join(e.lines)
    assert "refused" not in out and "(0 chunks handed over whole)" in out, out
    check_partitions(e.proc.pid, cpus, after, lambda c: c // topo.cpus_per_node)

"""`cod bandwidth`: a NUMA node's attainable memory bandwidth, measured with triad.c.

One run at a time: the triad's threads are pinned to one node's usable CPUs
(one per core by default) and its arrays bound to one node's memory.  With both
the same node the figure is the node's *local* bandwidth, the capacity phase 3
packs against; with every pair it is the node x node matrix (threads on node i
reading and writing node j's memory).
Array size follows STREAM's rule: each array at least four times the last-level
caches it could hit, and no smaller than 64 MiB; the three arrays take at most
half of the memory the kernel says is available (MemAvailable), so a machine
with little free memory gets smaller arrays (said, with what they cost in
accuracy), and one with less than 3 x 64 MiB to spare is refused.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from typing import Any

from cod.facts import procfs
from cod.facts.cpulist import format_cpulist
from cod.facts.model import Machine
from cod.rm.system_facts import memory_bandwidth_fact, numa_bandwidth_fact

from ..errors import DeployError
from .cbuild import build

MIB = 1 << 20
MIN_ARRAY_BYTES = 64 * MIB
# The triad's three arrays take at most this share of MemAvailable: the rest is left to the
# machine's other work (a measurement must not push the machine into swapping or the OOM killer).
MAX_AVAILABLE_SHARE = 0.5


@dataclass(frozen=True)
class Sizing:
    array_bytes: int
    wanted_bytes: int  # what STREAM's rule (or --size-mib) asked for
    available_bytes: int | None  # MemAvailable; None = unknown

    @property
    def shrunk(self) -> bool:
        return self.array_bytes < self.wanted_bytes

    def sentence(self) -> str:
        """``memory: 3 x 1200 MiB (3.5 GiB) of 22.1 GiB available (MemAvailable)``, and why smaller."""
        used = 3 * self.array_bytes
        text = f"memory: 3 x {self.array_bytes // MIB} MiB ({used / (1 << 30):.1f} GiB)"
        if self.available_bytes is not None:
            text += f" of {self.available_bytes / (1 << 30):.1f} GiB available (MemAvailable)"
        if self.shrunk:
            text += (f"; {self.wanted_bytes // MIB} MiB per array would take more than half of it, so the arrays "
                     f"are smaller than 4 x the last-level cache and the figure may be high")
        return text


def size_arrays(wanted: int, available: int | None, *, asked: bool = False) -> Sizing:
    """Bytes per array: ``wanted``, shrunk so the three arrays fit in MAX_AVAILABLE_SHARE of
    ``available`` (never below MIN_ARRAY_BYTES).  Refused (DeployError) when even that does not fit,
    or when a size the user ``asked`` for does not."""
    if available is None:
        return Sizing(wanted, wanted, None)
    room = int(available * MAX_AVAILABLE_SHARE) // 3
    gib = available / (1 << 30)
    if asked and wanted > room:
        raise DeployError(f"--size-mib {wanted // MIB}: 3 arrays of {wanted // MIB} MiB need more than half of the "
                          f"{gib:.1f} GiB available (MemAvailable); at most {room // MIB} MiB per array")
    if room < MIN_ARRAY_BYTES:
        raise DeployError(f"too little free memory to measure: {gib:.2f} GiB available (MemAvailable), and the "
                          f"triad needs 3 x {MIN_ARRAY_BYTES // MIB} MiB in at most half of it")
    return Sizing(min(wanted, room - room % MIB), wanted, available)


def mem_available(meminfo: str = "/proc/meminfo") -> int | None:
    """MemAvailable in bytes, None when the kernel does not say (before Linux 3.14) or it is unreadable."""
    return procfs.meminfo(meminfo).get("MemAvailable")


@dataclass(frozen=True)
class NodeRun:
    node: int
    cpus: tuple[int, ...]  # the CPUs the threads are pinned to
    threads: int
    elements: int
    bind_memory: bool
    memory_node: int | None = None  # the node the arrays are bound to; None: ``node`` itself

    @property
    def mem_node(self) -> int:
        return self.node if self.memory_node is None else self.memory_node


def plan_run(machine: Machine, node: int, *, threads: int | None = None, array_bytes: int | None = None,
             usable: set[int] | None = None, memory_node: int | None = None) -> NodeRun:
    """What to run for ``node``: its usable CPUs (first thread of each core), array size
    (``array_bytes``, else :func:`default_array_bytes`), the arrays on ``memory_node``'s memory
    (default: ``node``'s)."""
    nodes = {n.id: n for n in machine.numa_nodes}
    for which in (node, memory_node):
        if nodes and which is not None and which not in nodes:
            raise DeployError(f"{machine.name} has no NUMA node {which} (nodes: {sorted(nodes)})")
    usable = set(machine.cpu_ids()) if usable is None else usable
    in_node = set(nodes[node].cpus) if nodes else set(machine.cpu_ids())
    cpus = sorted({min(p for p in c.pus if p in usable & in_node)
                   for c in machine.cores if set(c.pus) & usable & in_node})
    if not cpus:
        raise DeployError(f"NUMA node {node} of {machine.name} has no CPU this process may use")
    n_threads = threads or len(cpus)
    if n_threads < 1:
        raise DeployError(f"threads: must be >= 1, got {threads}")
    if array_bytes is None:
        array_bytes = default_array_bytes(machine, node)
    elements = max(n_threads, array_bytes // 8)
    return NodeRun(node, tuple(cpus), n_threads, elements, bind_memory=len(nodes) > 1, memory_node=memory_node)


def default_array_bytes(machine: Machine, node: int) -> int:
    """STREAM's rule: four times the last-level caches of the node, at least MIN_ARRAY_BYTES."""
    nodes = {n.id: n for n in machine.numa_nodes}
    in_node = set(nodes[node].cpus) if node in nodes else set(machine.cpu_ids())
    llc = sum(c.size_bytes or 0 for c in machine.caches
              if c.level == max((x.level for x in machine.caches), default=0) and set(c.cpus) & in_node)
    return max(MIN_ARRAY_BYTES, 4 * llc)


def measure_node(run: NodeRun, iterations: int = 10) -> dict[str, Any]:
    """Run the triad for one node; its JSON result."""
    exe = build("triad.c")
    argv = [str(exe), format_cpulist(run.cpus), str(run.mem_node if run.bind_memory else -1),
            str(run.threads), str(run.elements), str(iterations)]
    where = f"node {run.node}" if run.mem_node == run.node else f"node {run.node}'s CPUs, node {run.mem_node}'s memory"
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise DeployError(f"triad on {where} failed: {proc.stderr.strip() or proc.returncode}")
    result = json.loads(proc.stdout)
    if not result.get("checked"):
        raise DeployError(f"triad on {where}: the result did not check")
    result["node"] = run.node
    result["memory_node"] = run.mem_node
    result["memory_bound_to_node"] = run.bind_memory
    return result


def fact(node: int, bytes_per_s: float) -> str:
    """The ``numa_bandwidth/2`` fact of a node's local figure."""
    return str(numa_bandwidth_fact(node, int(bytes_per_s)))


def matrix_fact(result: dict[str, Any]) -> str:
    """The ``memory_bandwidth/3`` fact of one run (:func:`measure_node`'s result)."""
    return str(memory_bandwidth_fact(result["node"], result["memory_node"], int(result["bandwidth_bytes_per_s"])))

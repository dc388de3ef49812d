"""`cod bandwidth`: a NUMA node's attainable memory bandwidth, measured with triad.c.

One node at a time: the triad's threads are pinned to the node's usable CPUs
(one per core by default) and its arrays bound to the node's memory, so the
figure is the node's *local* bandwidth, the capacity phase 3 packs against.
Array size follows STREAM's rule: each array at least four times the last-level
caches it could hit, and no smaller than 64 MiB.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from typing import Any

from cod.facts.cpulist import format_cpulist
from cod.facts.model import Machine

from ..errors import DeployError
from .cbuild import build

MIB = 1 << 20
MIN_ARRAY_BYTES = 64 * MIB


@dataclass(frozen=True)
class NodeRun:
    node: int
    cpus: tuple[int, ...]  # the CPUs the threads are pinned to
    threads: int
    elements: int
    bind_memory: bool


def plan_run(machine: Machine, node: int, *, threads: int | None = None,
             array_bytes: int | None = None, usable: set[int] | None = None) -> NodeRun:
    """What to run for ``node``: its usable CPUs (first thread of each core), array size."""
    nodes = {n.id: n for n in machine.numa_nodes}
    if nodes and node not in nodes:
        raise DeployError(f"{machine.name} has no NUMA node {node} (nodes: {sorted(nodes)})")
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
        llc = sum(c.size_bytes or 0 for c in machine.caches
                  if c.level == max((x.level for x in machine.caches), default=0) and set(c.cpus) & in_node)
        array_bytes = max(MIN_ARRAY_BYTES, 4 * llc)
    elements = max(n_threads, array_bytes // 8)
    return NodeRun(node, tuple(cpus), n_threads, elements, bind_memory=len(nodes) > 1)


def measure_node(run: NodeRun, iterations: int = 10) -> dict[str, Any]:
    """Run the triad for one node; its JSON result."""
    exe = build("triad.c")
    argv = [str(exe), format_cpulist(run.cpus), str(run.node if run.bind_memory else -1),
            str(run.threads), str(run.elements), str(iterations)]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise DeployError(f"triad on node {run.node} failed: {proc.stderr.strip() or proc.returncode}")
    result = json.loads(proc.stdout)
    if not result.get("checked"):
        raise DeployError(f"triad on node {run.node}: the result did not check")
    result["node"] = run.node
    result["memory_bound_to_node"] = run.bind_memory
    return result


def fact(node: int, bytes_per_s: float) -> str:
    return f"numa_bandwidth({node}, {int(bytes_per_s)})"

"""The facts the daemon writes into the SKB's system module, one constructor per predicate.

The schema is docs/skb-schema.md; the text is written by the one writer,
:mod:`cod.protocol.prolog_text`, so a name or a command name is always one
quoted atom.  Facts carry no final full stop (the SKB driver sends them as
strings).  Every argument may be :data:`ANY` (``_``), so the same constructor
gives the pattern that removes or replaces the facts: ``allocated_fact(name,
ANY)`` is every ``allocated/2`` fact of ``name``, ``allocated_fact(ANY, ANY)``
all of them.  The layout (a space after each comma) is the one the daemon has
always written.

Machine facts are :mod:`cod.facts.prolog`; an elastic group's facts
:mod:`cod.rm.elastic.facts`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cod.protocol.prolog_text import ANY, Written, compound

__all__ = [
    "ANY", "allocated_fact", "allocation_epoch_fact", "allocation_facts", "cpu_load_fact", "memory_bandwidth_fact", "numa_bandwidth_fact",
    "numa_free_fact", "other_task_fact",
    "task_cpu_use_fact", "task_fact", "task_facts", "task_numa_pages_fact", "task_property_fact",
    "cache_partition_fact", "cache_group_task_fact", "cache_occupancy_fact", "cache_mbm_total_fact",
    "cache_policy_fact",
]

Int = int | Written  # a number, or ANY in a pattern


def task_fact(name: str, pid: Int, app: str) -> Written:
    """``task(Name, Pid, App)``: a registered task, its main process and its application."""
    return compound("task", name, pid, app)


def task_property_fact(name: str, key: str, value: Any) -> Written:
    """``task_property(Name, Key, Value)``: one property of a task's spec (lists as ``[a, b]``)."""
    return compound("task_property", name, key, value)


def task_facts(name: str, pid: int, app: str, properties: Mapping[str, Any]) -> list[Written]:
    """``task/3`` and a ``task_property/3`` per property (sorted by key; ``name`` is not one)."""
    return [task_fact(name, pid, app)] + [task_property_fact(name, key, value)
                                          for key, value in sorted(properties.items()) if key != "name"]


def other_task_fact(pid: Int, comm: str, cpus: Iterable[int] | Written) -> Written:
    """``other_task(Pid, Comm, CpuList)``: a busy process nobody registered, and the CPUs kept for it."""
    return compound("other_task", pid, comm, cpus if isinstance(cpus, Written) else list(cpus))


def allocated_fact(name: str, cpu: Int) -> Written:
    """``allocated(Name, Cpu)``: task or elastic group ``Name`` holds ``Cpu`` in the current epoch."""
    return compound("allocated", name, cpu)


def allocation_epoch_fact(epoch: Int) -> Written:
    """``allocation_epoch(Epoch)``: the epoch the ``allocated/2`` facts describe."""
    return compound("allocation_epoch", epoch)


def allocation_facts(epoch: int, holdings: Mapping[str, Iterable[int]]) -> dict[str, list[Written]]:
    """Every holding's ``allocated/2`` and the ``allocation_epoch/1``: one replacement of both."""
    return {allocated_fact(ANY, ANY): [allocated_fact(n, c) for n, cores in sorted(holdings.items()) for c in cores],
            allocation_epoch_fact(ANY): [allocation_epoch_fact(epoch)]}


def cpu_load_fact(cpu: Int, percent: Int) -> Written:
    """``cpu_load(Cpu, Percent)``: the CPU's recent load, 0..100."""
    return compound("cpu_load", cpu, percent)


def numa_free_fact(node: Int, free_bytes: Int) -> Written:
    """``numa_free(Node, Bytes)``: free memory on a NUMA node (the daemon rounds it to the MiB)."""
    return compound("numa_free", node, free_bytes)


def numa_bandwidth_fact(node: Int, bytes_per_s: Int) -> Written:
    """``numa_bandwidth(Node, BytesPerS)``: a node's attainable local bandwidth (`cod bandwidth`'s triad)."""
    return compound("numa_bandwidth", node, bytes_per_s)


def memory_bandwidth_fact(cpu_node: Int, memory_node: Int, bytes_per_s: Int) -> Written:
    """``memory_bandwidth(CpuNode, MemoryNode, BytesPerS)``: the triad's bandwidth with its threads on
    ``CpuNode``'s CPUs and its arrays on ``MemoryNode``'s memory (`cod bandwidth`'s node x node matrix)."""
    return compound("memory_bandwidth", cpu_node, memory_node, bytes_per_s)


def task_cpu_use_fact(name: str, percent: Int) -> Written:
    """``task_cpu_use(Name, Percent)``: the CPU a task's threads used recently, in percent of one CPU."""
    return compound("task_cpu_use", name, percent)


def task_numa_pages_fact(name: str, node: Int, pages: Int) -> Written:
    """``task_numa_pages(Name, Node, Pages)``: a task's resident pages on a NUMA node."""
    return compound("task_numa_pages", name, node, pages)


def cache_partition_fact(group: str | Written, domain: Int, mask: Int) -> Written:
    """``cache_partition(Group, Domain, Mask)``: a resctrl group's L3 way mask (an integer) on an L3 domain."""
    return compound("cache_partition", group, domain, mask)


def cache_group_task_fact(group: str | Written, task: str | Written) -> Written:
    """``cache_group_task(Group, Task)``: a task whose threads are in the resctrl group."""
    return compound("cache_group_task", group, task)


def cache_occupancy_fact(group: str | Written, domain: Int, nbytes: Int) -> Written:
    """``cache_occupancy(Group, Domain, Bytes)``: the group's ``llc_occupancy`` on an L3 domain."""
    return compound("cache_occupancy", group, domain, nbytes)


def cache_mbm_total_fact(group: str | Written, domain: Int, nbytes: Int) -> Written:
    """``cache_mbm_total(Group, Domain, Bytes)``: the group's ``mbm_total_bytes`` counter on an L3 domain."""
    return compound("cache_mbm_total", group, domain, nbytes)


def cache_policy_fact(text: str | Written) -> Written:
    """``cache_policy(Text)``: what the cache partitioning (MLS) did, and why."""
    return compound("cache_policy", text)

"""Why a task holds the CPUs it holds: the allocator's ``binding`` with its evidence.

The allocator names what limited each task (cod.rm.allocator.explain:
``"min"``, ``"max"``, ``"machine size"``, ``"exclusive neighbour T"``,
``"SMT sibling of T"``, ``"SMT sibling held by T"``, ``"memory of node N"``,
``"cache polluter T"``, ``"cache-sensitive T"``, ``"unavailable CPUs"``,
``"reserved for other.PID"``).
:func:`constraints` turns each into a record a program can read (the
``explain_task`` method, docs/protocol.md): its kind, the other task and its
CPUs, the node's memory and what the task needs there, the CPUs kept for
unregistered work.  Pure: the daemon's state in, the records out.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from cod.facts.cpulist import format_cpulist
from cod.facts.model import Machine

from .allocator.model import TaskSpec

_OTHER_TASK = re.compile(r"(exclusive neighbour|SMT sibling of|SMT sibling held by|cache polluter|cache-sensitive) (.+)")
_MEMORY = re.compile(r"memory of node (-?\d+)")
_RESERVED = re.compile(r"reserved for (other\.(\d+))")
_KIND = {"exclusive neighbour": "exclusive", "SMT sibling of": "smt_sibling", "SMT sibling held by": "smt_held",
         "cache polluter": "cache_polluter", "cache-sensitive": "cache_sensitive"}
_SIMPLE = {"min": "min_cores", "max": "max_cores", "machine size": "machine_size", "unavailable CPUs": "unavailable"}


def constraints(name: str, binding: Sequence[str], specs: Mapping[str, TaskSpec],
                cores: Mapping[str, Sequence[int]], unavailable: Sequence[int], machine: Machine,
                reservations: Mapping[str, Sequence[int]] | None = None) -> list[dict[str, Any]]:
    """One record per entry of task ``name``'s binding list (unknown entries keep kind "other")."""
    spec = specs[name]
    held = list(cores.get(name, ()))
    out: list[dict[str, Any]] = []
    for item in binding:
        rec: dict[str, Any] = {"binding": item}
        if item in _SIMPLE:
            rec["kind"] = _SIMPLE[item]
            if item == "min":
                rec.update(min_cores=spec.min_cores, held=len(held),
                           text=f"holds exactly its min_cores ({spec.min_cores})")
            elif item == "max":
                rec.update(max_cores=spec.max_cores, held=len(held),
                           text=f"holds its max_cores ({spec.max_cores})")
            elif item == "machine size":
                rec.update(cpus=len(machine.cpu_ids()), text="holds every CPU it could use on this machine")
            else:
                rec.update(cpus=list(unavailable),
                           text=f"CPUs {_cpus(unavailable)} are kept for busy processes no task registered")
        elif m := _OTHER_TASK.fullmatch(item):
            other = m.group(2)
            theirs = list(cores.get(other, ()))
            rec.update(kind=_KIND[m.group(1)], task=other, cpus=theirs,
                       text=f"{m.group(1)} {other} (CPUs {_cpus(theirs)})")
        elif m := _RESERVED.fullmatch(item):
            kept = list((reservations or {}).get(m.group(1), ()))
            rec.update(kind="reserved", pid=int(m.group(2)), cpus=kept,
                       text=f"CPUs {_cpus(kept)} are kept for unregistered busy process {m.group(2)}")
        elif m := _MEMORY.fullmatch(item):
            node = int(m.group(1))
            free = _node_bytes(machine, node)
            on_node = _cpus_of_node(machine, node)
            needed = sum(specs[t].working_set_bytes * sum(1 for c in cs if c in on_node)
                         for t, cs in cores.items() if t in specs)
            rec.update(kind="memory", node=node, free_bytes=free, needed_bytes=needed,
                       working_set_bytes=spec.working_set_bytes,
                       text=f"node {node} holds {needed} of {free} bytes of working sets; "
                            f"another {spec.working_set_bytes} does not fit")
        else:
            rec.update(kind="other", text=item)
        out.append(rec)
    return out


def _cpus(cpus: Sequence[int]) -> str:
    return format_cpulist(sorted(cpus)) if cpus else "none"


def _node_bytes(machine: Machine, node: int) -> int | None:
    for nd in machine.numa_nodes:
        if nd.id == node:
            return nd.free_bytes if nd.free_bytes is not None else nd.memory_bytes
    return None


def _cpus_of_node(machine: Machine, node: int) -> set[int]:
    return {p.id for p in machine.pus if p.numa_node == node}

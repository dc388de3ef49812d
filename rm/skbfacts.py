"""Constructors of the facts the daemon writes into the SKB, and of the patterns that replace them.

One helper, :func:`fact`, writes every one of them through the one writer
of Prolog text (:mod:`cod.protocol.prolog_text`): names as atoms (quoted when
they need it), numbers as numbers, lists of CPUs as lists; :data:`ANY` is the
anonymous variable of a pattern.  docs/skb-schema.md says what each means.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from cod.protocol.prolog_text import term


class _Any:
    def __repr__(self) -> str:
        return "ANY"


ANY: Any = _Any()  # ``_`` in a pattern


def fact(functor: str, *args: Any) -> str:
    """``functor(Arg, ...)`` with each argument written by :func:`cod.protocol.prolog_text.term`."""
    return f"{functor}({', '.join('_' if a is ANY else term(a) for a in args)})"


# ---- the allocation (cod.rm.publisher) ------------------------------------------------------------
ALLOCATED = fact("allocated", ANY, ANY)
ALLOCATION_EPOCH = fact("allocation_epoch", ANY)


def allocation(epoch: int | None, holdings: Mapping[str, Iterable[int]]) -> dict[str, list[str]]:
    """``allocated/2`` of every holding and ``allocation_epoch/1``: one replacement."""
    return {ALLOCATED: [fact("allocated", n, c) for n, cores in sorted(holdings.items()) for c in cores],
            ALLOCATION_EPOCH: [fact("allocation_epoch", epoch)]}


def allocated_of(name: str) -> str:
    return fact("allocated", name, ANY)


# ---- tasks (cod.rm.admission) ----------------------------------------------------------------------
def task(name: str, pid: int, app: str) -> str:
    return fact("task", name, pid, app)


def task_property(name: str, key: str, value: Any) -> str:
    return fact("task_property", name, key, value)


def task_of(name: str) -> str:
    return fact("task", name, ANY, ANY)


def task_properties_of(name: str) -> str:
    return fact("task_property", name, ANY, ANY)


# ---- unregistered busy processes (cod.rm.demands) --------------------------------------------------
OTHER_TASKS = fact("other_task", ANY, ANY, ANY)


def other_task(pid: int, comm: str, cpus: Iterable[int]) -> str:
    return fact("other_task", pid, comm, list(cpus))


# ---- the live state (cod.rm.monitor) ----------------------------------------------------------------
CPU_LOAD = fact("cpu_load", ANY, ANY)
NUMA_FREE = fact("numa_free", ANY, ANY)
TASK_CPU_USE = fact("task_cpu_use", ANY, ANY)
TASK_NUMA_PAGES = fact("task_numa_pages", ANY, ANY, ANY)


def cpu_load(cpu: int, percent: int) -> str:
    return fact("cpu_load", cpu, percent)


def numa_free(node: int, free_bytes: int) -> str:
    return fact("numa_free", node, free_bytes)


def task_cpu_use(name: str, percent: int) -> str:
    return fact("task_cpu_use", name, percent)


def task_numa_pages(name: str, node: int, pages: int) -> str:
    return fact("task_numa_pages", name, node, pages)

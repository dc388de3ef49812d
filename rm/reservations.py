"""CPUs kept for unregistered busy processes (``other_task/3``): one home for that policy.

The busy detector (cod.rm.enforce.busy) says which processes nobody
registered keep CPUs busy; what to do about them is decided here:

* each is given as many CPUs as the cores it uses (at least one):
  :func:`reserve_cpus`, preferring CPUs that are free, keeping what it had;
* the allocator receives them as ``unavailable``, capped at what the
  tasks' ``min_cores`` leave (hungriest first): :func:`unavailable`, so a hog
  can squeeze tasks down to their minimum but never make the plan
  infeasible, and admission still counts only the tasks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping


@dataclass(frozen=True)
class OtherTask:
    """An unregistered process that keeps CPUs busy, as the SKB's other_task(Pid, Comm, Cpus)."""

    pid: int
    comm: str
    cpu: float  # cores it used over the detection window
    cpus: tuple[int, ...]  # the CPUs kept for it


def other_task_name(pid: int) -> str:
    """Its name in the enforcer (confinement is recorded and undone like any task's)."""
    return f"other.{pid}"


def printable(comm: str) -> str:
    """A process name as it may be shown and stored: control characters replaced."""
    return "".join(c if c.isprintable() else "?" for c in comm) or "?"


def reserve_cpus(need: int, allowed: Iterable[int], held_by_tasks: Iterable[int], taken: Iterable[int],
                 all_cpus: list[int], *, movable: bool) -> tuple[int, ...]:
    """CPUs to keep for a newcomer that uses ``need`` cores and may run on ``allowed``.

    When the RM will confine it (``movable``), registered tasks stay where they
    are: CPUs no task holds come first (within its affinity, then anywhere),
    then CPUs of tasks.  When it will not be moved, only the CPUs it can run on
    are of any use to it, so those come first.  Either way a CPU already kept
    for another busy process comes last."""
    need = max(1, min(len(all_cpus), need))
    allowed_set = set(allowed)
    tasks = set(held_by_tasks)
    taken_set = set(taken)
    if movable:
        ranked = sorted(all_cpus, key=lambda c: (c in taken_set, c in tasks, c not in allowed_set, c))
    else:
        ranked = sorted(all_cpus, key=lambda c: (c not in allowed_set, c in taken_set, c in tasks, c))
    return tuple(sorted(ranked[:need]))


def unavailable(others: Mapping[int, OtherTask], min_cores_total: int, n_cpus: int) -> tuple[int, ...]:
    """CPUs the allocator must leave free, at most what the tasks' ``min_cores`` leave over."""
    room = n_cpus - min_cores_total
    out: list[int] = []
    for other in sorted(others.values(), key=lambda o: (-o.cpu, o.pid)):
        for cpu in other.cpus:
            if len(out) >= room:
                return tuple(sorted(out))
            if cpu not in out:
                out.append(cpu)
    return tuple(sorted(out))

"""Unregistered busy processes (``other_task/3``), as the daemon records them.

The busy detector (cod.rm.enforce.busy) says which processes nobody
registered keep CPUs busy; the allocator decides where each goes with the same
objective as every task (cod.rm.allocator, ``OtherDemand``; issue 18):
registered tasks stay where they are, a newcomer gets free CPUs first, then
those of the task that loses least, and is confined there.  This module holds
the record and turns it into the allocator's demand.
"""

from __future__ import annotations

from dataclasses import dataclass

from .allocator import OtherDemand


@dataclass(frozen=True)
class OtherTask:
    """An unregistered process that keeps CPUs busy, as the SKB's other_task(Pid, Comm, Cpus)."""

    pid: int
    comm: str
    cpu: float  # cores it used over the detection window
    cpus: tuple[int, ...]  # the CPUs kept for it (before the first plan: where it runs)
    allowed: tuple[int, ...] | None = None  # where it may be put; None: anywhere (the RM confines it)

    def demand(self) -> OtherDemand:
        return OtherDemand(other_task_name(self.pid), max(1, round(self.cpu)), self.cpus, self.allowed)


def other_task_name(pid: int) -> str:
    """Its name in the allocator and the enforcer (confinement is recorded and undone like any task's)."""
    return f"other.{pid}"


def other_pid(name: str) -> int | None:
    """The pid of an :func:`other_task_name`, None for a task's name."""
    prefix, _, pid = name.partition(".")
    return int(pid) if prefix == "other" and pid.isdigit() else None


def printable(comm: str) -> str:
    """A process name as it may be shown and stored: control characters replaced."""
    return "".join(c if c.isprintable() else "?" for c in comm) or "?"

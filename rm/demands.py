"""What the allocator plans beside the registered tasks: elastic groups and unregistered busy processes.

* An **elastic group** (:mod:`.elastic_groups` drives it) is a :class:`Demand`:
  one more task for the allocator, in the epochs and publications, but with
  no client to tell or wait for (a CPU the plan takes from it is given back at
  once).
* A **busy process** nobody registered is an :class:`~.busy.OtherTask`: the
  monitor finds it (:mod:`.busy` decides which), the allocator keeps CPUs for
  it (``OtherDemand``), and the SKB's ``other_task/3`` says where.  Every write
  of ``other_task/3`` goes through the publisher, so it is ordered with the
  allocation it describes (in the same transaction when a plan moves it).

This module holds both records and what they give the allocator; it decides
nothing about admission (:mod:`.admission`) or detection (:mod:`.busy`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Mapping, Protocol

from .allocator import OtherDemand
from .allocator.model import TaskSpec
from .busy import OtherTask
from .names import other_pid, other_task_name
from .epochs import Publication
from .allocator_runner import Plan
from .system_facts import ANY, other_task_fact

log = logging.getLogger("cod.rm")



class Demand(Protocol):
    """A process group the daemon drives itself (an elastic group, rm/elastic_groups.py)."""

    name: str

    @property
    def spec(self) -> TaskSpec: ...
    def preferred(self) -> tuple[int, ...]: ...  # the CPUs it holds or wants: its current placement
    def pin(self, cpus: tuple[int, ...]) -> None: ...  # the allocation gives it ``cpus``: confine it there
    def release(self) -> None: ...  # give its processes their affinity back
    def members(self) -> set[int]: ...  # its processes (never reported as busy)
    def on_events(self, events: list[Any]) -> None: ...  # process events (forks and exits of members)


class Demands:
    def __init__(self) -> None:
        self.groups: dict[str, Demand] = {}  # elastic groups by name
        self.others: dict[int, OtherTask] = {}  # pid -> unregistered busy process
        self.elastic: Any = None  # the groups' orchestration (cod.rm.elastic_groups.ElasticGroups); None: not enforcing

    # ---- what the allocator sees ---------------------------------------------------------------
    def specs(self) -> list[TaskSpec]:
        return [d.spec for d in self.groups.values()]

    def placements(self) -> dict[str, tuple[int, ...]]:
        """Where each group is (or wants to be): the allocator places it there."""
        return {name: d.preferred() for name, d in self.groups.items()}

    def other_demands(self) -> list[OtherDemand]:
        return [o.demand() for _, o in sorted(self.others.items())]

    def floors(self, but: str) -> int:
        """Cores the groups other than ``but`` reserve (their ``min_cores``)."""
        return sum(d.spec.min_cores for d in self.groups.values() if d.name != but)

    def members(self) -> set[int]:
        """Processes of every elastic group (managed, never busy strangers)."""
        pids: set[int] = set()
        for demand in self.groups.values():
            pids |= demand.members()
        return pids

    def on_events(self, events: list[Any]) -> None:
        for demand in list(self.groups.values()):  # groups follow their members' forks and exits
            demand.on_events(events)

    def is_group(self, name: str) -> bool:
        return name in self.groups

    def member_clash(self, pid: int) -> str | None:
        """Why ``pid`` may not be registered as a task (it is in an elastic group), or None."""
        return self.elastic.member_clash(pid) if self.elastic is not None else None

    def listing(self) -> list[dict[str, Any]]:
        return self.elastic.listing() if self.elastic is not None else []

    def others_listing(self) -> list[dict[str, Any]]:
        return [{"pid": o.pid, "comm": o.comm, "cpu": round(o.cpu, 3), "cpus": list(o.cpus)}
                for _, o in sorted(self.others.items())]

    # ---- busy processes ------------------------------------------------------------------------
    def busy(self) -> dict[int, OtherTask]:
        """The unregistered busy processes as recorded now (a copy)."""
        return dict(self.others)

    def is_busy(self, pid: int) -> bool:
        return pid in self.others

    def other_facts(self, others: Mapping[int, OtherTask] | None = None) -> dict[str, list[str]]:
        """The ``other_task/3`` facts of ``others`` (default: the busy processes now)."""
        others = self.others if others is None else others
        return {other_task_fact(ANY, ANY, ANY): [other_task_fact(o.pid, o.comm, o.cpus) for _, o in sorted(others.items())]}

    def adopted(self, plan: Plan, pub: Publication) -> tuple[Publication, dict[str, list[str]]]:
        """``plan`` is now the current one: keep its reservations for the busy processes (where the
        monitor confines them), and give each task it displaced a reason naming the process.
        Returns the publication and the ``other_task/3`` facts to write with it (when they moved)."""
        pub, writes, keep = self.adoption(plan, pub)
        keep()
        return pub, writes

    def adoption(self, plan: Plan, pub: Publication) -> tuple[Publication, dict[str, list[str]], Callable[[], None]]:
        """What :meth:`adopted` does, without doing it yet: the publication, the facts to write
        with it, and ``keep()``, which keeps the reservations once the facts are written."""
        moved = {}
        for pid, other in self.others.items():
            cpus = plan.reservations.get(other_task_name(pid))
            if cpus is not None and cpus != other.cpus:
                moved[pid] = dataclasses.replace(other, cpus=cpus)

        def keep() -> None:
            for pid, other in moved.items():
                if pid in self.others:  # still busy
                    self.others[pid] = dataclasses.replace(self.others[pid], cpus=other.cpus)
        reasons = {}
        for task, names in plan.displaced_by.items():
            who = []
            for name in names:
                pid = other_pid(name)
                other = self.others.get(pid) if pid is not None else None
                who.append(f"busy process {pid} ({other.comm})" if other else name)
            reasons[task] = f"{' and '.join(who)} took CPUs of task {task} (no free or less costly CPU was left)"
        pub = dataclasses.replace(pub, task_reasons=reasons) if reasons else pub
        return pub, (self.other_facts({**self.others, **moved}) if moved else {}), keep

    def set_others(self, others: dict[int, OtherTask]) -> bool:
        """The busy processes are now ``others``; True when one was added."""
        added = bool(set(others) - set(self.others))
        self.others = dict(others)
        return added

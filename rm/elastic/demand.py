"""An elastic group inside the RM's global allocation: its demand, and what the allocation leaves it. Pure.

The group is one more task for the allocator (`group_spec`): it asks for at
most the CPUs it holds now (its current count *is* its demand) and at least
its floor (``min_cores``, 1 by default), exclusive like a COD task.  Its held
CPUs are passed to the allocator as its current placement, so the plan keeps
them (the allocator minimises moves).  A floor below the current count lets
the allocator take CPUs back from the group when a COD task needs them for
its own minimum; a floor equal to the count (``min_cores = max_cores = n``)
would refuse that task while an idle group still held the machine, and would
make every plan infeasible once the group asked for a CPU that is not free.

Before each period the group may use what the last plan leaves it
(`limits_for`): every CPU of the machine that no other task or group holds or
is planned to hold, and that is not kept for an unregistered busy process.
A grant (t5) takes one of those; a release (t4) gives one back, and the next
plan hands it to whoever has room.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from cod.rm.allocator.model import TaskSpec

from .controller import Limits
from .settings import ElasticSettings


def group_spec(name: str, settings: ElasticSettings, held: int) -> TaskSpec:
    """The allocator's view of a group holding ``held`` CPUs."""
    floor = settings.min_cores
    return TaskSpec(name=name, min_cores=floor, max_cores=max(floor, held), exclusive=True)


def limits_for(name: str, usable: Iterable[int], holdings: Mapping[str, Sequence[int]],
               plan: Mapping[str, Sequence[int]], unavailable: Iterable[int] = ()) -> Limits:
    """What group ``name`` may hold now: the usable CPUs nobody else holds or is planned to hold,
    minus those kept for unregistered busy processes."""
    taken = set(unavailable)
    for who, cpus in (*holdings.items(), *plan.items()):
        if who != name:
            taken.update(cpus)
    available = frozenset(c for c in usable if c not in taken)
    return Limits(cap=len(available), available=available)

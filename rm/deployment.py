"""A task's query-plan deployment (issue 17): which of its threads goes to which of its CPUs.

The plan comes from :mod:`cod.rm.deploy` (``deploy_plan`` call); the global
allocator gives the task ``plan.min_cores`` CPUs or more, :func:`bind` lays the
plan's clusters out inside them, and :func:`match_threads` says which thread
runs which operator: a thread whose name is the operator id's
:func:`~cod.rm.deploy.comm_key` (what ``pthread_setname_np`` keeps of it), or
whose TID is the operator id.  Pure: the daemon reads the thread names and
pins (rm/service.py, through the enforcement backend).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

from cod.facts.model import Machine

from .deploy import DeployPlan, InfeasibleError, Options, bind, comm_key

# bind() only re-runs phases 3-4; the exact search already ran at deploy time.
BIND_OPTIONS = Options(exact=False)


@dataclass
class Deployment:
    plan: DeployPlan
    bound_to: tuple[int, ...] = ()  # the CPUs placement was computed for
    placement: dict[str, int] = field(default_factory=dict)  # operator id -> CPU
    problem: str | None = None  # why the plan does not fit the task's CPUs now

    def placed_in(self, machine: Machine, cpus: Iterable[int]) -> dict[str, int]:
        """The placement inside ``cpus`` (recomputed only when they change)."""
        cpus = tuple(sorted(cpus))
        if cpus != self.bound_to:
            self.bound_to = cpus
            try:
                self.placement = dict(bind(self.plan, machine, cpus, BIND_OPTIONS).placement)
                self.problem = None
            except InfeasibleError as err:
                self.placement, self.problem = {}, str(err)
        return self.placement


@dataclass(frozen=True)
class Matching:
    targets: dict[int, int]  # tid -> CPU
    unmatched: tuple[str, ...]  # operators no thread runs (yet)


def match_threads(placement: Mapping[str, int], threads: Mapping[int, str]) -> Matching:
    """Each thread (tid -> name) that runs an operator of ``placement``, and the CPU it goes to.

    Several threads of one name all go to that operator's CPU; an operator id
    that is a TID of the task names that thread, whatever its name."""
    by_name: dict[str, str] = {}
    for op in placement:
        by_name.setdefault(comm_key(op), op)
    targets: dict[int, int] = {}
    seen: set[str] = set()
    for tid, name in threads.items():
        op = str(tid) if str(tid) in placement else by_name.get(name)
        if op is not None:
            targets[tid] = placement[op]
            seen.add(op)
    return Matching(targets, tuple(sorted(op for op in placement if op not in seen)))

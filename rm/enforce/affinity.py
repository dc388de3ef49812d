"""Affinity enforcement: ``sched_setaffinity`` on every thread of a task.

`AffinityEnforcer` is the backend that does nothing more than pin threads
(:mod:`.pinning`); the record of original affinity it shares with the cpuset
backends is `RecordingEnforcer` (:mod:`.recording`).
"""

from __future__ import annotations

from collections.abc import Mapping

from .pinning import pin_process
from .recording import RecordingEnforcer


class AffinityEnforcer(RecordingEnforcer):
    """Pins threads with sched_setaffinity; memory placement is left to the kernel."""

    name = "affinity"

    def describe(self) -> str:
        return "affinity (sched_setaffinity on every thread; no cgroups)"

    def _enforce(self, task: str, pids: list[int], cpus: tuple[int, ...], mems: tuple[int, ...],
                 placements: Mapping[int, Mapping[int, tuple[int, ...]]]) -> list[int]:
        return [p for p in pids if pin_process(p, cpus, self.proc, placements.get(p))]

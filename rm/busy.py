"""Busy detection's policy, in one place: which processes count as busy, for how long, which the
RM may act on, and what the allocator keeps for them.  The measuring is mechanism and lives in
:mod:`cod.rm.enforce.busy` (`BusyDetector` samples /proc and applies :class:`BusyPolicy`);
the monitor (:mod:`.monitor`) runs both and records the result through :mod:`.demands`.

* **Thresholds and hysteresis** (:class:`BusyPolicy`): a process is busy when it used
  (or waited for) at least ``threshold`` cores over each of ``window`` samples; it stays
  reported until it has been below half the threshold for ``quiet_window`` samples in a
  row.  The band between the two levels and the longer quiet window keep a steady hog that
  shares its CPU (and so measures near the threshold) from being forgotten and found again.
* **Eligibility**: registered tasks, elastic groups' members, the daemon and its children
  (the SKB engine) are never reported (the monitor passes them to the detector); of the
  rest, ``busy_scope`` and ``never_confine`` say which may be reported and confined
  (:class:`cod.rm.scope.ProcessScope`, which reads /proc to apply them: the one part of
  the policy that is not a pure function, kept apart so this module stays pure).
* **What the allocator keeps for them** (:class:`OtherTask`): a busy process asks for its
  use rounded (at least one core), placed where it runs; one the RM may not confine can
  only be kept where its own affinity lets it run (:func:`next_others`).  After each plan
  it is confined to what the plan reserved, or, when the tasks' floors left it nothing
  reserved, to the CPUs no task was given (:func:`confinement_target`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Protocol

from .allocator import OtherDemand
from .names import other_task_name


@dataclass(frozen=True)
class BusyPolicy:
    threshold: float = 0.5  # cores used or waited for
    window: int = 3  # samples at or above the threshold before a process is reported
    quiet_window: int = 20  # samples below half the threshold before it is forgotten

    def problem(self) -> str | None:
        """Why these settings cannot be used, or None."""
        if not self.threshold > 0:
            return f"busy threshold must be a positive number of cores, not {self.threshold!r}"
        if self.window < 1:
            return f"busy window must be at least one sample, not {self.window!r}"
        if self.quiet_window < 1:
            return f"busy quiet window must be at least one sample, not {self.quiet_window!r}"
        return None

    def hot(self, use: float) -> bool:
        """A sample at or above the threshold (``window`` of them in a row: reported)."""
        return use >= self.threshold

    def reported(self, busy_run: int) -> bool:
        return busy_run >= self.window

    def quiet(self, use: float) -> bool:
        """A sample that counts towards forgetting a reported process (the hysteresis band)."""
        return use < self.threshold / 2

    def forgotten(self, quiet_run: int) -> bool:
        return quiet_run >= self.quiet_window

    def demand(self, recent: list[float], threads: int) -> float:
        """Cores a reported process uses or wants: the mean of its window, at most one core per
        thread.  A sample that says more is the clocks' artefact, not demand: in a loaded TCG
        guest a one-thread spinner measured 6.67 cores, was given three CPUs instead of one, and
        one of them on the node kept for a NUMA-sensitive task."""
        mean = sum(recent) / len(recent)
        return min(mean, float(threads)) if threads > 0 else mean

    def worth_reading_wait(self, use: float) -> bool:
        """Only a process that runs at all can be starved: its run-queue wait is read from here.
        Any CPU time counts: four spinners sharing one CPU with a busy neighbour got under an
        eighth of a core each (a quarter of the threshold, the old gate) and were never seen."""
        return use > 0

    def worth_a_wait_baseline(self, cores_over_its_life: float, age_seconds: float) -> bool:
        """A process first seen that used at least half the threshold over its life, or is too
        young (under a second) for its life to tell: its threads are read at once (a baseline
        for their wait), so its first sample is not CPU time alone."""
        return age_seconds < 1.0 or cores_over_its_life >= self.threshold / 2

    def demand_hidden(self, idle_cores: float, runnable: int, cpus: int) -> bool:
        """A machine with no idle time to speak of and more threads runnable than CPUs: CPU time
        cannot tell who wants more (at ten threads a CPU, a spinner gets a tenth of a core), so
        every process is scanned for its wait; a machine one busy task keeps exactly full is not."""
        return idle_cores < self.threshold and runnable > cpus > 0

    def worth_scanning(self, unexplained_cores: float) -> bool:
        """CPU time nobody known explains: enough to scan every process."""
        return unexplained_cores >= self.threshold


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


def printable(comm: str) -> str:
    """A process name as it may be shown and stored: control characters replaced."""
    return "".join(c if c.isprintable() else "?" for c in comm) or "?"


class Sampled(Protocol):
    """What the detector says about a busy process (cod.rm.enforce.busy.BusyProcess)."""

    pid: int
    comm: str
    cpu: float
    cpus: tuple[int, ...]
    last_cpu: int


def next_others(current: Mapping[int, OtherTask], busy: Iterable[Sampled], may_confine: Callable[[int, str], bool]
                ) -> tuple[dict[int, OtherTask], list[str]]:
    """The busy processes after a sample (``busy``: the eligible ones the detector reports now),
    and what changed, in words.  A newcomer is kept where it runs now (the allocator decides
    where it goes); one the RM will not confine can only be kept where its affinity lets it run."""
    now = {h.pid: h for h in busy}
    others = dict(current)
    changes: list[str] = []
    for pid in [p for p in others if p not in now]:
        changes.append(f"busy process {pid} ({others.pop(pid).comm}) is quiet or gone")
    for pid, hog in sorted(now.items(), key=lambda kv: (-kv[1].cpu, kv[0])):
        if pid in others:
            continue
        movable = may_confine(pid, hog.comm)
        others[pid] = OtherTask(pid, printable(hog.comm), hog.cpu, (hog.last_cpu,),
                                None if movable else tuple(hog.cpus))
        changes.append(f"busy process {pid} ({printable(hog.comm)}) uses {hog.cpu:.2f} cores")
    return others, changes


def confinement_target(other: OtherTask, planned: set[int], all_cpus: list[int]) -> tuple[int, ...] | None:
    """Where to keep a busy process after a plan: what the plan reserved for it, else the CPUs no
    task was given; None when there is nowhere to keep it, or no task to keep it from."""
    target = other.cpus or tuple(c for c in all_cpus if c not in planned)
    if not target or len(target) == len(all_cpus):
        return None
    return target

"""Driving one elastic group without the daemon: measure, decide, enforce, every period.

The standalone runner of phase 1 (tests, benchmarks, ``python -m
cod.rm.elastic``); the RM's loop takes its place in phase 2 and calls the
same pieces: `GroupMeter.sample`, a metric, `controller.step`, an `Enforcer`.

Enforcement goes through the backends of `cod.rm.enforce` under one task
name: the processes found at start (and any that join the group with a mask
of their own) through ``apply``, which records their original affinity;
processes forked inside the group inherit its CPUs from the kernel and are
recorded through ``add_thread`` with their parent's original once they have
lived through a whole period (a parallel worker or a shell's short child
exits first and costs no state-file write), so that ``close()`` (or the next
start after a crash, through the enforcer's state file) gives every one of
them its affinity back.  Only CPUs are confined:
memory stays where first touch put it, which is the paper's premise.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from cod.facts import procfs
from cod.facts.model import Machine
from cod.rm.enforce import EnforceError, Enforcer
from cod.rm.enforce.cgroupfs import find_cpuset_mount
from cod.rm.enforce.eventsource import open_source
from cod.rm.enforce.procevents import ConnectorSource, PollingSource
from cod.rm.enforce.recording import check_task_name

from . import controller
from .controller import Decision, GroupState, Limits, Observation
from .errors import ElasticError, GroupGone
from .facts import group_facts
from .group import CgroupGroup, PidTreeGroup
from .measure import GroupMeter, Sample
from .metrics import metric as metric_named
from .modes import Layout, effective_mode
from .settings import ElasticSettings
from .taskstats import TaskstatsReader, open_reader

log = logging.getLogger("cod.rm.elastic")


@dataclass(frozen=True)
class Record:
    """One period, as the CSV of a run shows it."""

    t: float  # seconds since the runner started
    load: float  # the metric, percent of the CPUs held during the period
    cpu_s: float
    delay_s: float | None
    n_before: int
    n_after: int
    cpus: tuple[int, ...]
    action: str
    fired: tuple[str, ...]
    members: int
    step_s: float  # wall time of this period's work (measure + decide + enforce)
    step_cpu_s: float  # CPU time of it (the runner's thread)

    FIELDS = ("t", "load", "cpu_s", "delay_s", "n_before", "n_after", "cpus", "action", "fired",
              "members", "step_s", "step_cpu_s")

    def row(self) -> list[str]:
        return [f"{self.t:.3f}", f"{self.load:.1f}", f"{self.cpu_s:.4f}",
                "" if self.delay_s is None else f"{self.delay_s:.4f}", str(self.n_before),
                str(self.n_after), " ".join(map(str, self.cpus)), self.action, " ".join(self.fired),
                str(self.members), f"{self.step_s:.6f}", f"{self.step_cpu_s:.6f}"]


def _check_backend(group: CgroupGroup | PidTreeGroup, enforcer: Enforcer) -> None:
    """A cpuset backend moves processes into cgroups of its own: a group defined by a
    cgroup of the same hierarchy would lose its members."""
    if not isinstance(group, CgroupGroup) or enforcer.name != "cpuset":
        return
    mount = find_cpuset_mount()
    if mount is not None and os.path.commonpath([mount.path, group.path]) == mount.path:
        raise ElasticError(
            f"cgroup {group.path} is in the hierarchy the cpuset backend moves processes in "
            f"({mount.describe()}); manage it with the affinity backend")


class ElasticRunner:
    def __init__(self, name: str, group: CgroupGroup | PidTreeGroup, machine: Machine, enforcer: Enforcer,
                 settings: ElasticSettings = ElasticSettings(),
                 limits: Callable[[], Limits] | Limits = Limits(),
                 allowed_cpus: Collection[int] | None = None,
                 events: ConnectorSource | PollingSource | None = None,
                 taskstats: TaskstatsReader | None = None,
                 may_pin: Callable[[int], bool] | None = None,
                 history: int | None = None, enforcer_task: str | None = None,
                 open_taskstats: bool = True) -> None:
        self.name = name
        # Its name in the enforcer: the RM's own name for it (one namespace with its tasks).
        self.task = check_task_name(enforcer_task or f"elastic-{name}")
        self.group = group
        self.settings = settings
        self.enforcer = enforcer
        _check_backend(group, enforcer)
        self.metric = metric_named(settings.metric)
        self.layout = Layout.from_machine(machine, allowed_cpus)
        self.mode, note = effective_mode(self.layout, settings.mode)
        self.notes = [note] if note else []
        if note:
            log.info("elastic group %s: %s", name, note)
        self.mems = tuple(sorted(n.id for n in machine.numa_nodes)) or (0,)
        if machine.allowed_mems:
            self.mems = tuple(sorted(set(self.mems) & set(machine.allowed_mems))) or self.mems
        self._limits = limits
        self.events = events
        if events is not None and isinstance(group, PidTreeGroup):
            group.rescan()  # children forked before the event source listened
        # Without a reader given, open one (unless told not to: the RM opens one for all groups).
        self._own_taskstats = taskstats is None and self.metric.needs_delay and open_taskstats
        self.taskstats = open_reader() if self._own_taskstats else taskstats
        self.meter = GroupMeter(group, want_delay=self.metric.needs_delay, taskstats=self.taskstats)
        self.may_pin = may_pin  # which members may be confined (None: all); see `_pinnable`
        self._refused: set[tuple[int, int]] = set()  # (pid, start) of members not ours to pin
        self.state: GroupState | None = None
        self.history: deque[Record] = deque(maxlen=history)  # None: unbounded
        self.last_sample: Sample | None = None
        self.last_load: float | None = None
        self._pages: dict[int, int] | None = None
        self._pages_at = -1e9
        self._procs: set[int] = set()  # pinned through apply()
        self._children: set[int] = set()  # forked inside, pinned through add_thread()
        self._pending: set[int] = set()  # forked inside, seen once: confined by inheritance, not recorded yet
        self._pinned: set[int] = set()  # the CPUs the members were last confined to
        self._t0 = time.monotonic()
        self.gone: str | None = None

    # ---- what the policy reads -------------------------------------------------------------
    def limits(self) -> Limits:
        return self._limits() if callable(self._limits) else self._limits

    def pages_now(self, force: bool = False) -> dict[int, int] | None:
        if self.mode != "adaptive":
            return None
        now = time.monotonic()
        if force or self._pages is None or now - self._pages_at >= self.settings.pages_refresh_s:
            self._pages, self._pages_at = self.meter.pages(), now
        return self._pages

    # ---- enforcement -------------------------------------------------------------------------
    def _pinnable(self, members: list[int]) -> list[int]:
        """The members ``may_pin`` accepts (asked once per process)."""
        if self.may_pin is None:
            return members
        out = []
        for pid in members:
            if pid in self._procs or pid in self._children or pid in self._pending:
                out.append(pid)
                continue
            try:
                key = (pid, procfs.read_stat(pid, proc=self.meter.proc).start_time)
            except (FileNotFoundError, ProcessLookupError, ValueError):
                continue
            if key in self._refused:
                continue
            if self.may_pin(pid):
                out.append(pid)
            else:
                self._refused.add(key)
                log.info("elastic group %s: member %d is not confined (%s)", self.name, pid,
                         "another user's process")
        return out

    def _enforce_all(self, cpus: tuple[int, ...], members: list[int]) -> None:
        """Put every member on ``cpus``: apply() for the recorded ones, add_thread for children."""
        members = self._pinnable(members)
        self._procs = {p for p in self._procs if p in members}
        self._children = {p for p in self._children if p in members}
        self._pending &= set(members)
        if not self._procs and not self._children:
            self._procs = set(members)
            self._pending.clear()
        live = self.enforcer.apply(self.task, sorted(self._procs), cpus, self.mems)
        self._procs = set(live)
        self._pinned = set(cpus)
        for pid in sorted(self._children):
            self._pin_child(pid)
        # Children seen once follow without being recorded (a state-file write each, and most
        # of them, parallel workers, are gone by the next period); recorded if they live on.
        for pid in sorted(self._pending):
            self._pin_child(pid, record=False)

    def _pin_child(self, pid: int, record: bool = True) -> None:
        """Every thread of a child forked inside the group onto its CPUs, through the enforcer:
        recorded for the restore (add_thread), or not yet (follow_thread)."""
        pin = self.enforcer.add_thread if record else self.enforcer.follow_thread
        for tid in procfs.thread_ids(pid, self.meter.proc):
            try:
                pin(self.task, tid)
            except EnforceError as err:
                log.debug("elastic group %s: pinning %d: %s", self.name, tid, err)

    def _follow_members(self, cpus: tuple[int, ...], members: list[int]) -> None:
        """Newcomers since the last period; departed children are forgotten."""
        current = set(members)
        members = self._pinnable(members)
        for pid in sorted(self._children - current):
            self.enforcer.forget_pid(self.task, pid)
        self._children &= current
        seen_before, self._pending = self._pending & current, set()
        joined: list[int] = []
        mask = set(cpus)
        for pid in members:
            if pid in self._procs or pid in self._children:
                continue
            if pid in seen_before:  # a second period alive: record it for the restore
                self._children.add(pid)
                self._pin_child(pid)
                continue
            try:
                inherited = set(os.sched_getaffinity(pid)) == mask
            except (ProcessLookupError, OSError):
                continue
            if inherited and self._procs:  # forked inside the group: the kernel confined it
                self._pending.add(pid)
            else:
                joined.append(pid)
        if joined:
            self._procs.update(joined)
            self._procs = set(self.enforcer.apply(self.task, sorted(self._procs), cpus, self.mems))

    # ---- the loop ----------------------------------------------------------------------------
    def start(self, cpus: Sequence[int] | None = None) -> Decision:
        """Measure the baseline, grant the group its first CPUs and confine it there.

        ``cpus``: the first CPUs as chosen elsewhere (the RM's allocator; () while it waits
        for them); by default the controller chooses its minimum by mode."""
        sample = self.meter.sample()
        self.last_sample = sample
        if cpus is None:
            state, decision = controller.start(self.layout, self.settings, self.limits(), self.pages_now(True))
        else:
            state = controller.begin(cpus)
            decision = Decision(controller.RESTORE, (), state.cpus)
        self.state = state
        if state.cpus:
            self._enforce_all(state.cpus, list(sample.members))
        log.info("elastic group %s (%s): starts on CPUs %s, mode %s, metric %s", self.name,
                 self.group.describe(), ",".join(map(str, state.cpus)) or "given later", self.mode,
                 self.metric.name)
        return decision

    def adopt(self, cpus: Sequence[int]) -> Decision:
        """The global allocation gives the group ``cpus`` (the RM's plan): confine it there now;
        the state follows and the net does not fire."""
        if self.state is None:
            raise ElasticError("start() the runner before moving it")
        self.state, decision = controller.follow(self.state, cpus, self.last_load or 0.0)
        if self.state.cpus and (decision.changed or self._pinned != set(self.state.cpus)):
            members = list(self.last_sample.members) if self.last_sample else []
            try:
                self._enforce_all(self.state.cpus, members)
            except EnforceError as err:
                log.warning("elastic group %s: enforcement failed: %s", self.name, err)
        return decision

    def step(self) -> Decision | None:
        """One period; None once the group is gone (then `gone` says why)."""
        if self.state is None:
            raise ElasticError("start() the runner before stepping it")
        if self.gone is not None:
            return None
        began, began_cpu = time.perf_counter(), time.thread_time()
        try:
            if self.events is not None:
                if isinstance(self.events, PollingSource):
                    self.events.watch = {m.pid for m in self.group.members()}
                self.group.on_events(self.events.read_events())
            sample = self.meter.sample()
        except GroupGone as err:
            self.gone = str(err)
            log.info("elastic group %s: %s", self.name, err)
            return None
        n_before = self.state.n
        if n_before == 0:  # no CPU yet (the RM's allocator is taking one back for it): nothing to judge
            self.last_sample = sample
            return Decision(controller.HOLD, (), ())
        load = self.metric.value(sample, n_before) if sample.interval_s > 0 else 0.0
        obs = Observation(at=sample.at, load=load, pages=self.pages_now())
        self.state, decision = controller.step(self.state, obs, self.limits(), self.layout, self.settings)
        members = list(sample.members)
        try:
            if decision.changed:
                self._enforce_all(self.state.cpus, members)
            else:
                self._follow_members(self.state.cpus, members)
        except EnforceError as err:
            log.warning("elastic group %s: enforcement failed: %s", self.name, err)
        self.last_sample, self.last_load = sample, load
        fired = decision.evaluation.fired if decision.evaluation else ()
        self.history.append(Record(
            t=time.monotonic() - self._t0, load=load, cpu_s=sample.cpu_s, delay_s=sample.delay_s,
            n_before=n_before, n_after=self.state.n, cpus=tuple(sorted(self.state.cpus)),
            action=decision.action, fired=fired, members=len(members), step_s=time.perf_counter() - began,
            step_cpu_s=time.thread_time() - began_cpu))
        if decision.changed:
            log.info("elastic group %s: %s at %.0f %% -> CPUs %s (%s)", self.name, decision.action, load,
                     ",".join(map(str, sorted(self.state.cpus))), " ".join(fired) or "limits")
        return decision

    def run(self, duration: float | None = None, stop: threading.Event | None = None) -> None:
        """Step every period until ``duration`` passed, ``stop`` is set or the group is gone."""
        if self.state is None:
            self.start()
        stop = stop or threading.Event()
        period = self.settings.period_s
        end = None if duration is None else time.monotonic() + duration
        deadline = time.monotonic() + period
        while not stop.is_set():
            now = time.monotonic()
            if end is not None and now >= end:
                return
            if stop.wait(max(0.0, deadline - now)):
                return
            if self.step() is None:
                return
            deadline += period
            if deadline < time.monotonic():  # fell behind (a stalled machine): do not burst
                deadline = time.monotonic() + period

    def facts(self) -> dict[str, list[str]]:
        if self.state is None:
            raise ElasticError("the group has not started")
        return group_facts(self.name, self.group.fact_source(), self.settings, self.state, self.last_load)

    def close(self) -> None:
        """Give every member its original affinity back, close the group (a cgroup's held
        directory) and the event source it was given; idempotent."""
        try:
            self.enforcer.release(self.task)
        finally:
            self.group.close()
            if self.events is not None:
                self.events.close()
            if self._own_taskstats and self.taskstats is not None:
                self.taskstats.close()
                self.taskstats = None


def open_group(pids: Collection[int] | None = None, cgroup: str | None = None) -> CgroupGroup | PidTreeGroup:
    """The group named by exactly one of a pid list or a cgroup path."""
    if (pids is None) == (cgroup is None):
        raise ElasticError("name the group by pids or by a cgroup, not both and not neither")
    if cgroup is not None:
        return CgroupGroup(cgroup)
    return PidTreeGroup(sorted(pids or ()))


def open_events(group: CgroupGroup | PidTreeGroup) -> ConnectorSource | PollingSource | None:
    """Process events for a pid group (the connector as root, else the poller); a cgroup needs none."""
    if isinstance(group, CgroupGroup):
        return None
    return open_source(prefer_connector=os.geteuid() == 0)

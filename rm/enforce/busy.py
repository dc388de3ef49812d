"""Noticing CPU-hungry processes nobody registered (the paper's noisy system, 7.3/7.4).

`BusyDetector.sample()` is called every ``interval`` seconds (0.1 s suggested).
It reports the processes that are busy by the rules of `cod.rm.busy.BusyPolicy` (the
thresholds, the window and the hysteresis live there: this module measures).
Registered pids, this process and kernel threads are never reported.

Use counts the time a process *wanted* a CPU, not only the time it got one:
its threads' run-queue wait (``/proc/PID/task/TID/schedstat``) is added to
its CPU time, and a thread that was runnable at both ends of a sample and never
blocked in between (no voluntary context switch) wanted a CPU the whole sample
(:func:`wanted_ns`): the kernel adds a wait to schedstat only when the thread
next gets a CPU, so a spinner starved for a whole sample (ten runnable threads
a CPU) shows neither CPU time nor wait there, and half its samples fell under
the threshold.  Three spinners sharing one CPU each get a third of it, under
the threshold, yet each wants a whole core; counting only CPU time, the RM
would never see them and would forget a hog once newcomers share its CPU.
The wait is read only for a process that ran at all since the last sample,
and from then on while it is followed (a starved process may get no tick in one
interval: its baseline is kept), so a scan costs no more on a machine of idle processes.

Cost is what decides the design (figures in docs/design-enforce.md): reading
/proc/PID/stat of every process costs ~9 us each on the test box, ~3.4 ms for
380 processes, 3.4 % of a core at 0.1 s -- over the RM's 1 % idle budget.  So
each sample first reads /proc/stat (one file) and the registered tasks' own
stat files, and scans every process only when the CPU time they do not
explain reaches the threshold, or while a candidate is being watched.  An
idle machine thus costs a few tens of microseconds per sample; the price is
one more sample of delay before a hog is reported (the scan's baseline).

What to do with a hog (record it as ``other_task``, recompute, confine it) is
the RM's policy (cod.rm.busy, cod.rm.monitor); `confine()` is the mechanism.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from cod.facts import procfs

from ..busy import BusyPolicy
from ..names import other_task_name
from .errors import EnforceError



@dataclass(frozen=True)
class BusyProcess:
    pid: int
    start_time: int  # with pid, the identity (pid reuse)
    comm: str
    cpu: float  # cores used or waited for (run-queue wait), mean over the window
    cpus: tuple[int, ...]  # CPUs it may run on (its affinity)
    last_cpu: int  # CPU it last ran on


@dataclass
class _Track:
    start: int
    ticks: int
    at: float
    busy_run: int = 0  # consecutive samples at or above the threshold
    recent: list[float] = field(default_factory=list)
    threads: dict[int, procfs.ThreadSched] | None = None  # its threads at ``at`` (read once it used CPU)


def wanted_ns(old: dict[int, procfs.ThreadSched], new: dict[int, procfs.ThreadSched], dt_ns: int) -> int:
    """Nanoseconds the threads in both readings (``dt_ns`` apart) ran or waited for a CPU.

    One runnable at both readings that never blocked in between wanted a CPU for all of
    ``dt_ns``, whatever schedstat says yet (its wait is added there when it next runs);
    any other ran and waited what schedstat says, at most ``dt_ns``."""
    total = 0
    for tid, now in new.items():
        was = old.get(tid)
        if was is None:
            continue  # started since: its baseline
        if was.runnable and now.runnable and now.voluntary == was.voluntary:
            total += dt_ns
        else:
            total += min(dt_ns, max(0, now.run_ns - was.run_ns + now.delay_ns - was.delay_ns))
    return total


class BusyDetector:
    def __init__(self, threshold: float = 0.5, window: int = 3,
                 registered: Callable[[], Collection[int]] | None = None,
                 quiet_window: int = 20,
                 proc: str = procfs.PROC, clock: Callable[[], float] = time.monotonic,
                 always_scan: bool = False) -> None:
        self.policy = BusyPolicy(threshold, window, quiet_window)  # what counts as busy (cod.rm.busy)
        problem = self.policy.problem()
        if problem is not None:
            raise EnforceError(problem)
        self.threshold = threshold
        self.window = window
        self.quiet_window = quiet_window
        self.registered = registered or (lambda: ())
        self.proc = proc
        self.clock = clock
        self.always_scan = always_scan  # skip the /proc/stat gate (benchmarks)
        self.me = os.getpid()
        self._kept = procfs.KeptFiles()  # /proc/stat and the known pids' stat, read each sample
        self._tracks: dict[int, _Track] = {}  # every process, while scanning
        self._hogs: dict[int, _Track] = {}  # reported hogs, followed without scanning
        self._known: dict[int, _Track] = {}  # registered pids and this process
        self._machine: tuple[int, int, float] | None = None  # busy and idle ticks, when
        self.scans = 0  # full scans done (for tests and benchmarks)
        self.scan_cpu_seconds = 0.0  # CPU time they took (benchmarks)

    def _unexplained(self, now: float, skip: set[int]) -> tuple[float, bool]:
        """Cores of CPU time since the last sample that registered tasks and we did not use, and
        whether the machine was saturated with more threads runnable than CPUs: there CPU time
        hides demand (a starved hog gets under the threshold however much it wants)."""
        machine = self._kept.read(f"{self.proc}/stat")
        if machine is None:
            raise EnforceError(f"cannot read {self.proc}/stat")
        total, idle = procfs.machine_ticks(machine)
        cpus, running = procfs.machine_runnable(machine)
        explained = 0
        known: dict[int, _Track] = {}
        paths = {pid: f"{self.proc}/{pid}/stat" for pid in skip}
        self._kept.keep_only([f"{self.proc}/stat", *paths.values()])
        for pid, path in paths.items():
            data = self._kept.read(path)
            if data is None:
                continue
            ticks, start, _ = procfs.parse_cpu_ticks(data)
            old = self._known.get(pid)
            if old is not None and old.start == start:
                explained += ticks - old.ticks
            known[pid] = _Track(start, ticks, now)
        self._known = known
        prev, self._machine = self._machine, (total, idle, now)
        if prev is None or now <= prev[2]:
            return 0.0, False
        dt = now - prev[2]
        hidden = self.policy.demand_hidden((idle - prev[1]) / procfs.CLK_TCK / dt, running - 1, cpus)  # -1: us
        return (total - prev[0] - explained) / procfs.CLK_TCK / dt, hidden

    def _follow_hogs(self, skip: set[int]) -> list[tuple[int, _Track]]:
        """Re-read the hogs already reported; one stays reported until it has been below half
        the threshold for ``quiet_window`` samples in a row (or exits, or gets registered)."""
        still: dict[int, _Track] = {}
        for pid, old in self._hogs.items():
            got = None if pid in skip else procfs.cpu_ticks(pid, self.proc)
            # Gone, another process under its pid, or exited and not yet reaped: a zombie's frozen
            # CPU time would keep it reported for the quiet window after its exit event removed it
            # (and the RM took it back in as a newcomer: two needless reallocations).
            if got is None or got[1] != old.start or got[2] & procfs.PF_EXITING:
                continue
            at = self.clock()  # the reading's own time: see _scan
            if at <= old.at:  # no time has passed: nothing to measure, nothing changes
                still[pid] = old
                continue
            tr = _Track(old.start, got[0], at)
            use = self._use(pid, old, tr)
            tr.recent = (old.recent + [use])[-self.window:]
            tr.busy_run = old.busy_run + 1 if self.policy.quiet(use) else 0  # here: the quiet run
            if not self.policy.forgotten(tr.busy_run):
                still[pid] = tr
        self._hogs = still
        return list(still.items())

    def _use(self, pid: int, old: _Track, new: _Track) -> float:
        """Cores ``pid`` used or waited for between ``old`` and ``new`` (sets ``new.threads``):
        its CPU time, or more when its threads say they wanted more (:func:`wanted_ns`)."""
        dt = new.at - old.at
        use = (new.ticks - old.ticks) / procfs.CLK_TCK / dt
        if old.threads is not None or self.policy.worth_reading_wait(use):
            new.threads = procfs.threads_sched(pid, self.proc)
            if old.threads is not None:
                use = max(use, wanted_ns(old.threads, new.threads, round(dt * 1e9)) / 1e9 / dt)
        return use

    def _baseline_threads(self, pid: int, tr: _Track) -> None:
        """Read the threads of a process seen for the first time when it has been busy over its
        life: its first sample then counts the wait of its threads, not only the CPU time they got
        (a hog sharing its CPUs with ten others gets a tick or none in a sample)."""
        age = time.clock_gettime(time.CLOCK_BOOTTIME) * procfs.CLK_TCK - tr.start  # ticks
        if self.policy.worth_a_wait_baseline(tr.ticks / max(age, 1), age / procfs.CLK_TCK):
            tr.threads = procfs.threads_sched(pid, self.proc)

    def close(self) -> None:
        self._kept.close()

    def sample(self) -> list[BusyProcess]:
        """One sample; the processes busy over the whole window, hungriest first."""
        now = self.clock()
        skip = set(self.registered())
        skip.add(self.me)
        hot = self._follow_hogs(skip)
        # Hogs already reported explain their own CPU time, so they do not keep us scanning.
        unexplained, hidden = self._unexplained(now, skip | set(self._hogs))
        watching = any(t.busy_run for t in self._tracks.values())
        if not (self.always_scan or watching or hidden or self.policy.worth_scanning(unexplained)):
            self._tracks = {}  # stale baselines would average over the quiet time
            return self._report(hot)
        self.scans += 1
        began = time.process_time()
        try:
            return self._report(self._scan(now, skip, hot))
        finally:
            self.scan_cpu_seconds += time.process_time() - began

    def _scan(self, now: float, skip: set[int], hot: list[tuple[int, _Track]]) -> list[tuple[int, _Track]]:
        tracks: dict[int, _Track] = {}
        for pid in procfs.pids(self.proc):
            if pid in skip or pid in self._hogs:
                continue
            got = procfs.cpu_ticks(pid, self.proc)
            if got is None:
                continue
            ticks, start, flags = got
            if flags & (procfs.PF_KTHREAD | procfs.PF_EXITING):
                continue
            old = self._tracks.get(pid)
            # Each reading carries its own time: a scan delayed between the sample's start and
            # this process (a loaded machine) would otherwise divide the CPU time of a longer
            # span by the samples' interval (a one-thread spinner measured 1.45 cores and took
            # a registered task's CPU, session 7).
            tr = _Track(start, ticks, self.clock())
            tracks[pid] = tr
            if old is None or old.start != start:
                self._baseline_threads(pid, tr)
                continue
            if tr.at <= old.at:
                continue
            use = self._use(pid, old, tr)
            if self.policy.hot(use):
                tr.busy_run = old.busy_run + 1
                tr.recent = (old.recent + [use])[-self.window:]
                if self.policy.reported(tr.busy_run):
                    hot.append((pid, tr))
                    self._hogs[pid] = _Track(start, ticks, tr.at, 0, list(tr.recent), tr.threads)
                    self._known[pid] = _Track(start, ticks, now)  # explained from the next sample
                    del tracks[pid]
        self._tracks = tracks
        return hot

    def _report(self, hot: list[tuple[int, _Track]]) -> list[BusyProcess]:
        out = []
        for pid, tr in hot:
            try:
                st = procfs.read_stat(pid, proc=self.proc)
                cpus = tuple(sorted(os.sched_getaffinity(pid)))
            except (FileNotFoundError, ProcessLookupError):
                continue
            if st.start_time != tr.start:
                continue
            cores = self.policy.demand(tr.recent, st.num_threads)
            out.append(BusyProcess(pid, st.start_time, st.comm, cores, cpus, st.processor))
        out.sort(key=lambda b: (-b.cpu, b.pid))
        return out


def confine(enforcer, hog: BusyProcess, cpus: Sequence[int], mems: Sequence[int]) -> str:
    """Keep an unregistered hog on ``cpus`` (the cores left over), through the enforcer
    so it is recorded and undone like any task.  Returns the task name used."""
    if not procfs.same_process(hog.pid, hog.start_time):
        raise EnforceError(f"process {hog.pid} ({hog.comm}) is gone; not confining it")
    task = other_task_name(hog.pid)
    enforcer.apply(task, [hog.pid], cpus, mems)
    return task

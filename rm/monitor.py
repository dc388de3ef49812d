"""The RM's eyes on the machine: process events, unregistered busy processes, live state.

What to do about what is seen is decided here (policy); how it is seen and how
processes are pinned is in cod.rm.enforce (mechanism), the only code that
touches the kernel.  Everything runs on the RM's event loop:

* the process event source (BPF or proc connector as root, else /proc polling) is
  read with ``loop.add_reader``: a registered task's exit deregisters it and
  recomputes at once; a new thread or child of a registered task is pinned at once
  (the loop's thread asks for the shortest scheduler slice: enforce/slice.py);
* the busy detector runs every ``busy_interval_s``: a process nobody registered
  that stays busy over the window becomes an ``other_task`` fact and a demand of
  the allocator, which keeps CPUs for it with the objective of every task
  (registered tasks stay, free CPUs first: issue 18), and, when
  ``confine_others`` is on, it is confined to the CPUs kept for it;
* the live state (per-CPU load, free memory per node, per-task CPU use and pages
  per node) is written into the SKB every ``refresh_interval_s``, only when it changed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from .system_facts import ANY, cpu_load_fact, numa_free_fact, task_cpu_use_fact, task_numa_pages_fact
from .busy import confinement_target, next_others, printable
from .names import other_task_name
from .config import RMConfig
from .enforce import EnforceError, Enforcer
from .enforce.busy import BusyDetector, BusyProcess, confine
from .enforce.livestate import LiveStateSampler
from .enforce.eventsource import open_source
from .enforce.procevents import ProcEvent
from .enforce.slice import request_realtime, request_slice
from .memory_drift import DriftWatch
from .registry import Task
from .scope import ProcessScope
from .service import ResourceManager

log = logging.getLogger("cod.rm")

MIB = 1 << 20
PAGES_EVERY = 5  # refreshes between two reads of numa_maps (it walks the page tables: 4x a refresh without it)
LOAD_STEP = 5  # percentage points a load must move before cpu_load/task_cpu_use is rewritten


class Monitor:
    def __init__(self, rm: ResourceManager, cfg: RMConfig, enforcer: Enforcer,
                 *, root: bool, skb_pid: Callable[[], int | None]) -> None:
        self.rm = rm
        self.cfg = cfg
        self.enforcer = enforcer
        self.root = root
        self.scope = ProcessScope.parse(cfg.busy_scope, cfg.never_confine)
        self.skb_pid = skb_pid
        self.confine = cfg.enforce and cfg.wants_confinement(root)
        self.all_cpus = sorted(rm.machine.cpu_ids())
        self.node_of = {pu.id: pu.numa_node for pu in rm.machine.pus}
        self.hogs: dict[int, BusyProcess] = {}  # what the detector last said about each other_task
        self.confined: dict[int, tuple[int, ...]] = {}  # hog pid -> CPUs it is confined to
        self.source: Any = None
        self.detector: BusyDetector | None = None
        self.sampler = LiveStateSampler()
        self.drift = DriftWatch()  # pages off their task's memory nodes (logged when it starts and stops)
        self._timers: list[asyncio.TimerHandle] = []
        self._jobs: set[asyncio.Task[Any]] = set()
        self._written: dict[str, list[str]] = {}  # SKB pattern -> facts last written
        self._refreshing = False
        self._refreshes = 0
        self._loads: dict[int, int] | None = None  # cpu_load last written
        self._uses: dict[str, int] | None = None  # task_cpu_use last written
        self.exit_reactions_ms: list[float] = []  # exit event -> cores reassigned, inside the daemon

    # ---- life cycle ------------------------------------------------------------------------
    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.source = open_source(prefer_connector=self.root, poll_interval=self.cfg.events_poll_interval_s)
        self._ask_the_scheduler()
        self._watch()
        loop.add_reader(self.source.fileno(), self._on_events)
        if self.cfg.busy_detect:
            self.detector = BusyDetector(self.cfg.busy_threshold, self.cfg.busy_window, registered=self._ours,
                                         quiet_window=self.cfg.busy_quiet_window)
            self._every(self.cfg.busy_interval_s, self._busy_tick)
        self._every(self.cfg.refresh_interval_s, self._refresh_tick)
        self.rm.publisher.on_published.append(self._reconfine)
        log.info(
            "watching: process events by %s; busy processes %s; live state every %.3g s",
            self.source.kind,
            (f"above {self.cfg.busy_threshold:g} cores for {self.cfg.busy_window} samples of "
             f"{self.cfg.busy_interval_s:g} s, {'confined to the CPUs the allocator keeps for them' if self.confine else 'not confined'}")
            if self.cfg.busy_detect else "not watched",
            self.cfg.refresh_interval_s,
        )

    def _ask_the_scheduler(self) -> None:
        """The loop that reads the events gets the CPU when one wakes it (enforce/slice.py)."""
        if self.cfg.event_loop_rt_priority:
            try:
                request_realtime(self.cfg.event_loop_rt_priority)
                log.info("the event loop runs SCHED_FIFO at priority %d", self.cfg.event_loop_rt_priority)
                return
            except EnforceError as err:
                log.warning("the event loop gets no real-time priority: %s", err)
        try:
            request_slice()
        except EnforceError as err:
            log.warning("the event loop keeps the default scheduler slice: %s", err)

    def close(self) -> None:
        for handle in self._timers:
            handle.cancel()
        # Jobs in flight are left to finish: cancelling one in the middle of an SKB exchange
        # would leave its reply to be read as the answer to the next request.
        if self.source is not None:
            try:
                asyncio.get_running_loop().remove_reader(self.source.fileno())
            except (ValueError, OSError):
                pass
            self.source.close()
        if self.detector is not None:
            self.detector.close()
        for pid in list(self.confined):
            self._unconfine(pid)

    def _every(self, interval: float, fn: Callable[[], None]) -> None:
        loop = asyncio.get_running_loop()
        slot = len(self._timers)

        def tick() -> None:
            self._timers[slot] = loop.call_later(interval, tick)  # first, so a failure does not stop it
            try:
                fn()
            except Exception:
                log.exception("periodic %s failed", fn.__name__)

        self._timers.append(loop.call_later(interval, tick))

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        job = asyncio.get_running_loop().create_task(coro)
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)

    def _ours(self) -> set[int]:
        """Pids the busy detector must not report: registered tasks, their children, the SKB engine."""
        pids = self.rm.managed_pids()
        pids |= self.rm.demands.members()  # elastic groups' processes are managed, not busy strangers
        skb = self.skb_pid()
        if skb is not None:
            pids.add(skb)
        return pids

    def _watch(self) -> None:
        if hasattr(self.source, "watch"):  # the poller lists threads of watched processes only
            self.source.watch = {pid for t in self.rm.tasks() for pid in t.pids()}

    # ---- process events --------------------------------------------------------------------
    def _on_events(self) -> None:
        try:
            events = self.source.read_events()
        except EnforceError as err:
            log.error("reading process events: %s", err)
            return
        if not events:
            return
        for ev in events:
            if ev.kind == "fork":
                self._forked(ev)
            elif ev.kind == "comm":
                self._renamed(ev)
            elif ev.kind == "exit" and not ev.is_thread:
                self._exited(ev)
            elif ev.kind == "overrun":
                log.warning("process events were lost (socket buffer full); re-pinning every task")
                self.rm.reapply_all()
        self.rm.demands.on_events(events)  # elastic groups follow their members' forks and exits
        self._watch()

    def _forked(self, ev: ProcEvent) -> None:
        # A new thread of process tgid, or a new process, child of parent_tgid.
        task = self.rm.task_of_pid(ev.tgid if ev.is_thread else ev.parent_tgid)
        if task is None:
            return
        if not ev.is_thread:
            task.children.add(ev.pid)
        if not self.rm.publisher.holdings_of(task.name):
            return
        try:
            self.enforcer.add_thread(task.name, ev.pid)
        except EnforceError as err:
            log.debug("pinning new thread %d of %s: %s", ev.pid, task.name, err)
        if task.deployment is not None:
            self.rm.query_plans.deploy_threads(task)  # its name may have come first

    def _renamed(self, ev: ProcEvent) -> None:
        # A thread named itself: if its task deployed a plan, it may be one of its operators.
        task = self.rm.task_of_pid(ev.tgid)
        if task is not None and task.deployment is not None:
            self.rm.query_plans.deploy_threads(task)

    def _exited(self, ev: ProcEvent) -> None:
        task = self.rm.task_of_pid(ev.pid)
        if task is not None and task.pid != ev.pid:
            task.children.discard(ev.pid)  # a child's exit does not end the task
            self.enforcer.forget_pid(task.name, ev.pid)  # its record of what to restore
        elif task is not None:
            self._spawn(self._task_exited(task, ev.timestamp_ns))
        elif self.rm.demands.is_busy(ev.pid):
            others = {p: o for p, o in self.rm.demands.busy().items() if p != ev.pid}
            self.hogs.pop(ev.pid, None)
            self._unconfine(ev.pid)
            self._spawn(self.rm.busy_changed(others, f"busy process {ev.pid} exited"))

    async def _task_exited(self, task: Task, event_ns: int) -> None:
        ms = await self.rm.admission.exited(task, event_ns)
        if ms is not None:
            self.exit_reactions_ms.append(ms)

    # ---- unregistered busy processes -------------------------------------------------------
    def _busy_tick(self) -> None:
        assert self.detector is not None
        ours = self._ours()
        busy = [h for h in self.detector.sample() if h.pid not in ours and self.scope.allows(h.pid, h.comm)]
        current = self.rm.demands.busy()
        others, changes = next_others(current, busy, lambda pid, comm: self.confine and self.scope.allows(pid, comm))
        for pid in set(current) - set(others):
            self.hogs.pop(pid, None)
            self._unconfine(pid)
        for hog in busy:
            self.hogs[hog.pid] = hog
            if hog.pid not in current:
                log.info("unregistered busy process %d (%s): %.2f cores, running on CPU %d",
                         hog.pid, printable(hog.comm), hog.cpu, hog.last_cpu)
        if changes:
            self._spawn(self.rm.busy_changed(others, "; ".join(changes)))

    def _reconfine(self) -> None:
        """After each published plan: keep every busy process where the policy says (cod.rm.busy)."""
        if not self.confine:
            return
        planned = self.rm.publisher.planned_cpus()
        ours = self._ours()
        for pid, other in self.rm.demands.busy().items():
            # It registered, or joined an elastic group, since it was found busy: its task or
            # group places it now (confining it would take it out of its task's cgroup).
            if pid in ours:
                self._unconfine(pid)
                continue
            target = confinement_target(other, planned, self.all_cpus)
            if target is None:
                self._unconfine(pid)
                continue
            hog = self.hogs.get(pid)
            if hog is None or self.confined.get(pid) == target or not self.scope.allows(pid):
                continue
            mems = tuple(sorted({self.node_of[c] for c in target if c in self.node_of}))
            try:
                confine(self.enforcer, hog, target, mems)
                self.confined[pid] = target
                log.info("confined busy process %d (%s) to CPUs %s", pid, other.comm, ",".join(map(str, target)))
            except EnforceError as err:
                log.info("not confining busy process %d: %s", pid, err)

    def _unconfine(self, pid: int) -> None:
        if self.confined.pop(pid, None) is None:
            return
        try:
            self.enforcer.release(other_task_name(pid))
        except EnforceError as err:
            log.warning("releasing busy process %d: %s", pid, err)

    # ---- live state ------------------------------------------------------------------------
    def _refresh_tick(self) -> None:
        if self.enforcer.check():  # sched_ext: is the scheduler still there?
            log.warning("enforcement now: %s", self.enforcer.describe())
        # Operator threads named since (missed events, or the poller, which sees no names).
        for task in self.rm.tasks():
            if task.deployment is not None:
                self.rm.query_plans.deploy_threads(task)
        if self._refreshing:  # the previous write is still in flight
            return
        tasks: dict[str, list[int]] = {t.name: t.pids() for t in self.rm.tasks() if t.pids()}
        pages = self._refreshes % PAGES_EVERY == 0
        self._refreshes += 1
        state = self.sampler.sample(tasks, pages=pages)
        for name, task_state in state.tasks.items():
            task = self.rm.find_task(name)
            if task is not None and task.pid not in task_state.pids:
                # Its exit event was missed (it exited while being admitted, or events overran).
                log.info("task %s: pid %d is gone", name, task.pid)
                self._spawn(self._task_exited(task, time.monotonic_ns()))
        loads = {c: round(v * 100) for c, v in state.cpu_load.items()}
        uses = {n: round(s.cpu * 100) for n, s in state.tasks.items()}
        writes = {
            cpu_load_fact(ANY, ANY): [cpu_load_fact(c, p) for c, p in sorted(loads.items())],
            # Free memory to the MiB: the last bytes change all the time and would rewrite it every refresh.
            numa_free_fact(ANY, ANY): [numa_free_fact(n, b // MIB * MIB) for n, b in sorted(state.node_free_bytes.items())],
            task_cpu_use_fact(ANY, ANY): [task_cpu_use_fact(n, p) for n, p in sorted(uses.items())],
        }
        if pages:
            self._watch_drift(state.tasks)
            writes[task_numa_pages_fact(ANY, ANY, ANY)] = [task_numa_pages_fact(n, node, count)
                                                  for n, s in sorted(state.tasks.items())
                                                  for node, count in s.pages.items()]
        # Loads are rewritten when one moved by LOAD_STEP points (or a CPU/task came or went), not for noise.
        if self._close_enough(self._loads, loads):
            writes.pop(cpu_load_fact(ANY, ANY))
        else:
            self._loads = loads
        if self._close_enough(self._uses, uses):
            writes.pop(task_cpu_use_fact(ANY, ANY))
        else:
            self._uses = uses
        changed = {p: f for p, f in writes.items() if self._written.get(p) != f}
        if changed:
            self._refreshing = True
            self._spawn(self._write_live_state(changed))

    def _watch_drift(self, tasks: dict[str, Any]) -> None:
        """A log line when a task's pages start (or stop) lying off its memory nodes."""
        self.drift.forget(tasks)
        for name, task_state in tasks.items():
            task = self.rm.find_task(name)
            if task is None or self.enforcer.moving(name):
                continue  # gone, or its pages are on their way (a background move): not drift
            nodes = self.rm.publisher.allocation_of(task)["memory_nodes"]
            change = self.drift.observe(name, task_state.pages, nodes)
            if change is not None:
                (log.warning if change[0] == "drift" else log.info)("%s", change[1])

    @staticmethod
    def _close_enough(old: dict[Any, int] | None, new: dict[Any, int]) -> bool:
        return old is not None and old.keys() == new.keys() and all(abs(new[k] - old[k]) < LOAD_STEP for k in new)

    async def _write_live_state(self, changed: dict[str, list[str]]) -> None:
        try:
            # One change: a query never sees the loads of one refresh and the memory of another.
            await self.rm.knowledge.write_live_state(changed)
            self._written.update(changed)
        except Exception as err:
            log.warning("writing the live state into the SKB: %s", err)
        finally:
            self._refreshing = False

"""Elastic groups in the daemon: process groups that do not speak COD, given CPUs by the
Petri net of cod.rm.elastic and placed by the global allocation beside COD tasks (issue 16).

A group (a cgroup, or pids and their future children) is registered with
``register_unmanaged`` (``cod elastic``) and stays until its processes are
gone or ``deregister_unmanaged`` removes it; its connection may close.

* **In the allocation.**  Each group is a `demands.Demand`: the allocator sees
  it as an exclusive task asking for at most the CPUs it holds (its current
  count is its demand) and at least its floor (`cod.rm.elastic.demand`), placed
  where it is.  It is admitted like a task (refused when its floor does not
  fit), its CPUs are in the epochs, ``allocated/2`` and the publications, and a
  CPU the plan takes from it is given back at once (nobody to ask).
* **Each period** (a timer on the event loop, `settings.period_s`): measure the
  group, evaluate the net with the `Limits` the last plan leaves it, and on a
  grant (t5: a CPU nobody holds) or a release (t4) confine the group at once
  and ask for a new plan, which confirms the grant or hands the released CPU to
  whoever has room.  The measure, the decision and the enforcement are the
  standalone runner's (`cod.rm.elastic.runner.ElasticRunner`), without its loop.
* **Enforcement** goes through the daemon's enforcer under the group's name,
  so a clean exit and the crash cleanup restore its processes as they do a task's.
* **The SKB** holds the net's marking, state and last transitions
  (``elastic_*/N``, docs/skb-schema.md), written through the daemon's SKB writes
  when they change (a steady group is rewritten at most every ``elastic_facts_refresh_s``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import asdict
from typing import Any

from cod.facts import procfs
from cod.protocol import jsonrpc as rpc
from cod.protocol.jsonrpc import RpcError
from cod.rm.elastic import controller
from cod.rm.elastic.demand import group_spec, limits_for
from cod.rm.elastic.errors import ElasticError
from cod.rm.elastic.group import CgroupGroup, PidTreeGroup
from cod.rm.elastic.runner import ElasticRunner, open_group
from cod.rm.elastic.settings import ElasticSettings
from cod.rm.elastic.taskstats import TaskstatsReader, open_reader

from .enforce.backend import Enforcer
from .enforce.helddir import HeldDir, PathRefused
from .enforce.procevents import ProcEvent
from .registry import Connection
from .busy import printable
from .names import name_problem
from .service import ResourceManager

log = logging.getLogger("cod.rm")

HISTORY = 600  # periods kept per group (5 minutes at 0.5 s): deregister_unmanaged returns them
MIN_PERIOD_S = 0.1  # each period samples the group: a shorter one would cost more than it tells

# What register_unmanaged accepts as settings (cod.rm.elastic.settings.ElasticSettings fields).
SETTING_KEYS = ("mode", "metric", "min_cores", "max_cores", "th_min", "th_max", "period_s")


def _uid_of(pid: int) -> int | None:
    try:
        return int(procfs.status_field(pid, "Uid").split()[0])
    except (OSError, KeyError, ValueError):
        return None


def owner_of(group: CgroupGroup | PidTreeGroup) -> int | None:
    """The uid a group belongs to: the owner of its cgroup (the uid it is delegated to: the
    directory held open, not whatever its path names now), or the real uid of its first pid
    (a postmaster's, whoever registers it); None when that is gone."""
    if isinstance(group, CgroupGroup):
        try:
            return group.owner_uid()
        except OSError:
            return None
    return _uid_of(group.roots[0])


def default_name(group: CgroupGroup | PidTreeGroup) -> str:
    """``elastic.<cgroup directory>`` or ``elastic.<command>.<first pid>``."""
    if isinstance(group, CgroupGroup):
        return f"elastic.{os.path.basename(group.path) or 'root'}"
    pid = group.roots[0]
    try:
        comm = procfs.read_stat(pid).comm
    except (FileNotFoundError, ProcessLookupError, ValueError):
        comm = "pid"
    return f"elastic.{printable(comm)}.{pid}"


class ManagedGroup:
    """One elastic group: the runner's pieces, plus what the RM asks of a `demands.Demand`."""

    def __init__(self, name: str, owner_uid: int, runner: ElasticRunner, settings: ElasticSettings,
                 registered_by: int | None = None) -> None:
        self.name = name
        self.owner_uid = owner_uid  # whose processes: their quotas count it, they may remove it
        self.registered_by = owner_uid if registered_by is None else registered_by  # the peer's uid
        self.runner = runner
        self.settings = settings
        self.want: tuple[int, ...] = ()  # where it should start, until it holds CPUs
        self.timer: asyncio.TimerHandle | None = None
        self.deadline = 0.0
        self.registered_at = time.time()
        self.facts_written: dict[str, list[str]] = {}
        self.facts_key: tuple[Any, ...] | None = None
        self.facts_load = 0.0
        self.facts_at = 0.0
        self.writing = False
        self.writes = 0  # fact writes done (each one SKB transaction)
        self.problem: str | None = None  # why the last period could not run (logged once)
        self.released = False

    # ---- demands.Demand ----------------------------------------------------------------------
    @property
    def spec(self):  # the allocator's TaskSpec
        return group_spec(self.name, self.settings, self.held())

    def held(self) -> int:
        return self.runner.state.n if self.runner.state is not None else 0

    def preferred(self) -> tuple[int, ...]:
        state = self.runner.state
        return state.cpus if state is not None and state.cpus else self.want

    def pin(self, cpus: tuple[int, ...]) -> None:
        decision = self.runner.adopt(cpus)
        if decision.changed:
            log.info("elastic group %s: the allocation gives it CPUs %s (%s)", self.name,
                     ",".join(map(str, sorted(cpus))) or "none", decision.action)

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.runner.close()

    def members(self) -> set[int]:
        return self.runner.group.pids()

    def on_events(self, events: list[ProcEvent]) -> None:
        self.runner.group.on_events(events)

    # ---- reports -----------------------------------------------------------------------------
    def source(self) -> dict[str, Any]:
        kind, value = self.runner.group.fact_source()
        return {"cgroup": value} if kind == "cgroup" else {"pids": list(value)}  # type: ignore[arg-type]

    def describe(self) -> dict[str, Any]:
        r = self.runner
        state = r.state
        last = r.history[-1] if r.history else None
        steps = sorted(rec.step_s for rec in r.history)
        cpu = sorted(rec.step_cpu_s for rec in r.history)
        return {
            "group": self.name, "owner_uid": self.owner_uid, "registered_by_uid": self.registered_by,
            **self.source(),
            "mode": r.mode, "mode_asked": self.settings.mode, "notes": list(r.notes),
            "settings": {k: getattr(self.settings, k) for k in SETTING_KEYS},
            "cores": sorted(state.cpus) if state else [],
            "load": None if r.last_load is None else round(r.last_load, 1),
            "state": state.last.state.lower() if state is not None and state.last is not None else None,
            "marking": list(state.marking) if state is not None else [],
            "fired": list(last.fired) if last else [],
            "members": len(r.last_sample.members) if r.last_sample else 0,
            "periods_run": state.periods if state is not None else 0,
            "step_ms_median": round(steps[len(steps) // 2] * 1e3, 3) if steps else None,
            "step_ms_max": round(steps[-1] * 1e3, 3) if steps else None,
            "step_cpu_ms_median": round(cpu[len(cpu) // 2] * 1e3, 3) if cpu else None,
            "step_cpu_ms_max": round(cpu[-1] * 1e3, 3) if cpu else None,
            "facts_writes": self.writes,
        }

    def periods(self) -> list[dict[str, Any]]:
        t0 = self.registered_at
        out = []
        for rec in self.runner.history:
            row = asdict(rec)
            row.update(cpus=list(rec.cpus), fired=list(rec.fired), t=round(rec.t, 3), at=round(t0 + rec.t, 3))
            out.append(row)
        return out


class ElasticGroups:
    """Every elastic group of the daemon: registration, the per-period timers, removal."""

    def __init__(self, rm: ResourceManager, enforcer: Enforcer) -> None:
        self.rm = rm
        self.enforcer = enforcer
        self.groups: dict[str, ManagedGroup] = {}
        self.usable = sorted(rm.machine.cpu_ids())
        self._taskstats: TaskstatsReader | None = None
        self._taskstats_tried = False
        self._jobs: set[asyncio.Task[Any]] = set()
        self.closed = False

    # ---- registration ------------------------------------------------------------------------
    def settings_from(self, params: dict[str, Any]) -> ElasticSettings:
        try:
            settings = ElasticSettings.from_mapping(params, "register_unmanaged")
        except ElasticError as err:
            raise RpcError(rpc.INVALID_PARAMS, str(err)) from None
        if settings.period_s < MIN_PERIOD_S:
            raise RpcError(rpc.INVALID_PARAMS, f"register_unmanaged: period_s must be at least {MIN_PERIOD_S} s, "
                                               f"not {settings.period_s}")
        if settings.min_cores > len(self.usable):
            raise RpcError(rpc.INVALID_PARAMS, f"register_unmanaged: min_cores {settings.min_cores} is more than "
                                               f"the {len(self.usable)} CPUs of this machine")
        return settings

    async def _shared_taskstats(self) -> TaskstatsReader | None:
        """One taskstats reader for every group that reads delays (None: the /proc fallback).
        Opened in a worker thread: pyroute2 resolves the family with an event loop of its own."""
        if not self._taskstats_tried:
            self._taskstats_tried = True
            self._taskstats = await asyncio.get_running_loop().run_in_executor(None, open_reader)
        return self._taskstats

    @staticmethod
    def open(pids: list[int] | None, cgroup: str | None) -> CgroupGroup | PidTreeGroup:
        """The group a request names, opened once: a cgroup's directory is held from here on, so
        that the owner checked (`owner_of`) is the owner of the cgroup used (issue 47)."""
        try:
            return open_group(pids=pids, cgroup=cgroup)
        except ElasticError as err:
            raise RpcError(rpc.INVALID_PARAMS, f"register_unmanaged: {err}") from None

    async def register(self, conn: Connection, name: str | None, group: CgroupGroup | PidTreeGroup,
                       settings: ElasticSettings) -> dict[str, Any]:
        """Admit ``group`` (from `open`, checked by the caller), all or nothing: checks, admission,
        pin, SKB facts, then its timer.  A refusal closes the group."""
        try:
            return await self._register(conn, name, group, settings)
        except BaseException:
            if not any(g.runner.group is group for g in self.groups.values()):
                group.close()
            raise

    async def _register(self, conn: Connection, name: str | None, group: CgroupGroup | PidTreeGroup,
                        settings: ElasticSettings) -> dict[str, Any]:
        if name is None:
            name = default_name(group)
        problem = name_problem(name)
        if problem is not None:
            raise RpcError(rpc.INVALID_PARAMS, f"register_unmanaged: group name {name!r} {problem}")
        self.rm.admission.refuse_taken(name)  # again under the allocation lock, where it counts
        clash = self._clash(group)
        if clash is not None:
            raise RpcError(rpc.ALREADY_EXISTS, f"register_unmanaged: {clash}")
        uid = conn.peer.uid
        owner = owner_of(group)
        if owner is None:
            owner = uid  # the process or cgroup went meanwhile: the registration fails below
        why = self.rm.admission.group_refusal(conn, [g.settings.min_cores for g in self.groups.values()
                                                     if g.owner_uid == uid], settings.min_cores)
        if why is not None:
            raise RpcError(rpc.PERMISSION_DENIED, f"elastic group {name!r}: {why}")
        may_pin = None if conn.privileged else (lambda pid: _uid_of(pid) == uid)
        try:
            runner = ElasticRunner(name, group, self.rm.machine, self.enforcer, settings, limits=lambda: self._limits(name),
                                   allowed_cpus=self.usable, events=None,
                                   taskstats=await self._shared_taskstats() if settings.metric == "cpu_demand" else None,
                                   may_pin=may_pin, history=HISTORY, enforcer_task=name, open_taskstats=False)
        except ElasticError as err:
            raise RpcError(rpc.INVALID_PARAMS, f"register_unmanaged: {err}") from None
        g = ManagedGroup(name, owner, runner, settings, registered_by=uid)
        # Where the mode would start it: on CPUs nobody holds if there are enough, else anywhere
        # (the allocator then takes them back from a task, which is told and acknowledges).
        limits = self._limits(name)
        if not limits.available or len(limits.available) < settings.min_cores:
            limits = controller.Limits()
        g.want = controller.start(runner.layout, settings, limits, runner.pages_now(True))[0].cpus
        try:
            runner.start(cpus=())  # the baseline sample; its CPUs come from the allocation
        except ElasticError as err:  # it ended meanwhile
            g.release()
            raise RpcError(rpc.NOT_FOUND, f"register_unmanaged: {err}") from None
        try:
            grant = await self.rm.admission.admit_group(g, lambda cpus: self._facts(g, cpus))
        except BaseException:
            g.release()
            raise
        self.groups[name] = g
        g.facts_written = self._facts(g, grant)
        loop = asyncio.get_running_loop()
        g.deadline = loop.time() + settings.period_s
        g.timer = loop.call_at(g.deadline, self._tick, g)
        log.info("elastic group %s (%s, uid %d's) registered by uid %d: mode %s, metric %s, CPUs %s%s", name,
                 group.describe(), owner, uid, runner.mode, settings.metric, ",".join(map(str, grant)) or "none yet",
                 f"; {runner.notes[0]}" if runner.notes else "")
        self.rm.events.emit("facts_changed", {"scope": "system", "app": None, "op": "add", "predicates": ["elastic_group"]})
        return g.describe()

    def _clash(self, group: CgroupGroup | PidTreeGroup) -> str | None:
        """Why ``group`` would overlap what the daemon manages already (two pinnings of one process
        would each record the other's mask as the original), or None."""
        mine = group.pids()
        for g in self.groups.values():
            other = g.runner.group
            if isinstance(group, CgroupGroup) and isinstance(other, CgroupGroup) and other.identity == group.identity:
                return f"{group.describe()} is already managed as elastic group {g.name!r}"
            both = mine & g.members()
            if both:
                return f"process {min(both)} is already managed as elastic group {g.name!r}"
        return self.task_clash(mine)

    def task_clash(self, pids: set[int]) -> str | None:
        for task in self.rm.tasks():
            both = pids & set(task.pids())
            if both:
                return f"process {min(both)} is registered as task {task.name!r}"
        return None

    def member_clash(self, pid: int) -> str | None:
        """Why ``pid`` may not be registered as a task: it is a member of an elastic group."""
        for g in self.groups.values():
            if pid in g.members():
                return f"process {pid} is managed as elastic group {g.name!r}"
        return None

    def _limits(self, name: str) -> controller.Limits:
        pub = self.rm.publisher
        return limits_for(name, self.usable, pub.holdings(), pub.plan(),
                          pub.last_plan.unavailable if pub.last_plan is not None else ())

    def _facts(self, g: ManagedGroup, cpus: tuple[int, ...]) -> dict[str, list[str]]:
        """The group's facts as they will be with ``cpus``."""
        from cod.rm.elastic.facts import group_facts

        state = g.runner.state
        assert state is not None
        if set(cpus) != set(state.cpus):
            state, _ = controller.follow(state, cpus)
        return group_facts(g.name, g.runner.group.fact_source(), g.settings, state, g.runner.last_load)

    # ---- finding and removing ----------------------------------------------------------------
    def find(self, name: str | None = None, pid: int | None = None, cgroup: str | None = None) -> ManagedGroup:
        """The group named, or whose pids include ``pid`` (given ones first), or of ``cgroup``."""
        if name is not None:
            g = self.groups.get(name)
            if g is None:
                raise RpcError(rpc.NOT_FOUND, f"no elastic group named {name!r}")
            return g
        if cgroup is not None:
            return self._of_cgroup(cgroup)
        assert pid is not None
        for g in self.groups.values():
            if isinstance(g.runner.group, PidTreeGroup) and pid in g.runner.group.roots:
                return g
        for g in self.groups.values():
            if pid in g.members():
                return g
        raise RpcError(rpc.NOT_FOUND, f"no elastic group holds process {pid}")

    def _of_cgroup(self, cgroup: str) -> ManagedGroup:
        """The group of the directory ``cgroup`` names now (by identity: a v1 cgroup renamed since its
        registration is still found, and another one given its old name is not taken for it); by
        path when it cannot be opened (removed, or a symbolic link)."""
        try:
            held = HeldDir.open(cgroup)
            identity, path = held.identity, held.path
            held.close()
        except PathRefused:
            identity, path = None, os.path.realpath(cgroup)
        for g in self.groups.values():
            group = g.runner.group
            if isinstance(group, CgroupGroup) and (group.identity == identity if identity else group.path == path):
                return g
        raise RpcError(rpc.NOT_FOUND, f"no elastic group of cgroup {path}")

    async def remove(self, g: ManagedGroup, reason: str) -> dict[str, Any]:
        """The group leaves: its processes get their affinity back, others get its CPUs."""
        if self.groups.get(g.name) is not g:
            raise RpcError(rpc.NOT_FOUND, f"elastic group {g.name!r} has left")
        del self.groups[g.name]
        if g.timer is not None:
            g.timer.cancel()
            g.timer = None
        summary = {**g.describe(), "reason": reason, "periods": g.periods()}
        await self.rm.admission.forget_group(g.name, reason, patterns=g.runner.facts())
        self.rm.events.emit("facts_changed", {"scope": "system", "app": None, "op": "remove", "predicates": ["elastic_group"]})
        return summary

    # ---- each period --------------------------------------------------------------------------
    def _tick(self, g: ManagedGroup) -> None:
        g.timer = None
        if self.closed or self.rm.closing or self.groups.get(g.name) is not g:
            return
        loop = asyncio.get_running_loop()
        g.deadline += g.settings.period_s
        if g.deadline < loop.time():  # fell behind (a stalled machine): do not burst
            g.deadline = loop.time() + g.settings.period_s
        g.timer = loop.call_at(g.deadline, self._tick, g)  # first, so a failure does not stop it
        try:
            decision = g.runner.step()
        except ElasticError as err:  # e.g. no CPU available this period: try again next period
            if g.problem != str(err):
                log.warning("elastic group %s: %s (it holds its CPUs until that changes)", g.name, err)
            g.problem = str(err)
            return
        except Exception:
            log.exception("elastic group %s: period failed", g.name)
            return
        g.problem = None
        if decision is None:
            self._spawn(self._gone(g, g.runner.gone or "gone"))
            return
        if decision.changed:
            fired = " ".join(decision.evaluation.fired) if decision.evaluation else decision.action
            self.rm.admission.schedule(f"elastic group {g.name}: {fired} at {g.runner.last_load or 0:.0f} %")
        self._write_facts(g, loop.time())

    async def _gone(self, g: ManagedGroup, why: str) -> None:
        try:
            await self.remove(g, why)
        except RpcError:
            pass  # removed meanwhile

    def _write_facts(self, g: ManagedGroup, now: float) -> None:
        """Rewrite the group's facts when its cores, state or transitions changed, or its load
        moved by ``elastic_facts_load_step`` points; a steady group at most every
        ``elastic_facts_refresh_s`` (the daemon's settings)."""
        state, load = g.runner.state, g.runner.last_load or 0.0
        if state is None or g.writing:
            return
        last = g.runner.history[-1] if g.runner.history else None
        key = (state.cpus, state.last.state if state.last else None, last.fired if last else ())
        cfg = self.rm.cfg
        if (key == g.facts_key and abs(load - g.facts_load) < cfg.elastic_facts_load_step
                and now - g.facts_at < cfg.elastic_facts_refresh_s):
            return
        facts = g.runner.facts()
        changed = {p: f for p, f in facts.items() if g.facts_written.get(p) != f}
        g.facts_key, g.facts_load, g.facts_at = key, load, now
        if not changed:
            return
        g.writing = True

        async def write() -> None:
            # Through the publisher: the group's cores in these facts are ordered with allocated/2.
            try:
                if await self.rm.publisher.write(changed, f"writing the facts of elastic group {g.name}"):
                    g.writes += 1
                    if self.groups.get(g.name) is g:
                        g.facts_written.update(changed)
            finally:
                g.writing = False

        self._spawn(write())

    def _spawn(self, coro: Any) -> None:
        job = asyncio.get_running_loop().create_task(coro)
        self._jobs.add(job)
        job.add_done_callback(self._jobs.discard)

    # ---- reports and shutdown ----------------------------------------------------------------
    def listing(self) -> list[dict[str, Any]]:
        return [g.describe() for _, g in sorted(self.groups.items())]

    def close(self) -> None:
        """Stop the timers (the RM's close() gives the processes back, under its allocation lock)."""
        self.closed = True
        for g in self.groups.values():
            if g.timer is not None:
                g.timer.cancel()
                g.timer = None
        if self._taskstats is not None:
            self._taskstats.close()
            self._taskstats = None

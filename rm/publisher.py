"""The one publisher: owns the epoch state, and carries out every change of the allocation in order.

The rules are :mod:`.epochs`' (pure); this module applies them.  Every event
that moves cores (a plan adopted, an acknowledgement, a revocation deadline
passing) changes the :class:`~.epochs.EpochState` at once and queues its
:class:`~.epochs.Publication`; one task carries the queue out in order:

1. pin the tasks and elastic groups whose holdings changed;
2. write the SKB in one transaction: ``allocated/2``, ``allocation_epoch/1``,
   and any other fact that describes the allocation (``other_task/3``, the
   CPUs kept for busy processes), so a query never sees one without the other;
3. send the upcalls (``allocation_changed``), then run the hooks (conditions,
   the monitor's confinement of busy processes).

Other SKB writes that describe the allocation are queued with :meth:`Publisher.write`
and land in the same order as the publications.  A registration's own writes
(its application's facts and procedures, its task facts) are queued with
:meth:`Publisher.join` and written in the transaction of the publication that
admits it: one SKB round trip, and a write that fails leaves the epoch state,
the SKB and the pins as they were.  An acknowledgement never
waits for the SKB: it changes the state and queues its publication.  The
revocation deadlines are armed here from each publication's ``next_deadline``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from cod.skb import SKBError, codec
from cod.skb.codec import Op

from . import epochs
from .system_facts import allocation_facts
from .config import RMConfig
from .epochs import EpochState, Publication
from .events import Events
from .pinning import Pinning
from .allocator_runner import Plan
from .registry import Registry, Task

log = logging.getLogger("cod.rm")

CLOSE_WAIT_S = 3.0  # how long close() waits for the publications in flight
Writes = Mapping[str, list[str]]  # SKB pattern -> the facts that replace what it matches


Adoption = Callable[[Plan, Publication], tuple[Publication, Writes, Callable[[], None]]]


@dataclass
class Joining:
    """A newcomer's admission, carried out by the publisher in its order (:meth:`Publisher.join`)."""

    plan: Plan
    task: Task
    reason: str
    ops: list[Op]  # the registration's SKB writes, in the publication's transaction
    pinned: tuple[int, ...]  # what the newcomer is pinned to already
    adoption: Adoption  # the publication's other writes, and what to keep once it is written
    commit: Callable[[list[Any]], None]  # the registration is committed (given the batch's results)
    undo: Callable[[], None]  # the registration failed: undo what it did before (its pin)
    committed: bool = False


@dataclass
class _Queued:
    pub: Publication | None  # None: SKB writes only
    writes: Writes
    what: str
    done: asyncio.Future[Any]  # True when its SKB write succeeded (a join: its outcome)
    join: Joining | None = None


class Publisher:
    def __init__(self, cfg: RMConfig, machine: Any, skb: Any, registry: Registry, pinning: Pinning,
                 events: Events) -> None:
        self.cfg = cfg
        self.skb = skb
        self.registry = registry
        self.pinning = pinning
        self.events = events
        self.state = EpochState()
        self.last_plan: Plan | None = None
        self.last_announce_ns = 0  # time.monotonic_ns() of the last published epoch's upcalls
        self.groups: Mapping[str, Any] = {}  # elastic groups by name (cod.rm.demands.Demands.groups)
        self.after_pin: Callable[[Task], None] = lambda task: None  # a task was pinned again
        self.acknowledge_for: Callable[[str], bool] = lambda name: False  # names that have nobody to ask
        self.on_announced: list[Callable[[], None]] = []  # after the upcalls of a new epoch
        self.on_published: list[Callable[[], None]] = []  # after every publication (confinement)
        # MLS's decision for the plan (cod.rm.cache sets it where resctrl exists)
        self.cache_partition: Callable[[], str] = lambda: ""
        self._node_of = {pu.id: pu.numa_node for pu in machine.pus}
        self._allowed_mems = None if machine.allowed_mems is None else set(machine.allowed_mems)
        self._deadline_timer: asyncio.TimerHandle | None = None
        self._queue: asyncio.Queue[_Queued | None] = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._loop())
        self.closing = False

    # ---- the epoch state ---------------------------------------------------------------------
    @staticmethod
    def now() -> float:
        return asyncio.get_running_loop().time()

    @property
    def epoch(self) -> int:
        return self.state.epoch

    def holdings(self) -> dict[str, tuple[int, ...]]:
        """CPUs each task may run on now (announced plus those it has yet to give back)."""
        return self.state.holdings()

    def holdings_of(self, name: str) -> tuple[int, ...]:
        return self.state.holdings().get(name, ())

    def announced(self, name: str) -> tuple[int, ...]:
        return tuple(self.state.announced.get(name, ()))

    def plan(self) -> Mapping[str, tuple[int, ...]]:
        """The adopted plan: what each task and group is to hold once revocations end."""
        return self.state.plan

    def planned_cpus(self) -> set[int]:
        """Every CPU the adopted plan gives to some task or group."""
        return {c for cores in self.state.plan.values() for c in cores}

    def trial(self, plan: Plan, name: str, reason: str) -> tuple[int, ...]:
        """What ``name`` (joining) would hold at once if ``plan`` were adopted now; changes nothing."""
        assert plan.cores is not None
        _, pub = epochs.adopt(epochs.add_task(self.state, name), plan.cores, self.now(),
                              self.cfg.revoke_deadline_s, reason)
        return tuple(pub.holdings.get(name, ()))

    def adopt(self, plan: Plan, reason: str, join: str | None = None) -> Publication:
        """``plan`` becomes the current one (with ``join`` joining): the state changes at once;
        the caller queues the publication (:meth:`publish`) with no await in between."""
        assert plan.cores is not None
        state = epochs.add_task(self.state, join) if join is not None else self.state
        self.state, pub = epochs.adopt(state, plan.cores, self.now(), self.cfg.revoke_deadline_s, reason)
        self.last_plan = plan
        return pub

    def forget(self, name: str) -> None:
        self.state = epochs.forget(self.state, name)

    def acknowledge(self, name: str, epoch: int) -> list[int]:
        """``name`` gave back what was taken from it up to ``epoch``; returns the CPUs released."""
        self.state, released, pub = epochs.acknowledge(self.state, name, epoch, self.now())
        if not pub.empty:
            self.publish(pub)
        return list(released)

    # ---- the queue -----------------------------------------------------------------------------
    def publish(self, pub: Publication, *, already_pinned: dict[str, tuple[int, ...]] | None = None,
                writes: Writes | None = None) -> asyncio.Future[bool]:
        """Queue ``pub`` (with ``writes``, SKB facts written in its transaction); done when carried out."""
        if already_pinned:
            pub = dataclasses.replace(pub, repin={n: c for n, c in pub.repin.items() if already_pinned.get(n) != c})
        return self._put(pub, writes or {}, f"writing allocation epoch {pub.epoch} into the SKB")

    def write(self, writes: Writes, what: str) -> asyncio.Future[bool]:
        """Queue SKB writes that describe the allocation, ordered with the publications."""
        return self._put(None, writes, what)

    async def join(self, joining: Joining) -> None:
        """Admit a newcomer in the publisher's order: its plan is adopted on the epoch state of
        that moment, and the registration's writes and the publication's facts go in one SKB
        transaction.  Raises the write's SKBError after ``joining.undo()`` (nothing changed);
        returns once the newcomer's first allocation is announced.  The caller holds the
        allocation lock (no other plan is adopted meanwhile)."""
        done = self._put(None, {}, f"admitting task {joining.task.name}", joining)
        follow_up = await asyncio.shield(done)  # a cancelled caller does not undo a commit
        if follow_up is not None:
            await asyncio.shield(follow_up)

    def _put(self, pub: Publication | None, writes: Writes, what: str,
             join: Joining | None = None) -> asyncio.Future[Any]:
        done: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Queued(pub, dict(writes), what, done, join))
        return done

    async def _loop(self) -> None:
        while True:
            item = await self._queue.get()
            if item is None:
                return
            if item.join is not None:
                await self._joined(item)
                continue
            ok = False
            try:
                if item.pub is None:
                    ok = await self._write(item.writes, item.what)
                else:
                    ok = await self._carry_out(item.pub, item.writes, item.what)
            except Exception:
                log.exception("%s failed", item.what)
            finally:
                if not item.done.done():
                    item.done.set_result(ok)

    async def _write(self, writes: Writes, what: str) -> bool:
        if not writes:
            return True
        try:
            await self.skb.replace_many(dict(writes))
            return True
        except SKBError as err:
            log.warning("%s: %s", what, err)
            return False

    async def _carry_out(self, pub: Publication, writes: Writes, what: str) -> bool:
        """Pins first, then the SKB, then the upcalls: a query sent after an upcall sees its allocation."""
        self._pin(list(pub.repin), pub.repin)
        self._arm_deadline(pub.next_deadline)
        if pub.empty:
            ok = await self._write(writes, what)
        else:
            # A failed write is logged; the allocation stands and is announced.
            ok = await self._write({**allocation_facts(pub.epoch, pub.holdings), **writes}, what)
            self._announce(pub)
        self._after_publication()
        return ok

    # ---- a newcomer joins (Publisher.join) -----------------------------------------------------
    async def _joined(self, item: _Queued) -> None:
        joining = item.join
        assert joining is not None
        outcome = None
        try:
            outcome = await self._join(joining)
        except Exception as err:
            if not joining.committed:
                self._undo(joining)
                if not item.done.done():
                    item.done.set_exception(err)
                return
            log.exception("%s", item.what)  # admitted: only announcing it failed (as in _carry_out)
        except BaseException:  # the publisher is stopped in the middle of it
            if not joining.committed:
                self._undo(joining)
            item.done.cancel()
            raise
        if not item.done.done():
            item.done.set_result(outcome)

    @staticmethod
    def _undo(joining: Joining) -> None:
        try:
            joining.undo()
        except Exception:
            log.exception("undoing the admission of %s", joining.task.name)

    async def _join(self, joining: Joining) -> asyncio.Future[Any] | None:
        """Pins, then one SKB transaction (the registration's writes and the publication's facts),
        then the commit and the upcalls.  Returns the publication still to await, if any."""
        assert joining.plan.cores is not None
        name = joining.task.name
        base = self.state
        joined, pub = epochs.adopt(epochs.add_task(base, name), joining.plan.cores, self.now(),
                                   self.cfg.revoke_deadline_s, joining.reason)
        pub, writes, keep = joining.adoption(joining.plan, pub)
        # The epoch is reserved: an event meanwhile (an acknowledgement, a deadline, a task
        # leaving) numbers its publication after the one this transaction writes.
        reserved = dataclasses.replace(base, epoch=joined.epoch)
        self.state = reserved
        repinned = self._pin_joining(pub, joining)
        facts = writes if pub.empty else {**allocation_facts(pub.epoch, pub.holdings), **writes}
        try:
            results = await self.skb.batch([*joining.ops, *([codec.replace_many(facts)] if facts else [])])
        except BaseException:
            if self.state is reserved:
                self.state = base
            self._pin_back(repinned)
            raise
        keep()
        joining.committed = True
        joining.commit(results)
        if self.state is not reserved:
            # An event moved cores during the write: adopt on the state as it is now, behind the
            # publications it queued (their epochs come before this one).
            self._pin_back(repinned)
            self.state, pub = epochs.adopt(epochs.add_task(self.state, name), joining.plan.cores, self.now(),
                                           self.cfg.revoke_deadline_s, joining.reason)
            self.last_plan = joining.plan
            pub, writes, keep = joining.adoption(joining.plan, pub)
            keep()
            return self.publish(pub, already_pinned={name: joining.pinned} if joining.pinned else None,
                                writes=writes)
        self.state = joined
        self.last_plan = joining.plan
        self._arm_deadline(pub.next_deadline)
        if not pub.empty:
            self._announce(pub)
        self._after_publication()
        return None

    def _pin_joining(self, pub: Publication, joining: Joining) -> list[str]:
        """Pin what ``pub`` moves before its facts are written; returns the others pinned."""
        others = []
        for name, cores in pub.repin.items():
            if name == joining.task.name:
                if cores != joining.pinned and self.pinning.pin(joining.task, cores):
                    joining.pinned = cores
                continue
            others.append(name)
        self._pin(others, pub.repin)
        return others

    def _pin_back(self, names: list[str]) -> None:
        """Pin ``names`` to what the epoch state gives them now (a join's pins not kept)."""
        self._pin(names, self.state.holdings())

    def _pin(self, names: list[str], cores_of: Mapping[str, tuple[int, ...]]) -> None:
        for name in names:
            task = self.registry.tasks.get(name)
            if task is not None:
                if self.pinning.pin(task, cores_of.get(name, ())) and task.deployment is not None:
                    self.after_pin(task)  # apply() gave every thread the whole set
            elif name in self.groups:
                self.pinning.pin_group(self.groups[name], cores_of.get(name, ()))

    def _after_publication(self) -> None:
        for hook in self.on_published:
            try:
                hook()
            except Exception:
                log.exception("after publishing an allocation")

    def _announce(self, pub: Publication) -> None:
        self.last_announce_ns = time.monotonic_ns()
        for change in pub.changes:
            task = self.registry.tasks.get(change.task)
            if task is None:
                continue
            payload = self.allocation_of(task)
            payload.update(added=list(change.added), removed=list(change.removed),
                           reason=pub.task_reasons.get(change.task, pub.reason))
            if change.deadline_s is not None:
                payload["deadline_s"] = change.deadline_s
            self.events.emit("allocation_changed", payload)
        for hook in self.on_announced:
            hook()
        # A group the daemon drives has no client to ask: it gives back what the plan takes at once.
        for change in pub.changes:
            if change.removed and self.acknowledge_for(change.task):
                self.acknowledge(change.task, pub.epoch or self.state.epoch)
        log.info("epoch %d (%s): %s", pub.epoch, pub.reason,
                 ", ".join(f"{c.task}={epochs.ranges(c.cores)}" for c in pub.changes) or "holdings changed")

    # ---- revocation deadlines ------------------------------------------------------------------
    def _arm_deadline(self, when: float | None) -> None:
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        if when is not None and not self.closing:
            self._deadline_timer = asyncio.get_running_loop().call_at(when, self._on_deadline)

    def _on_deadline(self) -> None:
        self._deadline_timer = None
        self.state, pub = epochs.expire(self.state, self.now())
        if pub.empty:
            self._arm_deadline(self.state.next_deadline())
        else:
            log.info("a task did not release its CPUs in time; reassigning them")
            self.publish(pub)

    # ---- what a task is told -------------------------------------------------------------------
    def allocation_of(self, task: Task) -> dict[str, Any]:
        cores = self.announced(task.name)
        nodes = sorted({n for c in cores if (n := self._node_of.get(c)) is not None})
        memory = self.pinning.memory(task, cores)  # its CPUs' nodes, or more when its working set does not fit
        mems = [n for n in memory.nodes if self._allowed_mems is None or n in self._allowed_mems]
        return {
            "task": task.name,
            "app": task.app,
            "epoch": self.state.announced_epoch.get(task.name, 0),
            "cores": list(cores),
            "numa_nodes": nodes,
            "memory_nodes": mems,
            **({"memory_reason": memory.reason} if memory.reason else {}),
            "releasing": list(self.state.releasing(task.name)),
            "binding": list(self.last_plan.binding.get(task.name, ())) if self.last_plan else [],
        }

    def plan_summary(self) -> dict[str, Any]:
        """How the current plan was made: solver, status, time, and the CPUs kept for other work."""
        plan = self.last_plan
        return {
            "solver": plan.solver if plan else "none",
            "status": plan.status if plan else None,
            "solve_ms": round(plan.solve_ms, 3) if plan else None,
            "proof": plan.proof if plan else "",
            "unavailable": list(plan.unavailable) if plan else [],
            **({"cache_policy": plan.cache_policy} if plan and plan.cache_policy else {}),
            **({"cache_partition": self.cache_partition()} if self.cache_partition() else {}),
        }

    # ---- shutdown --------------------------------------------------------------------------------
    def stop_deadlines(self) -> None:
        self.closing = True
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None

    async def close(self) -> None:
        """Carry out what is queued (a bounded time), then stop."""
        self.stop_deadlines()
        self._queue.put_nowait(None)
        try:
            await asyncio.wait_for(self._task, CLOSE_WAIT_S)
        except (TimeoutError, asyncio.CancelledError):
            self._task.cancel()

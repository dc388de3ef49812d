"""The allocation's epochs as a pure state machine: (state, event, now) -> (new state, publication).

A plan from the allocator does not move cores at once.  When it takes
cores from task A for task B:

1. A is told (``removed``, with a deadline); B is not given them yet, and
   A still holds them (its pinning and the SKB's ``allocated/2`` say so);
2. when A acknowledges (:func:`acknowledge`) or the deadline passes
   (:func:`expire`), the cores move to B in a new epoch.

Every event returns the new :class:`EpochState` and a :class:`Publication`:
what to tell whom (``changes``), which tasks to pin again (``repin``), the
holdings to write into the SKB, and when the next deadline falls.  Nothing
here does I/O, so the rules are tested as tables (tests/rm/test_rm_epochs.py);
the ResourceManager carries publications out.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping

Cores = tuple[int, ...]


@dataclass(frozen=True)
class Revocation:
    """A core planned away from ``task``; the task holds it until it acks or ``deadline`` passes."""

    core: int
    task: str
    epoch: int
    deadline: float


@dataclass(frozen=True)
class EpochState:
    epoch: int = 0
    plan: Mapping[str, Cores] = field(default_factory=dict)  # the adopted plan
    announced: Mapping[str, Cores] = field(default_factory=dict)  # what each task was told it holds
    announced_epoch: Mapping[str, int] = field(default_factory=dict)  # the epoch of that announcement
    revocations: Mapping[int, Revocation] = field(default_factory=dict)  # core -> pending revocation
    published: Mapping[str, Cores] = field(default_factory=dict)  # holdings at the last publication

    def holdings(self) -> dict[str, Cores]:
        """Cores each task may run on now: what it was told, plus cores it has yet to give back."""
        held = {name: set(cores) for name, cores in self.announced.items()}
        for core, rev in self.revocations.items():
            if rev.task in held:
                held[rev.task].add(core)
        return {name: tuple(sorted(cores)) for name, cores in held.items()}

    def releasing(self, task: str) -> Cores:
        return tuple(sorted(c for c, r in self.revocations.items() if r.task == task))

    def next_deadline(self) -> float | None:
        return min((r.deadline for r in self.revocations.values()), default=None)


@dataclass(frozen=True)
class Change:
    """What one task is told in a publication."""

    task: str
    cores: Cores  # its new announcement
    added: Cores
    removed: Cores
    deadline_s: float | None  # time left to give ``removed`` back, when it is not empty


@dataclass(frozen=True)
class Publication:
    epoch: int | None  # the new epoch, or None when nothing changed
    reason: str
    changes: tuple[Change, ...] = ()
    holdings: Mapping[str, Cores] = field(default_factory=dict)  # every task's holdings now
    repin: Mapping[str, Cores] = field(default_factory=dict)  # tasks whose holdings changed
    next_deadline: float | None = None
    # tasks whose change has a reason of its own (an unregistered process took their CPUs)
    task_reasons: Mapping[str, str] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return self.epoch is None


def add_task(state: EpochState, task: str) -> EpochState:
    """A task joins holding nothing (its cores come with the next plan)."""
    if task in state.announced:
        return state
    return replace(state, announced={**state.announced, task: ()}, announced_epoch={**state.announced_epoch, task: 0})


def forget(state: EpochState, task: str) -> EpochState:
    """A task left: it holds nothing and owes nothing any more."""
    def without(m: Mapping[str, object]) -> dict:
        return {k: v for k, v in m.items() if k != task}

    return replace(
        state,
        plan=without(state.plan), announced=without(state.announced),
        announced_epoch=without(state.announced_epoch), published=without(state.published),
        revocations={c: r for c, r in state.revocations.items() if r.task != task},
    )


def adopt(state: EpochState, plan: Mapping[str, Iterable[int]], now: float, grace_s: float,
          reason: str) -> tuple[EpochState, Publication]:
    """Adopt a new plan for the tasks of ``state``: cores it takes away are revoked with a deadline."""
    tasks = set(state.announced)
    new_plan = {name: tuple(sorted(plan.get(name, ()))) for name in tasks}
    deadline = now + grace_s
    next_epoch = state.epoch + 1
    revs = dict(state.revocations)
    for name in tasks:
        planned = set(new_plan[name])
        for core in set(state.announced[name]) - planned:
            if core not in revs:
                revs[core] = Revocation(core, name, next_epoch, deadline)
        for core in planned:
            if core in revs and revs[core].task == name:
                del revs[core]  # taken back before it was given away
    revs = {c: r for c, r in revs.items() if r.task in tasks}
    return _announce(replace(state, plan=new_plan, revocations=revs), now, reason)


def acknowledge(state: EpochState, task: str, epoch: int, now: float) -> tuple[EpochState, Cores, Publication]:
    """``task`` no longer uses the cores taken from it up to ``epoch``: they move on now."""
    released = tuple(sorted(c for c, r in state.revocations.items() if r.task == task and r.epoch <= epoch))
    if not released:
        return state, (), Publication(None, "", holdings=state.holdings(), next_deadline=state.next_deadline())
    revs = {c: r for c, r in state.revocations.items() if c not in released}
    new, pub = _announce(replace(state, revocations=revs), now, f"task {task} released CPUs {ranges(released)}")
    return new, released, pub


def expire(state: EpochState, now: float) -> tuple[EpochState, Publication]:
    """Revocations whose deadline has passed end: the cores move on without the task's ack."""
    expired = [c for c, r in state.revocations.items() if r.deadline <= now + 1e-3]
    if not expired:
        return state, Publication(None, "", holdings=state.holdings(), next_deadline=state.next_deadline())
    revs = {c: r for c, r in state.revocations.items() if c not in expired}
    return _announce(replace(state, revocations=revs), now, "revocation deadline passed")


def _announce(state: EpochState, now: float, reason: str) -> tuple[EpochState, Publication]:
    """Tell every task whose usable cores changed; a new epoch when anything changed."""
    revs = state.revocations
    announced = dict(state.announced)
    changed: list[tuple[str, Cores, Cores]] = []
    for name in sorted(announced):
        grant = tuple(c for c in state.plan.get(name, ()) if c not in revs or revs[c].task == name)
        if grant != announced[name]:
            changed.append((name, announced[name], grant))
            announced[name] = grant
    state = replace(state, announced=announced)
    after = state.holdings()
    before = state.published
    if not changed and before == after:
        return state, Publication(None, reason, holdings=after, next_deadline=state.next_deadline())
    epoch = state.epoch + 1
    announced_epoch = dict(state.announced_epoch)
    changes = []
    for name, old, grant in changed:
        announced_epoch[name] = epoch
        removed = tuple(sorted(set(old) - set(grant)))
        deadline_s = None
        if removed:
            pending = [revs[c].deadline for c in removed if c in revs]
            deadline_s = round(max(0.0, min(pending, default=now) - now), 3)
        changes.append(Change(name, grant, tuple(sorted(set(grant) - set(old))), removed, deadline_s))
    repin = {name: cores for name, cores in after.items() if before.get(name) != cores}
    new = replace(state, epoch=epoch, announced_epoch=announced_epoch, published=after)
    return new, Publication(epoch, reason, tuple(changes), after, repin, new.next_deadline())


def ranges(cpus: Iterable[int]) -> str:
    """CPUs as a Linux cpulist ("0-3,8"), "none" when empty."""
    from cod.facts.cpulist import format_cpulist

    text = format_cpulist(sorted(cpus))
    return text or "none"

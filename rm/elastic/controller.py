"""The elastic policy of one group: (state, measurement, cap) -> (new state, decision). Pure.

Each period:

1. Limits first.  CPUs the group holds that it may no longer use (taken by the
   global allocation, gone from the layout) are dropped; if it then holds more
   than ``n_cap`` = min(its maximum, the external cap, the CPUs it may use),
   the surplus is revoked (mode's release order); if fewer than its minimum,
   CPUs are added back.  The net does not fire in such a period: the change
   came from outside, not from the group's load.
2. Otherwise the Petri net evaluates the measured load (`petrinet.evaluate`):
   t5 allocates one CPU, t4 releases one, chosen by the mode (`modes`).

The decision names the CPUs before and after, so the caller (the standalone
runner now, the RM's loop later) only has to enforce ``after`` when it differs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from . import petrinet
from .errors import ElasticError
from .modes import Layout, choose_grant, choose_release
from .petrinet import Bounds, Evaluation, Marking, Thresholds
from .settings import ElasticSettings

HOLD, ALLOCATE, RELEASE, REVOKE, RESTORE, MOVE = "hold", "allocate", "release", "revoke", "restore", "move"


@dataclass(frozen=True)
class Firing:
    transition: str  # t0..t7
    at: float  # time of the measurement that made it fire (seconds since the epoch)


@dataclass(frozen=True)
class GroupState:
    cpus: tuple[int, ...]  # held, in the order they were allocated
    marking: Marking
    firings: tuple[Firing, ...] = ()  # the most recent ones, oldest first
    last: Evaluation | None = None
    periods: int = 0

    @property
    def n(self) -> int:
        return len(self.cpus)


@dataclass(frozen=True)
class Observation:
    at: float  # when measured (seconds since the epoch)
    load: float  # the metric, percent of the CPUs held during the period
    pages: Mapping[int, int] | None = None  # resident pages per node (adaptive mode)


@dataclass(frozen=True)
class Limits:
    """What the global allocation allows: at most ``cap`` CPUs, taken from ``available``."""

    cap: int | None = None  # None: no external cap
    available: frozenset[int] | None = None  # None: every CPU of the layout; held CPUs must be in it


@dataclass(frozen=True)
class Decision:
    action: str  # hold | allocate | release | revoke | restore | move
    before: tuple[int, ...]
    after: tuple[int, ...]
    evaluation: Evaluation | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def changed(self) -> bool:
        return set(self.before) != set(self.after)


def bounds_for(n_usable: int, settings: ElasticSettings, limits: Limits) -> Bounds:
    """n_min and n_cap; the external cap wins over the group's minimum, one CPU always."""
    cap = n_usable
    if settings.max_cores is not None:
        cap = min(cap, settings.max_cores)
    if limits.cap is not None:
        cap = min(cap, limits.cap)
    cap = max(1, cap)
    return Bounds(n_min=max(1, min(settings.min_cores, cap)), n_cap=cap)


def _available(layout: Layout, limits: Limits) -> frozenset[int]:
    return layout.cpus if limits.available is None else layout.cpus & limits.available


def start(layout: Layout, settings: ElasticSettings, limits: Limits = Limits(),
          pages: Mapping[int, int] | None = None) -> tuple[GroupState, Decision]:
    """A new group: its minimum of CPUs, placed by its mode."""
    available = _available(layout, limits)
    if not available:
        raise ElasticError("no CPU is available for the group")
    bounds = bounds_for(len(available), settings, limits)
    cpus: list[int] = []
    for _ in range(bounds.n_min):
        cpu = choose_grant(layout, settings.mode, cpus, available, pages)
        if cpu is None:
            break
        cpus.append(cpu)
    state = GroupState(cpus=tuple(cpus), marking=petrinet.initial_marking(len(cpus)))
    return state, Decision(RESTORE, (), tuple(cpus))


def begin(cpus: Sequence[int]) -> GroupState:
    """A group that starts on ``cpus`` chosen elsewhere (the RM's allocator); () until it gets some."""
    cpus = tuple(dict.fromkeys(cpus))
    return GroupState(cpus=cpus, marking=petrinet.initial_marking(len(cpus)) if cpus else (0, 0, 0, 0, 0))


def follow(state: GroupState, cpus: Sequence[int], load: float = 0.0) -> tuple[GroupState, Decision]:
    """The global allocation moved the group to ``cpus``: the state follows and the net does not
    fire (the change came from outside).  CPUs it keeps keep their order; new ones come last."""
    kept = [c for c in state.cpus if c in set(cpus)]
    after = tuple(kept + [c for c in dict.fromkeys(cpus) if c not in set(kept)])
    before = state.cpus
    if len(after) < len(before):
        action = REVOKE
    elif len(after) > len(before):
        action = RESTORE
    else:
        action = HOLD if set(after) == set(before) else MOVE
    marking = petrinet.initial_marking(len(after), load) if after else (0, 0, 0, 0, 0)
    new = GroupState(cpus=after, marking=marking, firings=state.firings, last=state.last, periods=state.periods)
    notes = () if action == HOLD else (f"the global allocation gives the group CPUs {sorted(after)}",)
    return new, Decision(action, before, after, None, notes)


def step(state: GroupState, obs: Observation, limits: Limits, layout: Layout,
         settings: ElasticSettings) -> tuple[GroupState, Decision]:
    """One period of the policy; see the module's docstring."""
    available = _available(layout, limits)
    if not available:
        raise ElasticError("no CPU is available for the group")
    bounds = bounds_for(len(available), settings, limits)
    before = state.cpus
    held = [c for c in before if c in available]
    notes: list[str] = []
    if len(held) < len(before):
        notes.append(f"CPUs {sorted(set(before) - set(held))} are no longer available")
    action = REVOKE if len(held) < len(before) else HOLD
    while len(held) > bounds.n_cap:
        cpu = choose_release(layout, settings.mode, held, obs.pages)
        assert cpu is not None
        held.remove(cpu)
        action = REVOKE
    while len(held) < bounds.n_min:
        cpu = choose_grant(layout, settings.mode, held, available, obs.pages)
        if cpu is None:
            break
        held.append(cpu)
        action = RESTORE
    if action != HOLD:
        new = GroupState(cpus=tuple(held), marking=petrinet.initial_marking(len(held), obs.load),
                         firings=state.firings, last=state.last, periods=state.periods + 1)
        return new, Decision(action, before, tuple(held), None, tuple(notes))

    th = Thresholds(settings.th_min, settings.th_max)
    marking = state.marking[:4] + (len(held),)
    ev = petrinet.evaluate(marking, obs.load, th, bounds)  # type: ignore[arg-type]
    if ev.delta > 0:
        cpu = choose_grant(layout, settings.mode, held, available, obs.pages)
        if cpu is None:  # cannot happen: n_cap counts only available CPUs
            raise ElasticError(f"t5 fired with {len(held)} of {bounds.n_cap} CPUs but none is free")
        held.append(cpu)
        action = ALLOCATE
    elif ev.delta < 0:
        cpu = choose_release(layout, settings.mode, held, obs.pages)
        assert cpu is not None
        held.remove(cpu)
        action = RELEASE
    firings = (state.firings + tuple(Firing(t, obs.at) for t in ev.fired))[-settings.history:]
    new = GroupState(cpus=tuple(held), marking=ev.after, firings=firings, last=ev, periods=state.periods + 1)
    return new, Decision(action, before, tuple(held), ev, tuple(notes))

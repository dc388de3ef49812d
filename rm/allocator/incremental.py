"""Re-planning one change from the published allocation (issue #19).

The RM re-plans after every arrival, departure or newcomer process, with the
allocation it published as ``current``.  :class:`Allocator` keeps that
allocation as counts per class (:class:`.packing._State`) and, when exactly
one task (or one unregistered process) came or went, changes only what the
change needs:

* departure: the task's CPUs are freed; tasks that can grow take them, level
  by level, those already in the freed classes' domain first;
* arrival: the newcomer takes free capacity (best fit, as the packing
  does); short of its ``min_cores`` (or, when it has a higher priority than
  someone, of its cap) it takes the CPUs tasks of a lower level - or, for
  its ``min_cores`` only, of its own level - hold beyond their ``min_cores``:
  the lowest level first, tasks that are not sensitive first, the one with
  the most to spare first (fewest tasks touched);

then maps only the classes whose counts changed (every other CPU stays
where it is) and proves the answer where it can:

* an arrival that took nothing from anyone, moved no CPU of anyone (the
  mapping of a changed class may shuffle the CPUs of tasks in it: checked,
  found by the comparison with the full solve on a 80-PU topology), reached
  its cap and spans the fewest nodes / domains its cap needs, after an
  allocation that was proven optimal, is optimal (every allocation of the new
  tasks restricted to the old ones is one of the old problem, so none does
  better on O2 and O3, and nothing moved);
* otherwise the waterfill bound (:mod:`.waterfill`) where it is cheap:
  equal means optimal.

Unproven (a repair within 1 % of the bound included), the full solve runs in
the time left and the better answer is returned: so the answer is the full
solve's, or one with the same objective proven optimal, or (the full solve
out of time) a better one.  Explanations (bindings) are optional (``explain=False``): the
upcalls wait on the CPUs, not on the explanation, which
:meth:`Allocator.explain` computes afterwards.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Iterable, Mapping, Sequence

from cod.facts.model import Machine

from .bounds import fewest, task_caps
from .explain import explain
from .mapping import map_counts
from .model import SOLVERS, AllocationResult, OtherDemand, RepairError, TaskSpec
from .packing import _place, _State
from .problem import is_other, moves, objective, priority_levels, violations
from .request import Request, prepare, result, solve
from .solve import Outcome
from .topology import View
from .waterfill import Fill, waterfill_bound


@dataclass
class _Published:
    """What the last call returned (and the RM is assumed to have published)."""

    view: View
    specs: dict[str, TaskSpec]  # registered tasks and others (OtherSpec), by name
    current: dict[str, tuple[int, ...]]  # the current allocation that call was given (others: where they ran)
    alloc: dict[str, list[int]]
    status: str
    state: _State


class Allocator:
    """The allocator the RM keeps between calls (one per machine).

    ``allocate`` takes the same arguments as :func:`cod.rm.allocator.allocate`
    (plus ``explain``) and returns the same result; when the tasks differ from
    the last call's by one arrival or one departure and ``current`` is what
    that call returned, it re-plans incrementally (see the module doc).
    """

    def __init__(self, machine: Machine, *, solver: str = "cpsat", time_limit_s: float = 1.0) -> None:
        if solver not in SOLVERS:
            raise ValueError(f"solver: must be one of {', '.join(SOLVERS)}, got {solver!r}")
        self.machine = machine
        self.solver = solver
        self.time_limit_s = time_limit_s
        self._last: _Published | None = None
        self._caps: dict[tuple[int, TaskSpec, bool], int] = {}  # (view, task, another task pollutes) -> cap

    def allocate(self, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]] | None = None, *,
                 others: Sequence[OtherDemand] = (), unavailable: Iterable[int] = (),
                 time_limit_s: float | None = None, explain: bool = True) -> AllocationResult:
        start = time.perf_counter()
        limit = self.time_limit_s if time_limit_s is None else time_limit_s
        req = prepare(self.machine, tasks, current, others, unavailable)
        out = None
        if self.solver == "cpsat" and self._last is not None:
            out = self._repaired(req, start + limit)
        if out is None:
            out = solve(req, self.solver, max(0.001, limit - (time.perf_counter() - start)))
        return self._remember(req, out, start, explain)

    def repair(self, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]] | None = None, *,
               others: Sequence[OtherDemand] = (), unavailable: Iterable[int] = (),
               explain: bool = True) -> AllocationResult | None:
        """:meth:`allocate`'s answer when the incremental repair proves it (no solve runs, so
        this is cheap and bounded: the daemon calls it on its event loop); None, and nothing
        remembered, when only the full solve could answer (call :meth:`allocate` then)."""
        if self.solver != "cpsat" or self._last is None:
            return None
        start = time.perf_counter()
        req = prepare(self.machine, tasks, current, others, unavailable)
        out = self._repaired(req, None)
        return None if out is None else self._remember(req, out, start, explain)

    def _repaired(self, req: Request, deadline: float | None) -> "_Incremental | None":
        """:meth:`_incremental`, whose failure is a bug of the repair, never bad input: that
        :func:`prepare` has refused already (so the daemon does not refuse an admission for it)."""
        try:
            return self._incremental(req, deadline)
        except Exception as err:
            self._last = None
            raise RepairError(f"the incremental repair failed: {err!r}") from err

    def _remember(self, req: Request, out: "_Incremental | Outcome", start: float, explain: bool) -> AllocationResult:
        """``out`` becomes the last answer (when it is an allocation); the result of the call."""
        if out.alloc is not None:
            state = out.state if isinstance(out, _Incremental) else _State.of(req.view, req.everyone, out.alloc)
            self._last = _Published(req.view, {t.name: t for t in req.everyone}, dict(req.current),
                                    {k: list(v) for k, v in out.alloc.items()}, out.status, state)
        return result(req, out.outcome if isinstance(out, _Incremental) else out, start, explain)

    def explain(self, res: AllocationResult) -> AllocationResult:
        """``res`` (from :meth:`allocate` with ``explain=False``, the last call)
        with every task's binding constraints."""
        last = self._last
        if last is None or res.status == "infeasible":
            return res
        everyone = list(last.specs.values())
        n_unavailable = len(self.machine.cpu_ids()) - len(last.view.cpus)
        explained = explain(last.view, everyone, last.alloc, n_unavailable, last.current)
        return replace(res, tasks=explained)

    def fork(self) -> "Allocator":
        """An allocator with the same last answer, to plan a change without
        committing to it (an admission that may be refused; benchmarks)."""
        other = Allocator(self.machine, solver=self.solver, time_limit_s=self.time_limit_s)
        if self._last is not None:
            other._last = replace(self._last, state=self._last.state.copy())
        other._caps = self._caps  # shared: caps depend on the view and the task only
        return other

    def reset(self, tasks: Sequence[TaskSpec] | None = None, published: Mapping[str, Sequence[int]] | None = None,
              *, unavailable: Iterable[int] = ()) -> None:
        """Forget the last call, or take ``published`` (an allocation of
        ``tasks``, e.g. after a restart) as the last answer, unproven (proven
        when ``tasks`` is empty: the daemon with no task)."""
        if tasks is None or published is None:
            self._last = None
            return
        req = prepare(self.machine, tasks, published, (), unavailable)
        alloc = {t.name: sorted(published.get(t.name, ())) for t in req.everyone}
        status = "feasible" if req.everyone else "optimal"  # no task: the empty allocation is the only one
        self._last = _Published(req.view, {t.name: t for t in req.everyone}, dict(req.current), alloc, status,
                                _State.of(req.view, req.everyone, alloc))

    # ---- the incremental path ------------------------------------------------------------

    def _incremental(self, req: Request, deadline: float | None) -> "_Incremental | None":
        """The repaired answer, or None when the full solve must answer.  ``deadline`` None:
        an unproven repair is not finished by a solve here (None is returned)."""
        last = self._last
        if req.view is not last.view:
            return None
        now = {t.name: t for t in req.everyone}
        added = [t for n, t in now.items() if n not in last.specs]
        gone = [n for n in last.specs if n not in now]
        if len(added) + len(gone) > 1 or any(now[n] != last.specs[n] for n in now if n in last.specs):
            return None
        for name, t in now.items():  # current must be what we published
            if name not in last.specs:
                continue
            cur = set(req.current.get(name, ()))
            if is_other(t):
                if cur != set(last.current.get(name, ())) and not cur <= set(last.alloc.get(name, ())):
                    return None
            elif cur != set(last.alloc.get(name, ())):
                return None
        view = req.view
        st = last.state.copy()
        if not added and not gone:
            return _Incremental(Outcome(last.alloc, None, last.status, "cpsat", via="unchanged"), st)
        if gone:
            changed = self._departure(view, st, last.specs[gone[0]], req)
            victims = 0
        else:
            got = self._arrival(view, st, added[0], req)
            if got is None:
                return None
            changed, victims = got
        tasks = req.everyone
        alloc = {name: list(cpus) for name, cpus in last.alloc.items() if name in now}
        if changed:
            mapped = map_counts(view, tasks, req.current, st.counts, st.cores, classes=changed)
            class_of = {c: g.index for g in view.classes for c in g.cpus}
            for t in tasks:
                keep = [c for c in alloc.get(t.name, ()) if class_of.get(c) not in changed]
                alloc[t.name] = sorted(keep + mapped[t.name])
        broken = violations(view, tasks, alloc)
        if broken:
            return None  # the repair could not be mapped: the full solve decides
        value = objective(view, tasks, alloc, req.current)
        if (added and not victims and last.status == "optimal" and moves(tasks, alloc, req.current) == 0
                and self._newcomer_is_at_best(view, st, added[0], req)):
            return _Incremental(Outcome(alloc, None, "optimal", "cpsat", via="incremental: newcomer at its best"), st)
        wf = waterfill_bound(view, tasks, req.current)
        if isinstance(wf, Fill) and value == wf.objective:
            return _Incremental(Outcome(alloc, None, "optimal", "cpsat", via="incremental = waterfill bound"), st)
        # unproven (a repair within 1 % of the bound is not taken: it would differ from the full
        # solve's answer): the full solve in the time left, the better of the two
        if deadline is None:
            return None
        full = solve(req, "cpsat", max(0.001, deadline - time.perf_counter()))
        if full.alloc is not None and objective(view, tasks, full.alloc, req.current) >= value:
            return _Incremental(full, _State.of(view, tasks, full.alloc))
        return _Incremental(Outcome(alloc, None, "fallback", "cpsat", via="incremental (unproven)"), st)

    def _departure(self, view: View, st: _State, gone: TaskSpec, req: Request) -> set[int]:
        """Free the task's classes; tasks that can grow take them, highest level first."""
        freed = set(st.counts[gone.name])
        st.remove_task(gone.name)
        changed = set(freed)
        caps = self._cap_of(view, req.everyone)
        levels = priority_levels(req.everyone)
        freed_domains = {view.classes[gi].domain for gi in freed}
        for p in levels:
            growers = [t for t in req.everyone if t.priority == p
                       and sum(st.counts[t.name].values()) < caps(t)]
            # tasks already in a freed domain first (they do not spread), then insensitive ones
            growers.sort(key=lambda t: (not any(view.classes[gi].domain in freed_domains for gi in st.counts[t.name]),
                                        len(t.sensitive), t.name))
            for t in growers:
                want = caps(t) - sum(st.counts[t.name].values())
                for gi in sorted(freed, key=lambda gi: (gi not in st.counts[t.name], gi)):
                    if want <= 0:
                        break
                    k = min(want, st.avail(t, gi))
                    if k > 0:
                        st.take(t, gi, k)
                        want -= k
                        changed.add(gi)
        return changed

    def _arrival(self, view: View, st: _State, new: TaskSpec, req: Request) -> tuple[set[int], int] | None:
        """Place the newcomer: free capacity first, then what lower levels (or,
        for its min_cores, its own level) hold beyond their min_cores."""
        before = {gi: dict(st.shared[gi]) for gi in st.shared}
        st.add_task(new)
        cap = self._cap_of(view, req.everyone)(new)
        got = cap - _place(st, new, cap)
        changed = set(st.counts[new.name])
        victims = 0
        if got < cap:
            lower = [t for t in req.everyone if t.name != new.name and
                     (t.priority < new.priority or (got < new.min_cores and t.priority == new.priority))]
            lower.sort(key=lambda t: (t.priority, bool(t.sensitive), -(sum(st.counts[t.name].values()) - t.min_cores),
                                      t.name))
            for v in lower:
                want = (cap if v.priority < new.priority else new.min_cores) - got
                spare = sum(st.counts[v.name].values()) - v.min_cores
                if want <= 0 or spare <= 0:
                    continue
                for gi in sorted(st.counts[v.name], key=lambda gi: -st.counts[v.name][gi]):
                    if want <= 0 or spare <= 0:
                        break
                    n_v = st.counts[v.name][gi]
                    give = min(n_v, spare, want)
                    st.set_count(v, gi, n_v - give)
                    k = min(want, st.avail(new, gi))
                    if k > 0:
                        st.take(new, gi, k)
                        got += k
                        want -= k
                        changed.add(gi)
                    # The newcomer could not use all of it: give the rest back, as far as it still
                    # fits (the newcomer's whole cores may have taken a core v kept a CPU of).
                    back = min(give - k, st.avail(v, gi))
                    if back > 0:
                        st.set_count(v, gi, st.counts[v.name].get(gi, 0) + back)
                    spare -= give - back
                    if k:
                        victims += 1
        if got < new.min_cores:
            return None
        changed |= {gi for gi in st.shared if st.shared[gi] != before.get(gi)}
        return changed, victims

    def _cap_of(self, view: View, everyone: Sequence[TaskSpec]):
        """t -> the most it can hold (:func:`.bounds.task_caps`), cached per
        task: only whether another task pollutes the cache matters across tasks."""
        if len(self._caps) > 100_000:
            self._caps.clear()
        polluters = [u for u in everyone if u.pollutes_cache]

        def cap(t: TaskSpec) -> int:
            other = [u for u in polluters if u.name != t.name][:1]
            key = (id(view), t, bool(other))
            if key not in self._caps:
                self._caps[key] = task_caps(view, [t] + other)[t.name][0]
            return self._caps[key]
        return cap

    def _newcomer_is_at_best(self, view: View, st: _State, new: TaskSpec, req: Request) -> bool:
        """The newcomer holds its cap, spans the fewest nodes / domains that
        cap needs, and (an other) keeps the CPUs it runs on: the restriction
        argument of the module doc applies."""
        caps = task_caps(view, [new] + [t for t in req.everyone if t.pollutes_cache and t.name != new.name][:1])
        cap, node_caps, dom_caps = caps[new.name]
        if sum(st.counts[new.name].values()) != cap:
            return False
        used = [view.classes[gi] for gi in st.counts[new.name]]
        if "numa" in new.sensitive and len({g.node for g in used}) > fewest(node_caps, cap):
            return False
        if "cache" in new.sensitive and len({g.domain for g in used}) > fewest(dom_caps, cap):
            return False
        if any(is_other(t) for t in req.everyone):
            return False  # O5-O7 (others) are not covered by the argument
        return True


@dataclass
class _Incremental:
    outcome: Outcome
    state: _State

    @property
    def alloc(self):
        return self.outcome.alloc

    @property
    def status(self):
        return self.outcome.status


"""Choosing and running the exact solvers, with the greedy allocator as fast path and fallback.

``cpsat`` (:func:`_solve_cpsat`):
1. Small instances (tasks x CPUs <= GREEDY_FIRST_PAIRS): the greedy
   allocator; if its objective reaches the closed-form :func:`upper_bound`, it
   is optimal (status "optimal", solver "greedy"; the paper's Table 4).
1b. The waterfill bound (:mod:`.waterfill`, no CP-SAT): greedy or the packing
   of its totals reaching it is optimal.
2. The relaxation bound (:func:`.bounds.relaxed_bound`: O2 per level proven,
   then lower bounds of O3 and O4) and a best-fit packing of its totals
   (:mod:`.packing`).  Packing == bound: "optimal" without search; O2 reached
   and O3/O4 gap <= ACCEPT_GAP: "feasible" with that gap.
3. Otherwise the count model (:mod:`.cpsat`) with the bound's levels and O3
   cut, seeded with the best allocation so far (packing or greedy), if the
   time left can build it; counts are mapped to CPUs (:mod:`.mapping`).
4. No better solution in time: the best so far, status "feasible" (O2
   proven, with gap) or "fallback".  Proven infeasible: "infeasible", reason
   from the greedy admission step.
``naive``: the Figure 4 matrix model (:mod:`.naive`), same fallback rules.
Every allocation is checked with :func:`.problem.violations`; a violation is a bug.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Mapping, Sequence

from .bounds import RelaxedBound, relaxed_bound, upper_bound
from .problem import is_other, n_tail, objective, violations
from .cpsat import solve_counts
from .explain import infeasibility_reason
from .greedy import solve_greedy
from .lns import improve
from .mapping import map_counts
from .packing import pack
from .waterfill import Fill, waterfill_bound
from .model import TaskSpec
from .naive import solve_naive
from .topology import View

Alloc = dict[str, list[int]]


@dataclass(frozen=True)
class Outcome:
    alloc: Alloc | None
    reason: str | None
    status: str
    solver: str  # the one whose allocation this is
    gap: float | None = None
    via: str = ""  # how it was found and proven (bench, debugging): see AllocationResult.via
    cache_policy: str = ""  # the locality decision (cod.rm.allocator.locality), set by request.solve


# Below this many (task, CPU) pairs the CPU-level greedy costs well under a
# millisecond, and its closed-form optimality proof makes Table 4 0.2-0.4 ms.
GREEDY_FIRST_PAIRS = 1024
# CPU-level greedy time per (task, CPU) pair (128 tasks x 384 CPUs: 75-90 ms).
GREEDY_S_PER_PAIR = 1.8e-6
# Build time of the count model per (task, class) pair, measured on 384 CPUs
# (128 tasks x 24 classes: 139 ms): no point starting it with less time left.
BUILD_S_PER_PAIR = 45e-6
# "optimal or with a proven gap under 1 %" (issue #5): a packed answer whose
# O2 is proven optimal and whose O3/O4 gap is at most this is returned at once.
ACCEPT_GAP = 0.01


def lexicographic_gap(value: tuple[int, ...], bound: tuple[int, ...], caps: int | Sequence[int]
                      ) -> float | None:
    """Relative gap of the terms after O2 once O2 is proven optimal (None otherwise).

    They are compared as the count model weighs them, exactly
    lexicographically: without others cost = (K + 1) * spread + moves, K =
    CPUs of the current allocation (``caps``); with others ``caps`` are the
    ranges of O4-O7 (:func:`tail_caps`) and each term weighs more than all
    later ones together.  gap = (cost - lower bound) / cost, 0 when optimal.
    """
    caps = [caps] if isinstance(caps, int) else list(caps)
    n = len(caps) + 1
    if value[:-n] != bound[:-n]:
        return None
    weights = [1]
    for c in reversed(caps):
        weights.insert(0, weights[0] * (c + 1))
    cost = sum(w * -v for w, v in zip(weights, value[-n:]))
    low = sum(w * -v for w, v in zip(weights, bound[-n:]))
    return max(0.0, (cost - low) / max(1, cost))


def tail_caps(tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]]) -> list[int]:
    """Ranges of O4 (and O5-O7 with others): the weights of :func:`lexicographic_gap`."""
    held = sum(len(set(current.get(t.name, ()))) for t in tasks if not is_other(t))
    if n_tail(tasks) == 2:
        return [held]
    others = [t for t in tasks if is_other(t)]
    sensitive = sum(("cache" in t.sensitive) + ("numa" in t.sensitive) for t in tasks)
    return [held, sum(1 for t in tasks if not is_other(t) and current.get(t.name)),
            len(others) * sensitive, sum(len(set(current.get(t.name, ()))) for t in others)]


def solve_exact(
    view: View,
    tasks: Sequence[TaskSpec],
    current: Mapping[str, Sequence[int]],
    solver: str,
    time_limit_s: float,
) -> Outcome:
    if solver == "cpsat":
        return _solve_cpsat(view, tasks, current, time_limit_s)
    greedy, reason = solve_greedy(view, tasks, current)
    status, alloc = solve_naive(view, tasks, current, time_limit_s)
    return _finish(view, tasks, current, solver, time_limit_s, status, alloc, greedy, reason, None)


def _solve_cpsat(view: View, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]],
                 time_limit_s: float) -> Outcome:
    """1. small instances: greedy, optimal if it reaches :func:`upper_bound`;
    2. the relaxation's bound and the best-fit packing of its totals: optimal
    when the packing reaches the bound, accepted when within ACCEPT_GAP;
    3. the count model, seeded with the best allocation so far and given the
    relaxation's levels and spread bound."""
    deadline = time.perf_counter() + time_limit_s
    done, greedy, reason = _closed_form_bounds(view, tasks, current)
    if done is not None:
        return done
    # the bound is what makes answers provable: it gets 60 % of the time
    rb = relaxed_bound(view, tasks, current, max(0.0, deadline - time.perf_counter()) * 0.6)
    if rb is None:
        if greedy is None:
            greedy, reason = solve_greedy(view, tasks, current)
        return Outcome(None, infeasibility_reason(view, tasks, reason), "infeasible", "cpsat",
                       via="relaxation infeasible")
    kept_cap = tail_caps(tasks, current)
    best: Alloc | None = None
    best_by = "cpsat"
    gap = None  # set when the packing reached the proven O2
    if isinstance(rb, RelaxedBound):
        best, gap, done = _packing_of_bound(view, tasks, current, rb, kept_cap, deadline)
        if done is not None:
            return done
    # Greedy as another candidate: not when O2 is proven (it can hardly help),
    # nor, if a packing exists, when it would overrun the time limit.
    if greedy is None and gap is None and (
            best is None or deadline - time.perf_counter() > GREEDY_S_PER_PAIR * len(tasks) * len(view.cpus)):
        greedy, reason = solve_greedy(view, tasks, current)
    if best is None or (greedy is not None and
                        objective(view, tasks, greedy, current) > objective(view, tasks, best, current)):
        best, best_by = greedy, "greedy"
    left = max(0.001, deadline - time.perf_counter())
    if best is not None and left < 2 * BUILD_S_PER_PAIR * len(tasks) * len(view.classes):
        # the count model could not even be built in the time left
        return Outcome(best, None, "feasible" if gap is not None else "fallback", best_by, gap,
                       via="no time for the count model")
    sol = solve_counts(view, tasks, current, left, hint=best,
                       bound=rb if isinstance(rb, RelaxedBound) else None)
    alloc = map_counts(view, tasks, current, sol.counts, sol.cores) if sol.status in ("optimal", "feasible") else None
    out = _finish(view, tasks, current, "cpsat", time_limit_s, sol.status, alloc, best, reason, sol.gap,
                  best_by)
    if isinstance(rb, RelaxedBound) and out.alloc is not None and out.status != "optimal":
        gap = lexicographic_gap(objective(view, tasks, out.alloc, current), rb.objective, kept_cap)
        if gap == 0:
            return Outcome(out.alloc, None, "optimal", out.solver, via="count model = relaxation bound")
        # the packing is a solution of ours, not a fallback, when its O2 is proven
        status = "feasible" if gap is not None else out.status
        return Outcome(out.alloc, None, status, out.solver, gap, via="count model, time limit")
    return out


def _closed_form_bounds(view: View, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]],
                        ) -> tuple[Outcome | None, Alloc | None, str | None]:
    """Steps 1 and 1b: (the optimal outcome if greedy or a packing reaches a bound computed
    without search, else None; greedy's allocation and reason, when it ran)."""
    greedy = reason = None
    greedy_obj = None
    if len(tasks) * len(view.cpus) <= GREEDY_FIRST_PAIRS:
        greedy, reason = solve_greedy(view, tasks, current)
        if greedy is not None:
            greedy_obj = objective(view, tasks, greedy, current)
            if greedy_obj == upper_bound(view, tasks, current):
                return Outcome(greedy, None, "optimal", "greedy", via="greedy = closed-form bound"), greedy, reason
    wf = waterfill_bound(view, tasks, current)
    if isinstance(wf, Fill):
        if greedy_obj == wf.objective:
            return Outcome(greedy, None, "optimal", "greedy", via="greedy = waterfill bound"), greedy, reason
        packed = pack(view, tasks, current, wf.totals, (wf.spread, wf.moves))
        if packed is not None and packed.complete:
            alloc = map_counts(view, tasks, current, packed.counts, packed.cores)
            if objective(view, tasks, alloc, current) == wf.objective:
                _check(view, tasks, alloc, "packing")
                return Outcome(alloc, None, "optimal", "cpsat", via="packing = waterfill bound"), greedy, reason
    return None, greedy, reason


def _packing_of_bound(view: View, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]],
                      rb: RelaxedBound, kept_cap: list[int], deadline: float,
                      ) -> tuple[Alloc | None, float | None, Outcome | None]:
    """Step 2: the best-fit packing of the relaxation's totals, improved by small neighbourhoods
    when its O3/O4 are above the bound.  (best allocation, its gap when O2 is reached, the outcome
    when it is optimal or within ACCEPT_GAP)."""
    packed = pack(view, tasks, current, rb.totals, (rb.spread, rb.moves))
    if packed is None:
        return None, None, None
    best = map_counts(view, tasks, current, packed.counts, packed.cores)
    _check(view, tasks, best, "packing")
    gap = lexicographic_gap(objective(view, tasks, best, current), rb.objective, kept_cap)
    if not packed.complete:
        gap = None  # a partial packing misses O2: only a hint and fallback
    if gap:  # O2 reached, O3/O4 above the bound: small neighbourhoods first
        left = deadline - time.perf_counter()
        counts, cores, n_better = improve(view, tasks, current, packed.counts, packed.cores,
                                          time.perf_counter() + min(left / 2, left - 0.015))
        if n_better:
            alloc = map_counts(view, tasks, current, counts, cores)
            _check(view, tasks, alloc, "neighbourhood search")
            better = lexicographic_gap(objective(view, tasks, alloc, current), rb.objective, kept_cap)
            if better is not None and better < gap:
                best, gap = alloc, better
    if gap == 0:
        return best, gap, Outcome(best, None, "optimal", "cpsat", via="packing = relaxation bound")
    if gap is not None and gap <= ACCEPT_GAP and len(tasks) * len(view.cpus) > GREEDY_FIRST_PAIRS:
        # (small instances: the count model is cheap enough to be exact)
        return best, gap, Outcome(best, None, "feasible", "cpsat", gap, via="packing within 1 % of the bound")
    return best, gap, None


def _check(view: View, tasks: Sequence[TaskSpec], alloc: Alloc, by: str) -> None:
    """A violation is a bug, not a user error: say so loudly."""
    broken = violations(view, tasks, alloc)
    if broken:
        raise AssertionError(f"{by} produced an infeasible allocation: {broken[0]}")


def _finish(view: View, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]], solver: str,
            time_limit_s: float, status: str, alloc: Alloc | None, fallback: Alloc | None,
            reason: str | None, gap: float | None, fallback_by: str = "greedy") -> Outcome:
    if status == "infeasible":
        return Outcome(None, infeasibility_reason(view, tasks, reason), "infeasible", solver,
                       via=f"{solver} infeasible")
    if alloc is None:
        if fallback is None:  # neither found anything in time
            return Outcome(None, f"no allocation found in {time_limit_s} s; greedy: {reason}", "infeasible", solver,
                           via="nothing in time")
        return Outcome(fallback, None, "fallback", fallback_by, via=f"{solver}: no solution in time")
    _check(view, tasks, alloc, solver)
    if fallback is not None and objective(view, tasks, fallback, current) > objective(view, tasks, alloc, current):
        # Time ran out before the solver beat the fallback, or (only O4) the
        # mapping kept fewer CPUs than the count model hoped.
        return Outcome(fallback, None, "feasible", fallback_by, gap, via=f"{fallback_by} better than {solver}")
    return Outcome(alloc, None, status, solver, gap, via=f"{solver} model")

"""One allocation request end to end: checked inputs, the solver, the result.

Shared by :func:`cod.rm.allocator.allocate` (a pure function) and
:class:`cod.rm.allocator.Allocator` (the stateful one the RM keeps).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Sequence

from cod.facts.model import Machine

from .explain import explain, explain_reservations
from .greedy import solve_greedy
from .locality import CachePolicy, apply_sls, without_sls
from .model import AllocationResult, OtherDemand, TaskAllocation, TaskSpec
from .problem import as_tasks, check_names, violations
from .solve import Outcome, solve_exact
from .topology import View, build_view


@dataclass(frozen=True)
class Request:
    view: View
    everyone: list[TaskSpec]  # registered tasks, then others (problem.OtherSpec)
    current: dict[str, tuple[int, ...]]  # others: the CPUs they run on
    n_unavailable: int
    # SLS (cod.rm.allocator.locality): the decision, and the task list before it rewrote it
    policy: CachePolicy = CachePolicy("none")
    unmapped: list[TaskSpec] = field(default_factory=list)


def prepare(machine: Machine, tasks: Sequence[TaskSpec], current: Mapping[str, Sequence[int]] | None,
            others: Sequence[OtherDemand], unavailable: Iterable[int]) -> Request:
    """Check names and CPUs; the view (cached per machine, unavailable CPUs and
    allowed sets); tasks and others as the solvers see them."""
    check_names(tasks, others)
    unavailable = tuple(unavailable)
    cpus = set(machine.cpu_ids())
    for o in others:
        bad = sorted(set(o.cpus) - cpus) + sorted(set(o.allowed or ()) - cpus)
        if bad:
            raise ValueError(f"other {o.name!r}: CPU {bad[0]} does not exist on {machine.name}")
    view = build_view(machine, unavailable, [frozenset(o.allowed) for o in others if o.allowed is not None])
    cur = {k: tuple(v) for k, v in (current or {}).items()}
    cur.update({o.name: o.cpus for o in others})
    mapped, policy = apply_sls(view, tasks)
    return Request(view, mapped + as_tasks(others), cur, len(unavailable), policy,
                   list(tasks) + as_tasks(others) if policy.mode == "sls" else [])


def solve(req: Request, solver: str, time_limit_s: float) -> Outcome:
    """The solver's outcome, with the locality decision; SLS dropped when it made the plan infeasible (L3)."""
    start = time.perf_counter()
    out = _solve(req.view, req.everyone, req.current, solver, time_limit_s)
    policy = req.policy
    if out.alloc is None and policy.mode == "sls":
        left = max(0.001, time_limit_s - (time.perf_counter() - start))
        out = _solve(req.view, req.unmapped, req.current, solver, left)
        policy = without_sls(req.unmapped, policy)
    elif out.alloc is not None and policy.mode == "sls" and \
            any(v.startswith("C5") for v in violations(req.view, req.everyone, out.alloc)):
        # The greedy solver treats C5 as a preference; the exact ones never return a violation.
        policy = without_sls(req.unmapped, policy, by=out.solver)
    return replace(out, cache_policy=policy.text)


def _solve(view: View, everyone: list[TaskSpec], current: dict[str, tuple[int, ...]], solver: str,
           time_limit_s: float) -> Outcome:
    if solver == "greedy":
        alloc, reason = solve_greedy(view, everyone, current)
        return Outcome(alloc, reason, "feasible" if alloc is not None else "infeasible", "greedy", via="greedy")
    return solve_exact(view, everyone, current, solver, time_limit_s)


def result(req: Request, out: Outcome, start: float, with_bindings: bool = True) -> AllocationResult:
    """The result of ``out``; ``with_bindings`` False leaves every task's
    ``binding`` empty (computed later by ``Allocator.explain``)."""
    if not out.cache_policy and req.policy.text:  # an outcome of the incremental path
        out = replace(out, cache_policy=req.policy.text)
    if out.alloc is None:
        return AllocationResult("infeasible", out.solver, (time.perf_counter() - start) * 1e3, (), out.reason,
                                via=out.via, cache_policy=out.cache_policy)
    if with_bindings:
        tasks = explain(req.view, req.everyone, out.alloc, req.n_unavailable, req.current)
    else:
        tasks = tuple(TaskAllocation(t.name, tuple(sorted(out.alloc.get(t.name, ()))),
                                     tuple(sorted({req.view.node_of[c] for c in out.alloc.get(t.name, ())})), ())
                      for t in sorted(req.everyone, key=lambda t: t.name) if not _is_other(t))
    reservations = explain_reservations(req.view, req.everyone, out.alloc, req.current)
    gap = out.gap if out.status == "feasible" else None
    return AllocationResult(out.status, out.solver, (time.perf_counter() - start) * 1e3, tasks, None, gap,
                            reservations, out.via, out.cache_policy)


def _is_other(t: TaskSpec) -> bool:
    from .problem import is_other

    return is_other(t)

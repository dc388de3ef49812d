"""How a plan was found and proven, in words a user follows (`cod plan`, the shell's `:plan`, `:allocation`).

The allocator reports the solver whose allocation it returns (``greedy`` even when
``cpsat`` was asked: the default solver first tries cheap allocations and a bound
that can prove them optimal, docs/design-allocator.md) and, as ``via``, how the
answer was found and proven (:attr:`cod.rm.allocator.AllocationResult.via`,
the daemon's plan ``proof``).  :func:`plan_sentence` turns the two into one
sentence; an unknown ``via`` is shown as it is.
"""

from __future__ import annotations

NOT_NEEDED = "so CP-SAT's search was not needed"

# via -> what found the allocation and what proves it (the status says optimal or not).
HOW: dict[str, str] = {
    "greedy = closed-form bound": "the greedy allocation reached the closed-form upper bound of the objective, "
                                  f"which proves it optimal, {NOT_NEEDED}",
    "greedy = waterfill bound": "the greedy allocation reached the waterfill bound, which proves it optimal, "
                                f"{NOT_NEEDED}",
    "packing = waterfill bound": "a best-fit packing reached the waterfill bound, which proves it optimal, "
                                 f"{NOT_NEEDED}",
    "packing = relaxation bound": "a best-fit packing reached the bound of the relaxed model, which proves it "
                                  f"optimal, {NOT_NEEDED}",
    "packing within 1 % of the bound": "a best-fit packing came within 1 % of the relaxed model's bound, close "
                                       "enough to stop there",
    "count model = relaxation bound": "CP-SAT's count model reached the bound of the relaxed model, which proves "
                                      "it optimal",
    "count model, time limit": "CP-SAT's count model stopped at its time limit without proving this allocation "
                               "optimal",
    "cpsat model": "CP-SAT solved the count model",
    "naive model": "CP-SAT solved the matrix model of the paper's Figure 4",
    "no time for the count model": "the time left was too short to build CP-SAT's count model, so the best "
                                   "allocation found before is used, unproven",
    "cpsat: no solution in time": "CP-SAT found no solution within its time limit, so the greedy allocation is used",
    "naive: no solution in time": "CP-SAT found no solution within its time limit, so the greedy allocation is used",
    "greedy better than cpsat": "CP-SAT did not beat the greedy allocation within its time limit",
    "greedy better than naive": "CP-SAT did not beat the greedy allocation within its time limit",
    "greedy": "the greedy allocator, which proves nothing (--solver greedy)",
    "unchanged": "nothing the plan depends on changed, so the previous plan stands",
    "incremental: newcomer at its best": "only the new task was placed, at its best, the others kept their CPUs",
    "incremental = waterfill bound": "only the tasks that had to move were re-placed, and the result reached the "
                                     f"waterfill bound, which proves it optimal, {NOT_NEEDED}",
    "incremental within 1 % of the waterfill bound": "only the tasks that had to move were re-placed, within 1 % "
                                                     "of the waterfill bound",
    "incremental (unproven)": "only the tasks that had to move were re-placed, unproven",
    "relaxation infeasible": "the relaxed model has no solution, so no allocation can meet every task's minimum",
    "cpsat infeasible": "CP-SAT proved that no allocation meets every task's minimum",
    "naive infeasible": "CP-SAT proved that no allocation meets every task's minimum",
    "nothing in time": "neither CP-SAT nor the greedy allocator found an allocation in time",
}


def plan_sentence(status: str | None, solver: str | None, via: str | None, solve_ms: float | None) -> str:
    """``optimal in 0.31 ms: the greedy allocation reached ..., so CP-SAT's search was not needed.``"""
    took = f" in {solve_ms:.2f} ms" if isinstance(solve_ms, (int, float)) else ""
    how = HOW.get(via or "")
    if how is None:
        how = f"found by {solver}" + (f" ({via})" if via else "")
    return f"{status}{took}: {how}."

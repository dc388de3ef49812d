"""plan_sentence: every way the allocator can find and prove a plan, in words (issue 32)."""

from __future__ import annotations

import pytest

from cod.cli.plan_words import HOW, plan_sentence

from helpers.paths import REPO


@pytest.mark.parametrize("status, solver, via, ms, says", [
    ("optimal", "greedy", "greedy = closed-form bound", 0.31,
     "optimal in 0.31 ms: the greedy allocation reached the closed-form upper bound of the objective, which "
     "proves it optimal, so CP-SAT's search was not needed."),
    ("optimal", "cpsat", "packing = relaxation bound", 2.5,
     "optimal in 2.50 ms: a best-fit packing reached the bound of the relaxed model, which proves it optimal, "
     "so CP-SAT's search was not needed."),
    ("feasible", "cpsat", "count model, time limit", 1000.0,
     "feasible in 1000.00 ms: CP-SAT's count model stopped at its time limit without proving this allocation "
     "optimal."),
    ("fallback", "greedy", "cpsat: no solution in time", 1.0,
     "fallback in 1.00 ms: CP-SAT found no solution within its time limit, so the greedy allocation is used."),
    ("feasible", "greedy", "greedy", None, "feasible: the greedy allocator, which proves nothing (--solver greedy)."),
    ("optimal", "cpsat", "a new way", 3.0, "optimal in 3.00 ms: found by cpsat (a new way)."),
    ("optimal", "cpsat", "", 3.0, "optimal in 3.00 ms: found by cpsat."),
])
def test_plan_sentence(status, solver, via, ms, says):
    assert plan_sentence(status, solver, via, ms) == says


def test_every_way_the_allocator_names_has_words():
    """The allocator's `via` strings (rm/allocator) are all in the table, so none is shown raw."""
    from pathlib import Path
    import re

    src = "".join(p.read_text() for p in (REPO / "rm" / "allocator").glob("*.py"))
    named = set(re.findall(r'via="([^"{]+)"', src))
    assert named and named <= set(HOW), sorted(named - set(HOW))

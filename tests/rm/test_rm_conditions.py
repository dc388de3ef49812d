"""rm/conditions.py as tables: a condition's life is a pure state machine over evaluation results.

Each row is a sequence of evaluation results and what the subscriber must hear after each: ``T`` (an
upcall saying the goal became true), ``F`` (false again), ``-`` (nothing), ``X`` (dropped).  The
invariants behind the rows: an upcall only on a change of truth, the first evaluation always
tells (true or false); errors and skipped rounds change nothing the subscriber sees, and
``MAX_ERRORS`` errors in a row drop it, counted only while in a row.
"""

from __future__ import annotations

from typing import Any

import pytest

from cod.rm.conditions import MAX_ERRORS, Condition, ConditionWatch, Outcome, step

YES = {"bindings": {"X": 1}}
NO = {"none": True}
ERR = {"error": {"message": "boom"}}
SKIP = {"skipped": True}

STEPS = [
    # (why, results in order, what each tells)
    ("first evaluation true tells", [YES], "T"),
    ("first evaluation false tells", [NO], "F"),
    ("no change, no upcall", [YES, YES, YES], "T--"),
    ("each change tells", [YES, NO, YES, NO], "TFTF"),
    ("an error between equal results is silent", [YES, ERR, YES], "T--"),
    ("an error does not change the truth", [NO, ERR, YES], "F-T"),
    ("a skipped round is silent", [YES, SKIP, NO], "T-F"),
    ("errors in a row drop", [YES] + [ERR] * MAX_ERRORS, "T" + "-" * (MAX_ERRORS - 1) + "X"),
    ("errors not in a row do not drop", ([ERR] * (MAX_ERRORS - 1) + [NO]) * 2, "-" * (MAX_ERRORS - 1) + "F"
     + "-" * MAX_ERRORS),
    ("a skipped round does not break a run of errors", [ERR] * (MAX_ERRORS - 1) + [SKIP, ERR],
     "-" * (MAX_ERRORS - 1) + "-X"),
    ("never evaluated in time: silent, never dropped", [SKIP] * 50, "-" * 50),
]


def told(outcome: Outcome) -> str:
    if outcome.drop is not None:
        return "X"
    if outcome.notify is None:
        return "-"
    return "T" if outcome.notify["state"] else "F"


@pytest.mark.parametrize("why, results, expected", STEPS, ids=[r[0] for r in STEPS])
def test_step(why: str, results: list[dict[str, Any]], expected: str) -> None:
    cond = Condition(sub_id=1, conn_id=1, app="a", goal="g")
    assert "".join(told(step(cond, r)) for r in results) == expected


def test_an_upcall_carries_the_goal_and_the_first_solutions_bindings_only_when_true() -> None:
    cond = Condition(sub_id=1, conn_id=1, app="a", goal="load(X)")
    assert step(cond, YES).notify == {"event": "condition", "goal": "load(X)", "state": True, "bindings": {"X": 1}}
    assert step(cond, NO).notify == {"event": "condition", "goal": "load(X)", "state": False, "bindings": {}}


def test_a_drop_says_how_many_errors_and_the_last_message() -> None:
    cond = Condition(sub_id=1, conn_id=1, app="a", goal="g")
    outcomes = [step(cond, {"error": {"message": f"error {i}"}}) for i in range(MAX_ERRORS)]
    assert outcomes[-1].drop == f"its goal failed {MAX_ERRORS} times in a row; last: error {MAX_ERRORS - 1}"


ROUNDS = [
    # (why, [(sub_id, app, times skipped)], app, the order of its next round)
    ("in the order made", [(1, "a", 0), (2, "a", 0), (3, "a", 0)], "a", [1, 2, 3]),
    ("skipped longest first", [(1, "a", 0), (2, "a", 2), (3, "a", 1)], "a", [2, 3, 1]),
    ("equally skipped keep their order", [(1, "a", 1), (2, "a", 0), (3, "a", 1)], "a", [1, 3, 2]),
    ("only the application's own", [(1, "a", 0), (2, "b", 5), (3, "a", 0)], "a", [1, 3]),
]


@pytest.mark.parametrize("why, conditions, app, order", ROUNDS, ids=[r[0] for r in ROUNDS])
def test_the_order_of_a_round(why: str, conditions: list[tuple[int, str, int]], app: str, order: list[int]) -> None:
    watch = ConditionWatch({sid: Condition(sid, 1, a, "g", skipped=s) for sid, a, s in conditions})
    assert [c.sub_id for c in watch.of_app(app)] == order


def test_forgetting_a_connection_forgets_its_conditions_only() -> None:
    watch = ConditionWatch({1: Condition(1, 7, "a", "g"), 2: Condition(2, 8, "a", "g"), 3: Condition(3, 7, "b", "g")})
    watch.forget_connection(7)
    assert list(watch.conditions) == [2] and watch.apps() == {"a"}

"""rm/quotas.py as tables: each rule is a pure function of the settings and the registry.

Each row is a situation (what the uid and the others hold, what it asks for) and the answer: None
(allowed) or the words the refusal must contain.  The daemon's tests show the same rules end to end;
these show the edges (exactly at a limit, one over, another uid's holdings not counted) that are
slow or awkward to reach through a socket.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from cod.rm import quotas
from cod.rm.allocator.model import TaskSpec
from cod.rm.config import PRIORITY_MAX, PRIORITY_MIN, RMConfig
from cod.rm.registry import Connection, Peer, Registry, Task, Usage

ME, OTHER = 1000, 1001
CFG = replace(RMConfig(), max_tasks_per_uid=3, max_apps_per_uid=2, unprivileged_max_cores=4,
              unprivileged_max_priority=5, app_max_facts=100, uid_max_facts=150, app_max_fact_bytes=1000,
              uid_max_fact_bytes=1500, app_max_clauses=10, uid_max_clauses=15, app_max_clause_bytes=400,
              uid_max_clause_bytes=600, max_subscriptions_per_connection=3, max_subscriptions_per_uid=4,
              max_output_buffer_bytes=1000, write_timeout_s=10.0)


def registry(tasks: list[tuple[int, str, int]] = (), apps: dict[str, tuple[int, Usage]] | None = None) -> Registry:
    """A registry holding ``tasks`` (uid, name, min_cores) and ``apps`` (name -> (owner, usage))."""
    reg = Registry()
    for pid, (uid, name, min_cores) in enumerate(tasks, start=100):
        reg.tasks[name] = Task(name, pid, f"app{uid}", 1, uid, TaskSpec(name, min_cores=min_cores), {})
    for app, (owner, usage) in (apps or {}).items():
        reg.app_owner[app] = owner
        reg.usage[app] = usage
    return reg


# ---- write_limits: the smaller of the application's limit and what its uid has left ------------
WRITE_LIMITS = [
    # (the uid's applications: name -> usage, the application written, expected Limits fields)
    ("nothing held: the application's own limits", {}, "a", (100, 1000, 10, 400)),
    ("the application's own usage does not lower its limit", {"a": Usage(90, 900, 9, 390)}, "a",
     (100, 1000, 10, 400)),
    ("the uid's other application takes from the uid's allowance", {"a": Usage(), "b": Usage(120, 1200, 12, 500)},
     "a", (30, 300, 3, 100)),
    ("the other application at the uid's limit leaves nothing", {"a": Usage(), "b": Usage(150, 1500, 15, 600)},
     "a", (0, 0, 0, 0)),
    ("another uid's application counts for nothing", {"x": Usage(150, 1500, 15, 600)}, "a", (100, 1000, 10, 400)),
]


@pytest.mark.parametrize("why, apps, app, expected", WRITE_LIMITS, ids=[r[0] for r in WRITE_LIMITS])
def test_write_limits(why: str, apps: dict[str, Usage], app: str, expected: tuple[int, int, int, int]) -> None:
    reg = registry(apps={name: (OTHER if name == "x" else ME, usage) for name, usage in apps.items()})
    reg.app_owner.setdefault(app, ME)
    limits = quotas.write_limits(CFG, reg, app, ME)
    assert (limits.facts, limits.fact_chars, limits.clauses, limits.clause_chars) == expected


# ---- app_name_refusal: how many application names a uid may hold ------------------------------
APP_NAMES = [
    # (names the uid holds, the name asked for, privileged, refusal fragment or None)
    ([], "a", False, None),
    (["a"], "b", False, None),
    (["a", "b"], "c", False, "already holds 2 application names"),
    (["a", "b"], "a", False, None),  # a name it holds is not one more
    (["a", "b"], "c", True, None),
]


@pytest.mark.parametrize("held, app, privileged, refusal", APP_NAMES)
def test_app_name_refusal(held: list[str], app: str, privileged: bool, refusal: str | None) -> None:
    reg = registry(apps={name: (ME, Usage()) for name in held} | {"x": (OTHER, Usage())})
    answer = quotas.app_name_refusal(CFG, reg, ME, privileged, app)
    assert (answer is None) == (refusal is None), answer
    if refusal is not None:
        assert refusal in answer and "max_apps_per_uid" in answer


# ---- task_refusal: priority range, tasks per uid, cores per uid ---------------------------------
MINE = [(ME, "t1", 1), (ME, "t2", 2)]  # three cores held of the budget of four
THEIRS = [(OTHER, "o1", 3), (OTHER, "o2", 3)]
TASKS = [
    # (why, tasks held, privileged, the task's name, its properties, refusal fragment or None)
    ("within every limit", MINE, False, "t3", {"min_cores": 1}, None),
    ("cores one over the budget", MINE, False, "t3", {"min_cores": 2}, "would reserve 5 cores"),
    ("an update does not count the task twice", MINE, False, "t2", {"min_cores": 3}, None),
    ("an update over the budget", MINE, False, "t2", {"min_cores": 4}, "would reserve 5 cores"),
    ("another uid's tasks do not count", MINE + THEIRS, False, "t3", {"min_cores": 1}, None),
    ("one task too many", MINE + [(ME, "t3", 1)], False, "t4", {"min_cores": 0}, "has 3 tasks; the limit is 3"),
    ("privileged: no count or core limit", MINE + [(ME, "t3", 1)], True, "t4", {"min_cores": 9}, None),
    ("priority at the unprivileged top", [], False, "t", {"priority": 5}, None),
    ("priority over the unprivileged top", [], False, "t", {"priority": 6}, "above 5"),
    ("privileged: up to PRIORITY_MAX", [], True, "t", {"priority": PRIORITY_MAX}, None),
    ("privileged: not over PRIORITY_MAX", [], True, "t", {"priority": PRIORITY_MAX + 1}, "outside"),
    ("not under PRIORITY_MIN", [], False, "t", {"priority": PRIORITY_MIN - 1}, "outside"),
    ("a priority that is no integer is left to the spec's own check", [], False, "t", {"priority": "high"}, None),
]


@pytest.mark.parametrize("why, held, privileged, name, properties, refusal", TASKS, ids=[r[0] for r in TASKS])
def test_task_refusal(why: str, held: list[tuple[int, str, int]], privileged: bool, name: str,
                      properties: dict[str, Any], refusal: str | None) -> None:
    answer = quotas.task_refusal(CFG, registry(held), ME, privileged, name, properties, n_cpus=8)
    assert (answer is None) == (refusal is None), answer
    if refusal is not None:
        assert refusal in answer


def test_the_default_core_budget_is_all_cpus_but_one() -> None:
    assert [quotas.unprivileged_core_budget(RMConfig(), n) for n in (1, 2, 8)] == [1, 1, 7]
    assert quotas.unprivileged_core_budget(CFG, 8) == 4


# ---- group_refusal: a group counts as a task, its floor as cores ---------------------------------
GROUPS = [
    # (why, tasks held, floors of the uid's other groups, privileged, the new group's floor, refusal)
    ("within every limit", [(ME, "t1", 1)], [1], False, 2, None),
    ("groups and tasks count together", [(ME, "t1", 1)], [1, 1], False, 1, "1 tasks and 2 elastic groups"),
    ("floors count with tasks' cores", [(ME, "t1", 2)], [1], False, 2, "would reserve 5 cores"),
    ("another uid's tasks do not count", THEIRS, [], False, 4, None),
    ("privileged", [(ME, "t1", 3)], [3, 3], True, 9, None),
]


@pytest.mark.parametrize("why, held, floors, privileged, floor, refusal", GROUPS, ids=[r[0] for r in GROUPS])
def test_group_refusal(why: str, held: list[tuple[int, str, int]], floors: list[int], privileged: bool,
                       floor: int, refusal: str | None) -> None:
    answer = quotas.group_refusal(CFG, registry(held), ME, privileged, floors, floor, n_cpus=8)
    assert (answer is None) == (refusal is None), answer
    if refusal is not None:
        assert refusal in answer


# ---- subscription_refusal: per connection, and per uid over its connections ----------------------
SUBSCRIPTIONS = [
    # (subscriptions on this connection, on the uid's other connection, privileged, refusal)
    (0, 0, False, None),
    (2, 1, False, None),
    (3, 0, False, "this connection has 3 subscriptions"),
    (3, 0, True, "this connection has 3 subscriptions"),  # the per-connection bound holds for root too
    (2, 2, False, "has 4 subscriptions over its connections"),
    (2, 2, True, None),
]


@pytest.mark.parametrize("here, elsewhere, privileged, refusal", SUBSCRIPTIONS)
def test_subscription_refusal(here: int, elsewhere: int, privileged: bool, refusal: str | None) -> None:
    reg = Registry()
    conn = reg.add_connection(Peer(1, ME, ME), privileged)
    other: Connection = reg.add_connection(Peer(2, ME, ME), privileged)
    stranger = reg.add_connection(Peer(3, OTHER, OTHER), False)
    for c, n in ((conn, here), (other, elsewhere), (stranger, 3)):
        for _ in range(n):
            reg.subscribe(c, "allocation", {})
    answer = quotas.subscription_refusal(CFG, reg, conn)
    assert (answer is None) == (refusal is None), answer
    if refusal is not None:
        assert refusal in answer


# ---- output_refusal: what a peer leaves unread ---------------------------------------------------
OUTPUT = [
    (0, None, None),
    (1000, 9.9, None),  # exactly at the byte limit, just under the time limit
    (1001, None, "1001 bytes queued"),
    (10, 10.0, "10.0 s ago is still unread"),
]


@pytest.mark.parametrize("unsent, waited, refusal", OUTPUT)
def test_output_refusal(unsent: int, waited: float | None, refusal: str | None) -> None:
    answer = quotas.output_refusal(CFG, unsent, waited)
    assert (answer is None) == (refusal is None), answer
    if refusal is not None:
        assert refusal in answer

"""An elastic group inside the global allocation (cod.rm.elastic.demand, controller.follow): pure
rules as tables, and the real allocator on machines larger than this VM, where a CPU a group
releases by t4 can go to a COD task that waits for it (two parties with a floor of one each fill a
2-CPU machine, so the daemon tests cannot show that)."""

from __future__ import annotations

import pytest

from cod.facts import machines
from cod.rm.allocator import TaskSpec, allocate
from cod.rm.elastic import controller as ctl
from cod.rm.elastic.controller import Limits, Observation
from cod.rm.elastic.demand import group_spec, limits_for
from cod.rm.elastic.modes import Layout
from cod.rm.elastic.settings import ElasticSettings

DENSE = ElasticSettings(mode="dense")
PAPER = machines.load("shanghai")  # 4 nodes x 4 cores, the paper's machine
LAYOUT = Layout.from_machine(PAPER)


# ---- the group's demand ---------------------------------------------------------------------------
@pytest.mark.parametrize("settings,held,floor,cap", [
    (DENSE, 0, 1, 1),  # waiting for its first CPU: it asks for its floor
    (DENSE, 1, 1, 1),
    (DENSE, 3, 1, 3),  # its current count is its demand; the allocator may take it down to 1
    (ElasticSettings(min_cores=2), 1, 2, 2),  # below its floor (cannot stay so): it asks for the floor
    (ElasticSettings(min_cores=2, max_cores=4), 3, 2, 3),
])
def test_group_spec(settings, held, floor, cap):
    spec = group_spec("g", settings, held)
    assert (spec.min_cores, spec.max_cores, spec.exclusive) == (floor, cap, True)


# ---- what the last plan leaves it -----------------------------------------------------------------
USABLE = [0, 1, 2, 3]
LIMITS = [
    ("alone", {"g": (0,)}, {"g": (0,)}, (), {0, 1, 2, 3}),
    ("beside a task", {"g": (0, 1), "db": (2,)}, {"g": (0, 1), "db": (2,)}, (), {0, 1, 3}),
    ("a CPU planned to a task is not free yet", {"g": (0,), "db": (2,)}, {"g": (0,), "db": (2, 3)}, (), {0, 1}),
    ("a task still giving back a CPU holds it", {"g": (0,), "db": (1, 2)}, {"g": (0, 1), "db": (2,)}, (), {0, 3}),
    ("kept for a busy process", {"g": (0,)}, {"g": (0,)}, (3,), {0, 1, 2}),
    ("another group", {"g": (0,), "h": (1, 2)}, {"g": (0,), "h": (1, 2)}, (), {0, 3}),
    ("the plan took the group's own CPU", {"g": (0, 1), "db": ()}, {"g": (0,), "db": (1,)}, (), {0, 2, 3}),
]


@pytest.mark.parametrize("case,holdings,plan,unavailable,available", LIMITS, ids=[c[0] for c in LIMITS])
def test_limits_for(case, holdings, plan, unavailable, available):
    limits = limits_for("g", USABLE, holdings, plan, unavailable)
    assert limits.available == frozenset(available) and limits.cap == len(available)


# ---- the state follows the allocation ------------------------------------------------------------
FOLLOW = [
    ("same CPUs", (0, 1), (1, 0), "hold", (0, 1)),
    ("one taken", (0, 1, 2), (0, 2), "revoke", (0, 2)),
    ("one given", (0,), (0, 3), "restore", (0, 3)),
    ("moved", (0, 1), (1, 2), "move", (1, 2)),
    ("the first CPUs", (), (2,), "restore", (2,)),
    ("everything taken (waiting for others)", (0,), (), "revoke", ()),
]


@pytest.mark.parametrize("case,before,given,action,after", FOLLOW, ids=[c[0] for c in FOLLOW])
def test_follow(case, before, given, action, after):
    state = ctl.begin(before)
    new, decision = ctl.follow(state, given, load=55.0)
    assert decision.action == action and new.cpus == after and decision.evaluation is None
    assert new.n == len(after)
    if after:
        assert new.marking == (55, 0, 0, 0, len(after))  # the net starts again from the new Provision


def test_begin_with_no_cpu_has_an_empty_marking():
    assert ctl.begin(()).marking == (0, 0, 0, 0, 0) and ctl.begin((3, 1)).marking == (1, 0, 0, 0, 2)


def test_the_net_stays_within_what_the_plan_leaves():
    """Overloaded, the group takes only CPUs the plan leaves free; at the cap it fires t6."""
    holdings = {"g": (0,), "db": (1, 2)}
    state = ctl.begin((0,))
    layout = Layout.from_machine(machines.load("shanghai"), [0, 1, 2, 3])
    for _ in range(3):
        limits = limits_for("g", [0, 1, 2, 3], holdings, holdings)
        state, d = ctl.step(state, Observation(0.0, 99.0), limits, layout, DENSE)
        holdings["g"] = state.cpus
    assert state.cpus == (0, 3) and d.evaluation is not None and d.evaluation.fired == ("t1", "t6")


# ---- the real allocator: a released CPU goes to whoever has room ----------------------------------
def run(specs, current):
    result = allocate(PAPER, specs, current, solver="cpsat", time_limit_s=2.0)
    assert result.status != "infeasible", result.reason
    return {t.name: sorted(t.cores) for t in result.tasks}


def test_a_cpu_the_group_releases_goes_to_a_task_that_waits_for_it():
    # 16 CPUs: db is exclusive and may use them all, but the group holds 15 (it was there first).
    group = tuple(range(15))
    db = TaskSpec("db", min_cores=1)
    plan = run([group_spec("g", DENSE, 15), db], {"g": group, "db": (15,)})
    assert plan["g"] == list(group) and plan["db"] == [15]
    # t4: the group releases CPU 14 (dense order: the last it holds); its demand is now 14.
    state, d = ctl.step(ctl.begin(group), Observation(0.0, 5.0), limits_for("g", range(16), plan, plan),
                        LAYOUT, DENSE)
    assert d.action == "release" and 14 not in state.cpus
    plan = run([group_spec("g", DENSE, state.n), db], {"g": state.cpus, "db": (15,)})
    assert plan["g"] == sorted(state.cpus) and plan["db"] == [14, 15], "the released CPU went to db"


def test_a_task_arriving_takes_cpus_from_the_group_down_to_its_floor_only():
    group = tuple(range(16))
    for floor, db_min, expect_group in [(1, 4, 12), (1, 15, 1), (4, 12, 4)]:
        settings = ElasticSettings(mode="dense", min_cores=floor)
        plan = run([group_spec("g", settings, 16), TaskSpec("db", min_cores=db_min)], {"g": group})
        assert len(plan["g"]) == expect_group and set(plan["g"]) <= set(group)
    refused = allocate(PAPER, [group_spec("g", ElasticSettings(min_cores=4), 16), TaskSpec("db", min_cores=13)],
                       {"g": group}, solver="cpsat", time_limit_s=2.0)
    assert refused.status == "infeasible"  # the group's floor is kept: the task is refused


def test_the_allocator_keeps_the_cpu_the_mode_chose():
    """After t5 the group's wanted CPUs are its current placement: the plan keeps the mode's choice."""
    held = (0, 4, 8)  # sparse order on the paper's machine
    state, d = ctl.step(ctl.begin(held), Observation(0.0, 99.0), limits_for("g", range(16), {"g": held}, {}),
                        LAYOUT, ElasticSettings(mode="sparse"))
    assert d.action == "allocate" and state.cpus == (0, 4, 8, 12)
    plan = run([group_spec("g", DENSE, state.n), TaskSpec("db", min_cores=1, max_cores=2)],
               {"g": state.cpus, "db": (1, 2)})
    assert plan["g"] == [0, 4, 8, 12] and plan["db"] == [1, 2]

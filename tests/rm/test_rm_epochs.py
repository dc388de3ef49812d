"""The epoch state machine's rules as tables (cod.rm.epochs): no daemon, no clock, no I/O."""

from __future__ import annotations

import pytest

from cod.rm import epochs
from cod.rm.epochs import EpochState


def state_with(**announced: tuple[int, ...]) -> EpochState:
    s = EpochState()
    for name in announced:
        s = epochs.add_task(s, name)
    if any(announced.values()):
        s, _ = epochs.adopt(s, announced, now=0.0, grace_s=1.0, reason="setup")
    return s


ADOPT = [
    # (description, held before, new plan, expected announced, expected revoked {core: task}, changed tasks)
    ("first plan grants at once", {"a": ()}, {"a": (0, 1)}, {"a": (0, 1)}, {}, {"a"}),
    ("growth into free cores is immediate", {"a": (0,)}, {"a": (0, 1)}, {"a": (0, 1)}, {}, {"a"}),
    ("a shrink is announced and revoked, the core still held",
     {"a": (0, 1)}, {"a": (0,)}, {"a": (0,)}, {1: "a"}, {"a"}),
    ("a move waits for the giver: b gets nothing yet",
     {"a": (0, 1), "b": ()}, {"a": (0,), "b": (1,)}, {"a": (0,), "b": ()}, {1: "a"}, {"a"}),
    ("an identical plan changes nothing", {"a": (0, 1)}, {"a": (0, 1)}, {"a": (0, 1)}, {}, set()),
    ("two tasks swap: both wait for each other's acks",
     {"a": (0,), "b": (1,)}, {"a": (1,), "b": (0,)}, {"a": (), "b": ()}, {0: "a", 1: "b"}, {"a", "b"}),
]


@pytest.mark.parametrize("desc, before, plan, announced, revoked, changed", ADOPT, ids=[r[0] for r in ADOPT])
def test_adopt(desc, before, plan, announced, revoked, changed):
    s0 = state_with(**before)
    s1, pub = epochs.adopt(s0, plan, now=10.0, grace_s=2.0, reason="test")
    assert dict(s1.announced) == announced
    assert {c: r.task for c, r in s1.revocations.items()} == revoked
    assert {c.task for c in pub.changes} == changed
    if changed:
        assert pub.epoch == s0.epoch + 1 and s1.epoch == pub.epoch
        for ch in pub.changes:
            assert s1.announced_epoch[ch.task] == pub.epoch
            assert (ch.deadline_s == 2.0) == bool(ch.removed)
    else:
        assert pub.empty and s1.epoch == s0.epoch
    # Holdings are what is announced plus what is still owed: a revoked core stays held.
    for core, task in revoked.items():
        assert core in s1.holdings()[task]


def test_ack_moves_the_cores_and_starts_an_epoch():
    s = state_with(a=(0, 1), b=())
    s, pub = epochs.adopt(s, {"a": (0,), "b": (1,)}, now=0.0, grace_s=2.0, reason="b arrived")
    epoch = pub.epoch
    s2, released, pub2 = epochs.acknowledge(s, "a", epoch, now=0.5)
    assert released == (1,)
    assert s2.announced["b"] == (1,) and s2.holdings() == {"a": (0,), "b": (1,)}
    assert pub2.epoch == epoch + 1 and [c.task for c in pub2.changes] == ["b"]
    assert pub2.repin == {"a": (0,), "b": (1,)}
    assert "released CPUs 1" in pub2.reason


@pytest.mark.parametrize("offset, released", [(-1, ()), (0, (1,)), (4, (1,))])
def test_an_ack_releases_only_revocations_up_to_its_epoch(offset, released):
    s = state_with(a=(0, 1), b=())
    s, _ = epochs.adopt(s, {"a": (0,), "b": (1,)}, now=0.0, grace_s=2.0, reason="")
    revocation_epoch = s.revocations[1].epoch
    _, got, pub = epochs.acknowledge(s, "a", revocation_epoch + offset, now=0.1)
    assert got == released
    assert pub.empty == (not released)


def test_the_deadline_moves_cores_without_an_ack():
    s = state_with(a=(0, 1), b=())
    s, pub = epochs.adopt(s, {"a": (0,), "b": (1,)}, now=0.0, grace_s=2.0, reason="")
    assert pub.next_deadline == 2.0
    same, nothing = epochs.expire(s, now=1.0)
    assert nothing.empty and same is s
    s2, pub2 = epochs.expire(s, now=2.0)
    assert s2.announced["b"] == (1,) and not s2.revocations and pub2.next_deadline is None


def test_a_core_taken_back_before_it_was_given_away_is_not_revoked():
    s = state_with(a=(0, 1), b=())
    s, _ = epochs.adopt(s, {"a": (0,), "b": (1,)}, now=0.0, grace_s=2.0, reason="")
    s, pub = epochs.adopt(s, {"a": (0, 1), "b": ()}, now=0.5, grace_s=2.0, reason="b shrank")
    assert not s.revocations and s.announced["a"] == (0, 1)
    assert s.holdings()["a"] == (0, 1)


def test_a_task_that_leaves_owes_nothing_and_frees_its_cores():
    s = state_with(a=(0, 1), b=())
    s, _ = epochs.adopt(s, {"a": (0,), "b": (1,)}, now=0.0, grace_s=2.0, reason="")
    s = epochs.forget(s, "a")
    assert "a" not in s.holdings() and not s.revocations
    s, pub = epochs.adopt(s, {"b": (0, 1)}, now=0.1, grace_s=2.0, reason="a left")
    assert s.announced["b"] == (0, 1) and pub.changes[0].added == (0, 1)


def test_pins_follow_holdings_not_announcements():
    # A task asked to give a core back keeps running there until it acks.
    s = state_with(a=(0, 1), b=())
    s1, pub = epochs.adopt(s, {"a": (0,), "b": (1,)}, now=0.0, grace_s=2.0, reason="")
    assert pub.repin == {}  # a's holdings did not change, b holds nothing yet
    _, _, pub2 = epochs.acknowledge(s1, "a", pub.epoch, now=0.1)
    assert pub2.repin == {"a": (0,), "b": (1,)}


def test_ranges():
    assert epochs.ranges([3, 0, 1, 2, 8]) == "0-3,8"
    assert epochs.ranges([]) == "none"

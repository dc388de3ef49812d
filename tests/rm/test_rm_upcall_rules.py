"""The pure rules behind the upcall bounds (issue 47, items 5 and 6): which subscriptions an event
reaches (indexed), the subscription caps, when a peer that does not read is cut off, the frames of
an upcall encoded once, and the order of a condition round."""

from __future__ import annotations

import itertools

import pytest

from cod.protocol import jsonrpc as rpc
from cod.protocol.framing import FrameTooLarge, encode
from cod.rm.conditions import Condition, ConditionWatch, step
from cod.rm.config import RMConfig
from cod.rm.events import notification_frames
from cod.rm.quotas import output_refusal, subscription_refusal
from cod.rm.registry import Peer, Registry
from cod.rm.transport import BACKLOG_GRAIN_S, Backlog

# ---- which subscriptions an event reaches ---------------------------------------------------------
FILTERS = [
    ("allocation_changed", {}),
    ("allocation_changed", {"task": "a"}),
    ("allocation_changed", {"task": ["a", "b", "a"]}),
    ("allocation_changed", {"task": "a", "app": "x"}),
    ("allocation_changed", {"app": "x"}),
    ("allocation_changed", {"app": []}),
    ("task_left", {"task": "a"}),
    ("facts_changed", {}),
    ("facts_changed", {"predicate": "p"}),
    ("facts_changed", {"predicate": ["p", "q"], "scope": "app"}),
    ("facts_changed", {"scope": "system"}),
    ("facts_changed", {"app": "x", "predicate": "q"}),
    ("condition", {"goal": "g"}),
]
EVENTS = [
    ("allocation_changed", {"task": "a", "app": "x"}),
    ("allocation_changed", {"task": "b", "app": "y"}),
    ("allocation_changed", {"task": "c", "app": "x"}),
    ("allocation_changed", {"task": None, "app": None}),
    ("task_left", {"task": "a", "app": "x"}),
    ("task_arrived", {"task": "a", "app": "x"}),
    ("facts_changed", {"scope": "app", "app": "x", "predicates": ["q", "r", "q"]}),
    ("facts_changed", {"scope": "system", "app": None, "predicates": ["p"]}),
    ("facts_changed", {"scope": "app", "app": "x", "predicates": []}),
]


def registry_with(filters):
    reg = Registry()
    conns = [reg.add_connection(Peer(pid=100 + i, uid=1000, gid=1000), False) for i in range(3)]
    subs = [reg.subscribe(conns[i % 3], event, filt) for i, (event, filt) in enumerate(filters)]
    return reg, conns, subs


@pytest.mark.parametrize("event, payload", EVENTS)
def test_the_index_finds_exactly_what_testing_every_subscription_finds(event, payload):
    reg, _, subs = registry_with(FILTERS)
    assert reg.subscribers(event, payload) == [s for s in subs if s.matches(event, payload)]


def test_a_subscription_leaves_the_index_with_its_connection_or_when_unsubscribed():
    reg, conns, subs = registry_with(FILTERS)
    every = [e for e in EVENTS]
    for sub in subs[::2]:
        conn = next(c for c in conns if c.id == sub.conn_id)
        assert reg.unsubscribe(conn, sub.id)
    for event, payload in every:
        assert reg.subscribers(event, payload) == [s for s in subs[1::2] if s.matches(event, payload)]
    for conn in conns:
        reg.remove_connection(conn.id)
    assert all(reg.subscribers(event, payload) == [] for event, payload in every)
    index = reg._subscription_index
    assert index._entries == {} and all(not keys for keys in index._keys.values())


# ---- the caps on subscriptions ----------------------------------------------------------------------
@pytest.mark.parametrize("privileged, on_this, on_other, allowed", [
    (False, 0, 0, True),
    (False, 3, 0, False),        # the connection's own bound
    (False, 2, 2, True),         # 4 of the uid's 5
    (False, 2, 3, False),        # the uid's bound, over its connections
    (True, 2, 30, True),         # root: only the connection's bound
    (True, 3, 0, False),
])
def test_subscription_refusal(privileged, on_this, on_other, allowed):
    cfg = RMConfig(max_subscriptions_per_connection=3, max_subscriptions_per_uid=5)
    reg = Registry()
    uid = 0 if privileged else 1000
    this = reg.add_connection(Peer(1, uid, uid), privileged)
    other = reg.add_connection(Peer(2, uid, uid), privileged)
    stranger = reg.add_connection(Peer(3, 2000, 2000), False)
    for conn, n in ((this, on_this), (other, on_other), (stranger, 4)):
        for _ in range(n):
            reg.subscribe(conn, "task_left", {})
    why = subscription_refusal(cfg, reg, this)
    assert (why is None) == allowed, why
    if not allowed:
        limit = "max_subscriptions_per_connection" if on_this >= 3 else "max_subscriptions_per_uid"
        assert limit in why, why


# ---- a peer that does not read ----------------------------------------------------------------------
@pytest.mark.parametrize("unsent, waited, why", [
    (0, None, None),
    (100, 0.5, None),
    (100, 2.0, "write_timeout_s"),
    (1001, 0.0, "max_output_buffer_bytes"),
    (1000, None, None),
])
def test_output_refusal(unsent, waited, why):
    cfg = RMConfig(max_output_buffer_bytes=1000, write_timeout_s=2.0)
    said = output_refusal(cfg, unsent, waited)
    assert (said is None) == (why is None) and (why is None or why in said), said


# Steps: (bytes queued, bytes the transport still holds after it, now) -> when the oldest held was queued
BACKLOGS = [
    ([(100, 0, 0.0)], None),                                     # went out at once: nothing remembered
    ([(100, 40, 1.0)], 1.0),
    ([(100, 40, 1.0), (100, 140, 2.0)], 1.0),                    # the first message is not out yet
    ([(100, 40, 1.0), (100, 100, 2.0)], 2.0),                    # the first went out meanwhile
    ([(100, 40, 1.0), (100, 0, 2.0)], None),
    ([(100, 40, 1.0), (100, 90, 1.0 + BACKLOG_GRAIN_S / 2)], 1.0),  # within a grain: counted as older
    ([(100, 40, 1.0), (100, 90, 1.0 + BACKLOG_GRAIN_S * 2)], 1.0 + BACKLOG_GRAIN_S * 2),
]


@pytest.mark.parametrize("steps, oldest", BACKLOGS)
def test_backlog_oldest(steps, oldest):
    backlog = Backlog()
    for nbytes, unsent, now in steps:
        backlog.queued(nbytes, unsent, now)
    assert backlog.oldest(steps[-1][1]) == oldest


def test_a_backlog_keeps_a_few_marks_per_second_however_many_messages():
    backlog = Backlog()
    for i in range(10_000):
        backlog.queued(100, 100 * (i + 1), i * 0.001)  # 10,000 messages over 10 s, none taken
    assert len(backlog._marks) <= 10 / BACKLOG_GRAIN_S + 1
    assert backlog.oldest(1_000_000) == 0.0


# ---- an upcall's frames -------------------------------------------------------------------------------
@pytest.mark.parametrize("payload", [
    {"task": "t", "app": "a", "cores": [1, 2]},
    {"task": 'a "subscription":0, trap', "reason": "ünïcode ✓"},
    {},
])
def test_upcall_frames_are_byte_for_byte_those_encoded_one_by_one(payload):
    frame = notification_frames("allocation_changed", payload)
    for sid in (0, 7, 10, 123456789012):
        params = {"subscription": sid, "event": "allocation_changed", **payload}
        assert frame(sid) == encode(rpc.notification("allocation_changed", params))


def test_an_upcall_too_large_to_send_is_refused():
    with pytest.raises(FrameTooLarge):
        notification_frames("task_warning", {"reason": "x" * (1 << 20)})


# ---- a condition round ----------------------------------------------------------------------------------
def test_a_skipped_condition_keeps_its_state_and_goes_first_in_the_next_round():
    watch = ConditionWatch()
    for i in range(4):
        watch.conditions[i] = Condition(i, 1, "app", f"g{i}")
    for cond, result in zip(watch.of_app("app"), [{"none": True}, {"bindings": {}}, {"skipped": True},
                                                   {"skipped": True}]):
        step(cond, result)
    assert [c.sub_id for c in watch.of_app("app")] == [2, 3, 0, 1]
    assert [c.state for c in watch.of_app("app")] == [None, None, False, True]
    outcome = step(watch.conditions[2], {"skipped": True})
    assert outcome.notify is None and outcome.drop is None  # skipping is no error: never dropped for it
    assert [c.sub_id for c in watch.of_app("app")] == [2, 3, 0, 1]
    step(watch.conditions[2], {"none": True})
    assert [c.sub_id for c in watch.of_app("app")] == [3, 0, 1, 2]


def test_skipping_never_drops_a_condition():
    cond = Condition(1, 1, "app", "g")
    outcomes = [step(cond, {"skipped": True}) for _ in itertools.repeat(None, 50)]
    assert all(o.drop is None and o.notify is None for o in outcomes) and cond.errors == 0

"""The journal's rules of obsolescence, as tables, and the indexed journal against the plain scan."""

from __future__ import annotations

import random
from typing import Any

import pytest

from cod.skb import codec
from cod.skb.codec import Op
from cod.skb.journal import Journal

TOKEN_A, TOKEN_B = "a" * 16, "b" * 16


def _scan(ops: list[Op], op: Op) -> list[Op]:
    """The rules written as one scan of the whole journal (the journal's code before its indexes)."""
    if not op.journal:
        return ops
    if op.drops:
        apps = {k[4:] for k in op.drops if k.startswith("app:")}
        ops = [o for o in ops if not (o.replaces & op.drops) and not (o.app is not None and o.app in apps)]
        return ops if apps or op.text.startswith("revoke(") else [*ops, op]
    if op.replaces:
        ops = [o for o in ops if not (o.replaces and o.replaces <= op.replaces)]
    return [*ops, op]


def _texts(ops: list[Op]) -> list[str]:
    return [o.text for o in ops]


CASES = [
    # (what, the ops recorded in order, the positions of those kept, in order)
    ("a read is not kept", [codec.list_facts("a", None)], []),
    ("plain writes are all kept, in order",
     [codec.add_system_facts(["x(1)"]), codec.add_system_facts(["x(2)"])], [0, 1]),
    ("a newer load_system replaces the older", [codec.load_system("a."), codec.load_system("b.")], [1]),
    ("a revoke drops its grant and is not kept",
     [codec.grant(TOKEN_A, "a"), codec.grant(TOKEN_B, "b"), codec.revoke(TOKEN_A)], [1]),
    ("drop_app drops the application's entries and is not kept",
     [codec.release_app("a"), codec.release_app("b"), codec.grant(TOKEN_A, "a"), codec.drop_app("a")], [1, 2]),
    ("a batch of keyed writes replaces what its keys cover",
     [codec.grant(TOKEN_A, "a"), codec.load_system("a."),
      codec.batch([codec.grant(TOKEN_A, "a"), codec.load_system("b.")])], [2]),
    ("a single key does not replace an entry holding more keys",
     [codec.batch([codec.grant(TOKEN_A, "a"), codec.load_system("a.")]), codec.load_system("b.")], [0, 1]),
    ("a revoke drops a batch holding its token",
     [codec.batch([codec.grant(TOKEN_A, "a"), codec.load_system("a.")]), codec.revoke(TOKEN_A)], []),
]


@pytest.mark.parametrize("what,recorded,kept", CASES, ids=[c[0] for c in CASES])
def test_rules(what: str, recorded: list[Op], kept: list[int]) -> None:
    journal = Journal()
    scanned: list[Op] = []
    for op in recorded:
        journal.record(op)
        scanned = _scan(scanned, op)
    assert journal.ops() == [recorded[i] for i in kept]
    assert scanned == [recorded[i] for i in kept]  # the table holds for the plain scan too
    assert len(journal) == len(kept)


def _random_op(rng: random.Random) -> Op:
    app = rng.choice(["a", "b", "c", None])
    keys = frozenset(rng.sample(["k1", "k2", "k3", "token:t", "app:a", "app:b"], rng.randint(0, 2)))
    kind = rng.random()
    if kind < 0.15:
        return Op(f"drop{rng.random()}", True, app=app, drops=keys or frozenset({"app:a"}))
    if kind < 0.2:
        return Op(f"revoke({rng.random()})", True, drops=keys or frozenset({"token:t"}))
    if kind < 0.25:
        return Op(f"read{rng.random()}", False)
    return Op(f"w{rng.random()}", True, app=app, replaces=frozenset(k for k in keys if not k.startswith("app:")))


def test_the_indexed_journal_keeps_what_the_scan_keeps() -> None:
    rng = random.Random(31)
    for _ in range(50):
        journal, scanned = Journal(), []
        for _ in range(200):
            op = _random_op(rng)
            journal.record(op)
            scanned = _scan(scanned, op)
            assert journal.ops() == scanned
        journal.compact({"system": [], "apps": {}})  # then the indexes are rebuilt
        for _ in range(50):
            op = _random_op(rng)
            journal.record(op)
        assert len(journal) == len(journal.ops())


def test_compaction_keeps_loads_and_grants_and_indexes_them() -> None:
    journal = Journal()
    for op in [codec.load_library("/l.pl"), codec.grant(TOKEN_A, "a"), codec.add_system_facts(["x(1)"])]:
        journal.record(op)
    journal.compact({"system": ["x(1)"], "apps": {}})
    texts = _texts(journal.ops())
    assert texts[0].startswith("load_library(") and texts[-1].startswith("grant(")
    assert texts[1].startswith("restore_system(") and len(texts) == 3
    journal.record(codec.revoke(TOKEN_A))  # found through the rebuilt index
    assert not any(t.startswith("grant(") for t in _texts(journal.ops()))


# ---- replies in any order (issue 47, item 1) ------------------------------------------------------
def _facts(app: str, *texts: str) -> Op:
    return codec.add_facts(app, codec.PERSISTENT, list(texts))


SNAPSHOT = {"system": [], "apps": {"a": {"facts": [["f(1)", ["persistent"]]], "procedures": []}}}
ORDER_CASES = [
    # (what, [(request id, op) recorded in this order, or ("compact", snapshot's request id)],
    #  the texts replayed, in order)
    ("replay follows the requests, not the replies",
     [(2, codec.remove_facts("a", ["f(_)"])), (1, _facts("a", "f(1)"))],
     [_facts("a", "f(1)").text, codec.remove_facts("a", ["f(_)"]).text]),
    ("a write of a later request, recorded before the snapshot came, stays after it",
     [(1, _facts("a", "f(1)")), (3, _facts("b", "g(1)")), ("compact", 2)],
     ["restore_system([])", codec.restore_app("a", SNAPSHOT["apps"]["a"]).text, _facts("b", "g(1)").text]),
    ("the late reply of a write the snapshot holds is not kept again",
     [("compact", 2), (1, _facts("a", "f(1)"))],
     ["restore_system([])", codec.restore_app("a", SNAPSHOT["apps"]["a"]).text]),
    ("an application dropped after the snapshot was asked for is not restored by it",
     [(1, _facts("a", "f(1)")), (3, codec.drop_app("a")), ("compact", 2)],
     ["restore_system([])"]),
    ("a drop makes obsolete only earlier requests' entries",
     [(3, _facts("a", "f(2)")), (2, codec.drop_app("a")), (1, _facts("a", "f(1)"))],
     [_facts("a", "f(1)").text, _facts("a", "f(2)").text]),
    ("a replacement makes obsolete only earlier requests' entries",
     [(2, codec.load_system("b.")), (1, codec.load_system("a."))],
     [codec.load_system("a.").text, codec.load_system("b.").text]),
    ("a capability granted before the snapshot, replied to after it, is kept",
     [("compact", 2), (1, codec.grant(TOKEN_A, "a"))],
     ["restore_system([])", codec.restore_app("a", SNAPSHOT["apps"]["a"]).text, codec.grant(TOKEN_A, "a").text]),
]


@pytest.mark.parametrize("what,recorded,replayed", ORDER_CASES, ids=[c[0] for c in ORDER_CASES])
def test_replies_in_any_order(what: str, recorded: list[tuple[Any, Any]], replayed: list[str]) -> None:
    journal = Journal()
    for rid, op in recorded:  # the snapshot was asked for before any of these replies came
        if rid == "compact":
            journal.snapshot_requested(op)
    for rid, op in recorded:
        if rid == "compact":
            journal.compact(SNAPSHOT, op)
        else:
            journal.record(op, rid)
    assert _texts(journal.ops()) == replayed


def test_one_snapshot_at_a_time() -> None:
    journal = Journal(compact_at_least=2)
    journal.record(_facts("a", "f(1)"), 1)
    journal.record(_facts("a", "f(2)"), 2)
    assert journal.needs_compaction()
    journal.snapshot_requested(3)
    journal.record(_facts("a", "f(3)"), 4)
    assert not journal.needs_compaction(), "a second snapshot while the first is on its way"
    journal.snapshot_lost()  # its engine was restarted
    assert journal.needs_compaction()

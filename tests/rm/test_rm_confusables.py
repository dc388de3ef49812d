"""Issue 47, item 8: names that would pass for another are refused (the pure rule).

Three tables: what a name may be on its own (rm/names.py), which name in use a new one looks like
(rm/confusables.py, Unicode's confusable skeletons), and which names look like the reserved
uid<N>.* and other.<PID> (rm/registry.py, rm/names.py).  The daemon's refusals are tested in
tests/rm/test_rm_names_and_bounds.py.
"""

from __future__ import annotations

import pytest

from cod.protocol.names import name_problem as wire_problem
from cod.rm import confusables
from cod.rm.names import looks_like_other, name_problem
from cod.rm.registry import Peer, Registry, reserved_for

CYR_A, CYR_SOFT_SIGN, CYR_KOMI_DE = "\u0430", "\u042c", "\u0501"  # а Ь ԁ

# (name, what the refusal says, or None: the name may be used)
ON_ITS_OWN = [
    ("db1", None),
    ("DB1", None),  # another case is a name of its own, unless a name like it is in use (below)
    ("db1 ", "ends with a space"),
    (" db1", "begins with a space"),
    ("  ", "begins with a space"),
    ("db 1", None),
    ("d" + CYR_SOFT_SIGN + "1", "mixes scripts ('d' is Latin, 'Ь' (U+042C CYRILLIC CAPITAL LETTER SOFT SIGN) is Cyrillic)"),
    ("p" + CYR_A + "ssword", "U+0430 CYRILLIC SMALL LETTER A) is Cyrillic"),
    ("db-\u0395\u03bb\u03bb\u03ac\u03b4\u03b1", "is Greek"),  # Latin and Greek
    ("pg-\u041c\u043e\u0441\u043a\u0432\u0430", "is Cyrillic"),
    ("\u03bf\u043e", "mixes scripts"),  # Greek and Cyrillic o
    ("1\u0661", "mixes the digits of two numbering systems"),  # 1 and Arabic-Indic one
    ("\u00e1\u0301", "repeats a combining mark"),
    ("db\u200d1", "U+200D (ZERO WIDTH JOINER)"),
    ("db\u200b1", "U+200B (ZERO WIDTH SPACE)"),
    ("\u202e1bd", "a bidirectional control"),
    ("db\u00a01", "U+00A0 (NO-BREAK SPACE)"),
    ("Zu\u0308rich", "NFC"),  # NFD: refused, not silently composed (the client would not know its name)
    ("Z\u00fcrich", None),  # the same name in NFC
    # names a database's users give, in one script each (or Latin with CJK), all accepted
    ("PostgreSQL 16", None), ("duckdb.worker-1", None), ("pg-main", None),
    ("\u6570\u636e\u5e93", None),  # 数据库
    ("\u6771\u4eac\u30bf\u30ef\u30fc", None),  # 東京タワー: Han and Katakana
    ("orders_\u6771\u4eac", None),  # Latin with Han
    ("\uc11c\uc6b8 db", None),  # 서울 db: Hangul with Latin
    ("\u041c\u043e\u0441\u043a\u0432\u0430", None),  # Москва
    ("\u0395\u03bb\u03bb\u03ac\u03b4\u03b1 16", None),  # Ελλάδα 16
    ("\u05e2\u05d1\u05e8\u05d9\u05ea", None),  # עברית
    ("\uff44\uff42\uff11", None),  # fullwidth ｄｂ１: a name of its own, until db1 is in use
    ("\U0001f418db", None),  # an emoji is of no script
    ("d" + CYR_KOMI_DE + "b", "mixes scripts"),
    (CYR_KOMI_DE + CYR_SOFT_SIGN + "1", None),  # all Cyrillic: only a name in use makes it a look-alike
]


@pytest.mark.parametrize("name, refusal", ON_ITS_OWN, ids=[ascii(n) for n, _ in ON_ITS_OWN])
def test_what_a_name_may_be_on_its_own(name, refusal):
    problem = name_problem(name)
    if refusal is None:
        assert problem is None, problem
    else:
        assert problem is not None and refusal in problem, problem
        assert wire_problem(name) is None  # the wire allows it: the daemon's rule is the stricter one


# (names in use, a new name, the one in use it looks like, or None)
LOOK_ALIKES = [
    (["db1"], "DB1", "db1"),
    (["db1"], "Db1", "db1"),
    (["DB1"], "db1", "DB1"),
    (["db1"], "db1", None),  # the name itself: joining it, not a look-alike
    (["db1"], "dbl", "db1"),  # ASCII l for 1
    (["db1"], "dbI", "db1"),  # capital I for 1: folding first would miss it
    (["db1"], "d" + CYR_SOFT_SIGN + "1", "db1"),
    (["db1"], CYR_KOMI_DE + CYR_SOFT_SIGN + "1", "db1"),  # whole-script Cyrillic look-alike
    (["ace"], "\u0430\u0441\u0435", "ace"),  # Cyrillic асе
    (["abe"], "\u0391\u0392\u0395", "abe"),  # Greek capitals ΑΒΕ
    (["paypal"], "p" + CYR_A + "ypal", "paypal"),
    (["db1"], "\uff44\uff42\uff11", "db1"),  # fullwidth
    (["pg-main"], "pg-rnain", "pg-main"),  # rn for m
    (["stra\u00dfe"], "STRASSE", "stra\u00dfe"),  # ß folds to ss
    (["Z\u00fcrich"], "Zu\u0308rich", "Z\u00fcrich"),  # NFD and NFC of one name
    (["db 1"], "db  1", "db 1"),  # two spaces for one
    (["pg-main", "db1"], "DB1", "db1"),
    # distinct names stay distinct
    (["db1"], "db2", None),
    (["Z\u00fcrich"], "Zurich", None),  # the diaeresis shows
    (["\u0395\u03bb\u03bb\u03ac\u03b4\u03b1"], "\u0395\u03bb\u03bb\u03b1\u03b4\u03b1", None),  # and the tonos
    (["\u6570\u636e\u5e93"], "\u6570\u636e\u4ed3\u5e93", None),  # 数据库, 数据仓库
    (["\u041c\u043e\u0441\u043a\u0432\u0430"], "Moskva", None),
    (["worker-1"], "worker-2", None),
    (["orders"], "orders_2024", None),
    ([], "db1", None),
]


@pytest.mark.parametrize("existing, name, alike", LOOK_ALIKES, ids=[ascii(n) for _, n, _ in LOOK_ALIKES])
def test_which_name_in_use_a_new_one_looks_like(existing, name, alike):
    assert confusables.look_alike(name, existing) == alike


@pytest.mark.parametrize("name, uid", [
    ("uid1000.pid5", 1000), ("uid0.x", 0),
    ("uidl000.pid5", 1000), ("uidlOOO.x", 1000), ("UID1000.x", 1000), ("UlD0.x", 0),
    ("uid\uff11\uff10\uff10\uff10.x", 1000),  # fullwidth digits
    ("uid.x", None), ("uid1000", None), ("uidx.pid5", None), ("fluid1000.x", None), ("db1", None),
])
def test_names_that_look_like_a_uids_reserved_ones_are_reserved_for_it(name, uid):
    assert reserved_for(name) == uid


@pytest.mark.parametrize("name, other", [
    ("other.123", True), ("other.l23", True), ("OTHER.123", True), ("0ther.1", True),
    ("other.12a", False), ("otherwise", False), ("other.", False), ("others.1", False),
])
def test_names_that_look_like_the_daemons_other_pid_names(name, other):
    assert looks_like_other(name) is other


def test_the_registry_refuses_another_uid_a_look_alike_of_its_reserved_names():
    reg = Registry()
    assert "reserved for uid 1000" in reg.name_refusal(2000, "uidl000.pid5", privileged=False)
    assert reg.name_refusal(1000, "uidl000.pid5", privileged=False) is None


def test_the_registry_says_which_application_name_in_use_a_new_one_looks_like():
    reg = Registry()
    conn = reg.add_connection(Peer(10, 1000, 1000), privileged=False)
    reg.claim_app(conn, "db1")
    assert reg.app_look_alike("DB1") == "db1"
    assert reg.app_look_alike("db1") is None  # the name itself
    assert reg.app_look_alike("db2") is None
    reg.remove_connection(conn.id)
    reg.release_name("db1")
    assert reg.app_look_alike("DB1") is None  # once db1 is free, a name like it may be taken

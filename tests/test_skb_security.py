"""Regression tests of the sandbox escapes an attacker with a local account found
(issue "Security first"): each one is refused, or stopped by its limit, and the
engine answers everyone else unchanged afterwards."""

from __future__ import annotations

import os
import time

import pytest

from cod.facts import machines
from cod.skb import SKB, SKBError

COST = (
    "db_cost_fn(NTuples, NRequests, RTimeMs, Cores) :- "
    "Cores is (NTuples * (0.85 * NRequests + 106.37)) / (3750000 * RTimeMs)."
)
CSCS_FACTS = ["db_ntuple(30000000)", "db_tsize(315)", "db_nquery(2048)", "db_nupdate(0)", "db_rtime(2000)"]


def victim_answer(skb: SKB) -> list[dict]:
    return skb.execute_query("victim", "secret(S), dbos_cost_function(St, N, P), X is 1/3")


@pytest.fixture(scope="module")
def skb():
    with SKB(query_timeout_s=1.0) as engine:
        engine.load_machine(machines.load("magnycours"))
        engine.add_facts("victim", ["secret(hunter2)", *CSCS_FACTS])
        engine.add_procedure("victim", COST)
        baseline = victim_answer(engine)
        assert baseline[0]["S"] == "hunter2" and baseline[0]["N"] == 8
        engine.baseline = baseline  # type: ignore[attr-defined]
        yield engine


def unchanged(skb: SKB) -> None:
    assert victim_answer(skb) == skb.baseline  # type: ignore[attr-defined]


def refused(skb: SKB, goal: str, *, app: str = "attacker") -> SKBError:
    with pytest.raises(SKBError) as err:
        skb.execute_query(app, goal)
    assert err.value.code == "unsafe", err.value
    return err.value


# ---- item 1: loading a file runs its directives as the daemon's user -----------------------------
@pytest.mark.parametrize("goal", [
    "use_module('{rel}')",
    "use_module('{rel}', [])",
    "load_files('{rel}', [])",
    "consult('{rel}')",
    "ensure_loaded('{rel}')",
    "use_module('../{up}/{name}')",
])
def test_no_query_loads_a_file(tmp_path, monkeypatch, goal):
    workdir = tmp_path / "cwd"
    workdir.mkdir()
    marker = tmp_path / "pwned"
    (workdir / "x.pl").write_text(f":- shell('touch {marker}').\n")
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "y.pl").write_text(f":- shell('touch {marker}').\n")
    monkeypatch.chdir(workdir)  # the engine resolves relative paths against its own directory
    with SKB(query_timeout_s=1.0) as engine:
        err = refused(engine, goal.format(rel="x", up="up", name="y"))
        assert "may not load files" in err.message or "not allowed" in err.message, err.message
        with pytest.raises(SKBError) as perr:
            engine.add_procedure("attacker", "evil :- " + goal.format(rel="x", up="up", name="y") + ".")
        assert perr.value.code == "unsafe"
    assert not marker.exists()


# ---- item 2: reading another application's namespace --------------------------------------------
@pytest.mark.parametrize("goal", [
    "G =.. [(:), app_victim, secret(S)], clause(G, true)",
    "clause(secret(S), true)",
    "G =.. [(:), cod_apps, app(A, M)], clause(G, true)",
    "G =.. [(:), app_victim, secret(_)], predicate_property(G, number_of_clauses(N))",
    "current_predicate(app_victim:P)",
    "import_module(M, cod_sys)",
    "current_module(M)",
    "W =.. [(:), app_victim, secret], with_output_to(string(S), listing(W))",
    "call(clause, secret(S), true)",
    "maplist(clause, [secret(S)], [true])",
])
def test_no_query_reads_another_namespace(skb, goal):
    err = refused(skb, goal)
    assert "hunter2" not in err.message and "hunter2" not in str(err.data)
    unchanged(skb)


def test_procedures_are_checked_the_same_way(skb):
    with pytest.raises(SKBError) as err:
        skb.add_procedure("attacker", "peek(S) :- G =.. [(:), app_victim, secret(S)], clause(G, true).")
    assert err.value.code == "unsafe" and "clause/2" in err.value.message
    with pytest.raises(SKBError):
        skb.execute_query("attacker", "peek(S)")
    unchanged(skb)


# ---- item 3: changing arithmetic (or anything global) for everyone -------------------------------
@pytest.mark.parametrize("flag, value", [
    ("prefer_rationals", "true"), ("float_zero_div", "infinity"), ("float_undefined", "nan"),
    ("float_overflow", "infinity"), ("float_rounding", "to_positive"), ("max_rational_size", "10"),
    ("occurs_check", "error"), ("double_quotes", "atom"),
])
def test_no_application_changes_a_prolog_flag(skb, flag, value):
    err = refused(skb, f"set_prolog_flag({flag}, {value})")
    assert "set_prolog_flag/2" in err.message and "share" in err.message
    unchanged(skb)


@pytest.mark.parametrize("goal", [
    "op(700, xfx, ===>)", "nb_getval(cod_app, X)", "b_getval(cod_app, X)", "nb_current(K, V)",
    "recorda(k, v)", "flag(k, _, 1)", "gensym(a, X)", "abolish_all_tables",
    "set_prolog_stack(global, limit(1000))", "maplist(assertz, [foo(1)])",
])
def test_no_application_touches_shared_state(skb, goal):
    refused(skb, goal)
    unchanged(skb)


# ---- item 6: restarting the engine at will -------------------------------------------------------
def test_abort_is_refused(skb):
    pid = skb.pid
    err = refused(skb, "abort")
    assert "abort/0" in err.message
    assert skb.pid == pid and skb.restarts == 0


@pytest.mark.parametrize("goal", [
    "catch(sleep(100), _, sleep(100))",
    "catch(sleep(100), E, true)",
    "catch(sleep(100), time_limit_exceeded, true)",
    "catch(sleep(100), cod_limit(_), true)",
    "catch(sleep(100), inference_limit_exceeded, true)",
    "catch_with_backtrace(sleep(100), _, true)",
    "setup_call_cleanup(true, sleep(100), sleep(100))",
    "call_cleanup(true, sleep(100))",
])
def test_the_limits_cannot_be_caught(skb, goal):
    pid = skb.pid
    refused(skb, goal)
    assert skb.pid == pid


def test_a_catch_that_names_its_errors_is_still_stopped_in_time(skb):
    pid = skb.pid
    t0 = time.monotonic()
    with pytest.raises(SKBError) as err:
        skb.execute_query("attacker", "catch(sleep(100), error(_, _), true)", timeout_s=0.3)
    assert err.value.code == "timeout"
    assert time.monotonic() - t0 < 1.5
    with pytest.raises(SKBError) as err:
        skb.execute_query("attacker", "repeat, catch(fail, error(_, _), true)", timeout_s=0.3)
    assert err.value.code in ("timeout", "resource")
    assert skb.pid == pid and skb.restarts == 0  # stopped inside the engine, no restart
    unchanged(skb)


def test_catching_ordinary_errors_works(skb):
    assert skb.execute_query("attacker", "catch(atom_length(X, _), error(E, _), true)") == [
        {"X": None, "E": "instantiation_error"}]


# ---- item 9: log flooding and forging ------------------------------------------------------------
def test_print_message_is_refused(skb):
    err = refused(skb, "print_message(error, format('forged~nERROR: root login', []))")
    assert "print_message/2" in err.message


def test_output_of_a_query_goes_nowhere(skb):
    # Writing to the standard streams is allowed by the sandbox but reaches no log and no reply.
    assert skb.execute_query("attacker", "writeln(forged), X = 1") == [{"X": 1}]
    assert skb.execute_query("attacker", "format('forged~n', []), X = 1") == [{"X": 1}]
    unchanged(skb)


# ---- item 15: surprising facts -------------------------------------------------------------------
def test_facts_are_ground(skb):
    with pytest.raises(SKBError) as err:
        skb.add_facts("attacker", ["city(Zürich)"])
    assert err.value.code == "domain" and "ground" in err.value.message and "quote" in err.value.message
    with pytest.raises(SKBError) as err:
        skb.add_facts("attacker", ["price(_, 3)"])
    assert "ground" in err.value.message
    assert skb.add_facts("attacker", ["city('Zürich')"]) == 1
    assert skb.execute_query("attacker", "city(C)") == [{"C": "Zürich"}]


def test_an_operator_term_is_not_a_fact(skb):
    with pytest.raises(SKBError) as err:
        skb.add_facts("attacker", ["db-rtime(3000)"])
    assert err.value.code == "domain" and "db_rtime" in err.value.message
    assert skb.add_facts("attacker", ["meeting(time(12:30))"]) == 1


# ---- item 12: the engine's memory as a whole; modules of applications that are gone -------------
def test_the_modules_of_applications_that_are_gone_are_freed():
    with SKB(load_library=False) as engine:
        base = engine.stats()
        for i in range(50):
            engine.add_facts(f"short_lived_{i}", ["x(1)"])
            engine.drop_app(f"short_lived_{i}")
        after = engine.stats()
        assert after["app_modules"] == base["app_modules"] and after["apps"] == base["apps"]


def test_a_memory_bomb_costs_a_restart_not_the_state():
    from cod.skb import EngineConfig

    cfg = EngineConfig(query_timeout_s=10.0, memory_limit_bytes=1 << 30, load_library=False)
    with SKB(config=cfg) as engine:
        engine.add_facts("victim", ["kept(1)"])
        # Atoms live outside the stacks: 1 MB doubled eleven times is 4 GB of atoms, held by variables.
        with pytest.raises(SKBError) as err:
            engine.execute_query("bomber", "format(atom(K0), '~*c', [1000, 0'x]), atom_concat(K0, K0, K1), atom_concat(K1, K1, K2), atom_concat(K2, K2, K3), atom_concat(K3, K3, K4), atom_concat(K4, K4, K5), atom_concat(K5, K5, K6), atom_concat(K6, K6, K7), atom_concat(K7, K7, K8), atom_concat(K8, K8, K9), atom_concat(K9, K9, K10), A0 = K10, atom_concat(A0, A0, A1), atom_concat(A1, A1, A2), atom_concat(A2, A2, A3), atom_concat(A3, A3, A4), atom_concat(A4, A4, A5), atom_concat(A5, A5, A6), atom_concat(A6, A6, A7), atom_concat(A7, A7, A8), atom_concat(A8, A8, A9), atom_concat(A9, A9, A10), atom_concat(A10, A10, A11)")
        assert err.value.code in ("resource", "engine"), err.value
        assert engine.execute_query("victim", "kept(X)") == [{"X": 1}]

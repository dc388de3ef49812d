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


# ==== issue 23 (security, round 2): the sandbox side ==============================================
SHELL = "shell('id > {marker}')"


def never_ran(skb: SKB, marker, pid: int) -> None:
    assert not marker.exists(), "an application's goal ran outside the sandbox"
    assert skb.pid == pid and skb.restarts == 0
    unchanged(skb)


# ---- item 1: an application's exception is written as a term, never formatted --------------------
@pytest.mark.parametrize("goal, needle", [
    ('throw(format("~@", [{shell}]))', "uncaught exception: format(\"~@\",[shell("),
    ('throw(error(format("~@", [{shell}]), _))', "Unknown error term: format(\"~@\",[shell("),
    ('throw(error(foo, context(bar, format("~@", [{shell}]))))', "(format(\"~@\",[shell("),
    ('throw(error(type_error(integer, x), context(format("~@", [{shell}]), format("~@", [{shell}]))))', "Type error"),
    ('throw(error(existence_error(procedure, format("~@", [{shell}])), _))', "unknown procedure format/2"),
    ('throw(message_lines([\'~@\'-[{shell}]]))', "message_lines([~@ - [shell("),
])
def test_an_applications_exception_is_never_formatted(skb, tmp_path, goal, needle):
    marker, pid = tmp_path / "pwned", skb.pid
    with pytest.raises(SKBError) as err:
        skb.execute_query("attacker", goal.format(shell=SHELL.format(marker=marker)))
    assert needle in err.value.message, err.value.message  # the term, written as data
    never_ran(skb, marker, pid)


def test_a_stored_procedure_that_throws_a_format_is_not_formatted(skb, tmp_path):
    marker, pid = tmp_path / "pwned", skb.pid
    skb.add_procedure("attacker", f'boom :- throw(format("~@", [{SHELL.format(marker=marker)}])).')
    with pytest.raises(SKBError) as err:
        skb.execute_query("attacker", "boom")
    assert err.value.code == "engine" and "uncaught exception" in err.value.message
    never_ran(skb, marker, pid)


def test_a_loop_inside_an_exceptions_format_does_not_spin_a_worker(skb):
    pid = skb.pid
    for _ in range(6):  # more than the application's 4 slots
        t0 = time.monotonic()
        with pytest.raises(SKBError) as err:
            skb.execute_query("attacker", 'throw(format("~@", [(repeat, fail)]))', timeout_s=2)
        assert err.value.code == "engine" and time.monotonic() - t0 < 1.5
    assert skb.execute_query("attacker", "X = 1") == [{"X": 1}]
    assert skb.pid == pid and skb.restarts == 0


# ---- item 2: no route to message translation or to an unchecked format ---------------------------
@pytest.mark.parametrize("goal, needle", [
    ('message_to_string(format("~@", [{shell}]), S)', "message_to_string/2"),
    ('message_to_codes(format("~@", [{shell}]), [], C)', "message_to_codes/3"),
    ("print_message_lines(current_output, '', ['~@'-[{shell}]])", "print_message_lines/3"),
    ('format("~@", [{shell}])', "~@"),
    ('format(atom(A), "~@", [{shell}])', "~@"),
    ('with_output_to(string(S), format("~@", [{shell}]))', "~@"),
    ('format(atom(A), "~p", [x])', "~p"),
    ("format(atom(A), '~W', [{shell}, [portray_goal(call)]])", "~W"),
    ("term_string({shell}, S, [portray_goal(call)])", "portray_goal"),
    ("format(atom(A), '~w', [x]), format(F, [{shell}])", "format"),
    ('sformat(S, "~@", [{shell}])', "sformat/3"),
    ('findall(S, format(atom(S), "~@", [{shell}]), L)', "~@"),
])
def test_no_route_to_an_unchecked_format(skb, tmp_path, goal, needle):
    marker, pid = tmp_path / "pwned", skb.pid
    text = goal.format(shell=SHELL.format(marker=marker))
    err = refused(skb, text)
    assert needle in err.message, err.message
    with pytest.raises(SKBError) as perr:
        skb.add_procedure("attacker", f"leak :- {text}.")
    assert perr.value.code == "unsafe"
    never_ran(skb, marker, pid)


# ---- items 2 and 4: format's numeric arguments are bounded before anything runs ------------------
@pytest.mark.parametrize("goal", [
    "format(atom(A), '~t~*|', [200000000])",
    "X is 10^1000, format(atom(A), '~100000000e', [X])",
    "X is 10^1000, format(atom(A), '~100000000f', [X])",
    "format(atom(A), '~*c', [100000000, 0'x])",
    "N is 10^8, format(atom(A), '~*c', [N, 0'x])",
    "format(atom(A), '~t~200000000|', [])",
    "format(atom(A), '~a~t~*+', [x, 200000000])",
    "format(atom(A), '~100000000d', [5])",
    "format(atom(A), '~100000000n', [])",
])
def test_format_cannot_allocate_without_bound(skb, goal):
    pid = skb.pid
    t0 = time.monotonic()
    err = refused(skb, goal)
    assert "1,000" in err.message and time.monotonic() - t0 < 1.0
    assert skb.pid == pid and skb.restarts == 0


def test_bounded_formats_still_work(skb):
    assert skb.execute_query("attacker", "format(atom(A), '~a~t~8|~w ~2f ~*c', [ab, c, 1.5, 3, 0'x])") == [
        {"A": "ab      c 1.50 xxx"}]


# ---- item 3: reserved exceptions cannot be thrown ------------------------------------------------
@pytest.mark.parametrize("goal", [
    "throw('$aborted')",
    "X = '$aborted', throw(X)",
    "atom_concat('$abor', ted, X), throw(X)",
    "throw(unwind(abort))",
    "throw(time_limit_exceeded)",
    "throw(time_limit_exceeded(1))",
    "throw(inference_limit_exceeded)",
    "throw(cod_limit(time))",
    "throw(cod_revoked)",
    "call(throw, '$aborted')",
    "maplist(throw, ['$aborted'])",
])
def test_reserved_exceptions_cannot_be_thrown(skb, goal):
    pid = skb.pid
    for _ in range(6):  # more than the application's slots: none is lost
        err = refused(skb, goal)
        assert "throw/1" in err.message and err.data.get("predicate") == "throw/1", err
    with pytest.raises(SKBError) as perr:
        skb.add_procedure("attacker", "rethrow(X) :- throw(X).")
    assert perr.value.code == "unsafe"
    assert skb.execute_query("attacker", "X = 1") == [{"X": 1}]
    assert skb.pid == pid and skb.restarts == 0
    unchanged(skb)


def test_an_applications_own_exceptions_still_work(skb):
    with pytest.raises(SKBError) as err:
        skb.execute_query("attacker", "atom_length(abc, N), throw(my_error(N))")
    assert err.value.code == "engine" and "my_error(3)" in err.value.message
    assert skb.execute_query("attacker", "catch(throw(my_error(1)), my_error(X), true)") == [{"X": 1}]


# ---- items 4 and 5: the text of an error is bounded, whatever the term ---------------------------
HUGE_ATOM = "format(atom(K0), '~*c', [1000, 0'x]), " + ", ".join(
    f"atom_concat(K{i}, K{i}, K{i + 1})" for i in range(17)) + ", A = K17"  # 131,072,000 characters


@pytest.fixture(scope="module")
def roomy():
    """An engine whose queries may take 10 s: building a 131 MB atom takes about 2 s."""
    with SKB(query_timeout_s=10.0, load_library=False) as engine:
        yield engine


@pytest.mark.parametrize("goal, needle", [
    (HUGE_ATOM + ", throw(big(A))", "big('xxx"),
    (HUGE_ATOM + ", throw(error(type_error(integer, A), context(foo/1, A)))", "Type error"),
    (HUGE_ATOM + ", throw(error(resource_error(A), _))", "resources"),
    ("X is 10^5000, throw(error(type_error(integer, X), _))", "digits"),
    ("X is 10^5000, throw(error(domain_error(small, f(X, X)), _))", "digits"),
    ("numlist(1, 100000, L), T =.. [g|L], throw(wide(T))", "wide(g(1,2,3"),
])
def test_the_text_of_an_error_is_bounded(roomy, goal, needle):
    pid = roomy.pid
    built = goal[:goal.rindex(", throw(")] + ", fail"
    t0 = time.monotonic()
    assert roomy.execute_query("attacker", built, timeout_s=10) == []
    t1 = time.monotonic()
    with pytest.raises(SKBError) as err:
        roomy.execute_query("attacker", goal, timeout_s=10)
    t2 = time.monotonic()
    assert needle in err.value.message, err.value.message[:300]
    assert len(err.value.message) <= 2003 and len(str(err.value.data)) < 2000
    assert "0" * 1000 not in err.value.message
    assert (t2 - t1) - (t1 - t0) < 1.5, (t1 - t0, t2 - t1)  # the error costs little more than the work
    assert roomy.pid == pid and roomy.restarts == 0


# ---- item 5 (low): the engine's command line and state --------------------------------------------
@pytest.mark.parametrize("goal", [
    "current_prolog_flag(argv, A)",
    "current_prolog_flag(os_argv, A)",
    "current_prolog_flag(F, V)",
    "F = os_argv, current_prolog_flag(F, V)",
    "statistics",
    "statistics(atoms)",
    "statistics(atoms, A)",
    "statistics(process_cputime, A)",
    "statistics(K, V)",
])
def test_the_engines_command_line_and_state_are_not_readable(skb, goal):
    err = refused(skb, goal)
    assert "--" not in err.message and "swipl" not in err.message


def test_a_querys_own_statistics_and_flags_are_readable(skb):
    [row] = skb.execute_query("attacker", "statistics(cputime, C), statistics(inferences, I), "
                                          "current_prolog_flag(bounded, B)")
    assert row["B"] == "false" and row["I"] > 0

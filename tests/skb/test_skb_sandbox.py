"""Untrusted application code: each attack is rejected or stopped with a clear
error, and the engine answers normally afterwards."""

from __future__ import annotations

import pytest

from cod.facts import machines
from cod.skb import SKB, SKBError


@pytest.fixture(scope="module")
def skb():
    with SKB(query_timeout_s=1.0) as engine:
        engine.load_machine(machines.load("shanghai"))
        engine.add_facts("victim", ["secret(1)"])
        yield engine


def still_answers(skb: SKB) -> None:
    assert skb.execute_query("victim", "secret(X), get_nr_cores(N)") == [{"X": 1, "N": 16}]


QUERY_ATTACKS = [
    # (goal, expected code, text the message must contain)
    ("shell(ls)", "unsafe", "shell"),
    ("shell('rm -rf /tmp/x', S)", "unsafe", "shell"),
    ("halt", "unsafe", "halt"),
    ("halt(1)", "unsafe", "halt"),
    ("open('/etc/passwd', read, S)", "unsafe", "open"),
    ("see('/etc/passwd')", "unsafe", "see"),
    ("read_term(user_input, T, [])", "unsafe", "read_term"),
    ("write(user_output, junk)", "unsafe", "write"),
    ("assertz(app_victim:secret(2))", "unsafe", "unsafe goal"),
    ("app_victim:secret(X)", "unsafe", "module"),
    ("assertz(secret(2))", "unsafe", "changes the database"),
    ("retract(get_nr_cores(_))", "unsafe", "changes the database"),
    ("G = shell(ls), call(G)", "unsafe", "meta-call"),
    ("atom_to_term('shell(ls)', G, _), call(G)", "unsafe", "meta-call"),
    ("nb_setval(k, 1)", "unsafe", ""),
    ("consult('/tmp/x.pl')", "unsafe", "consult/1"),
]


@pytest.mark.parametrize("goal, code, text", QUERY_ATTACKS)
def test_unsafe_queries_are_rejected(skb: SKB, goal: str, code: str, text: str) -> None:
    with pytest.raises(SKBError) as err:
        skb.execute_query("attacker", goal)
    assert err.value.code == code, err.value
    assert text in err.value.message
    still_answers(skb)


PROCEDURE_ATTACKS = [
    ("evil :- shell(ls).", "unsafe"),
    ("evil :- halt.", "unsafe"),
    ("evil(S) :- open('/etc/passwd', read, S).", "unsafe"),
    ("evil :- helper, shell(ls).", "unsafe"),  # an undefined helper does not hide the rest
    ("evil :- assertz(app_victim:secret(2)).", "unsafe"),
    ("app_victim:secret(2).", "permission"),
    ("get_nr_cores(1000).", "permission"),  # redefining a system predicate
    ("get_list_free_cpus([]) :- true.", "permission"),
    ("dbos_cost_function(0, 1, 1).", "permission"),  # a library procedure
    ("append(_, _, _).", "permission"),  # a built-in
    ("(a, b) :- true.", "permission"),
    (":- initialization(shell(ls)).", "permission"),
]


@pytest.mark.parametrize("text, code", PROCEDURE_ATTACKS)
def test_unsafe_procedures_are_rejected(skb: SKB, text: str, code: str) -> None:
    with pytest.raises(SKBError) as err:
        skb.add_procedure("attacker", text)
    assert err.value.code == code, err.value
    still_answers(skb)


def test_rejected_procedure_leaves_nothing_behind(skb: SKB) -> None:
    with pytest.raises(SKBError):
        skb.add_procedure("tidy", "ok(1).\nhelper2 :- undefined_thing.\nbad :- shell(ls).")
    assert skb.list_facts("tidy") == []
    with pytest.raises(SKBError) as err:
        skb.execute_query("tidy", "helper2")
    assert err.value.code == "existence"


def test_facts_cannot_redefine_system_predicates(skb: SKB) -> None:
    with pytest.raises(SKBError) as err:
        skb.add_facts("attacker", ["pu(99, 99, 0, 0)"])
    assert err.value.code == "permission"
    assert "pu/4" in err.value.message
    assert skb.execute_query("victim", "get_nr_cores(N)") == [{"N": 16}]


def test_endless_loop_is_stopped(skb: SKB) -> None:
    skb.add_procedure("attacker", "loop :- loop.")
    with pytest.raises(SKBError) as err:
        skb.execute_query("attacker", "loop", timeout_s=0.5)
    assert err.value.code in ("timeout", "resource")
    with pytest.raises(SKBError) as err:
        skb.execute_query("attacker", "repeat, sleep(0.01), fail", timeout_s=0.3)
    assert err.value.code == "timeout"
    assert "time limit" in err.value.message
    still_answers(skb)


def test_inference_limit_stops_busy_loops() -> None:
    with SKB(inference_limit=100_000) as engine:
        with pytest.raises(SKBError) as err:
            engine.execute_query("a", "between(1, inf, _), fail")
        assert err.value.code == "resource"
        assert "inference" in err.value.message
        assert engine.execute_query("a", "X = 1") == [{"X": 1}]


@pytest.mark.parametrize(
    "goal",
    [
        "numlist(1, 100000000, L)",
        "length(L, 200000000)",
        "findall(X, between(1, 100000000, X), L)",
        "bomb(L) = bomb(L), atom_length(abc, _), length(L, N), N > 100000000",
    ],
)
def test_memory_bomb_is_stopped(skb: SKB, goal: str) -> None:
    with pytest.raises(SKBError) as err:
        skb.execute_query("attacker", goal, timeout_s=5)
    assert err.value.code in ("resource", "timeout")
    still_answers(skb)


def test_output_cannot_reach_the_protocol(skb: SKB) -> None:
    # format/2 to the current output is allowed by the sandbox; it must go nowhere.
    assert skb.execute_query("attacker", 'format("~w~n", [junk]), X = 1') == [{"X": 1}]
    still_answers(skb)

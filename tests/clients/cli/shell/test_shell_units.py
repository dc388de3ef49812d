"""`cod shell`'s pure parts, table-driven: statements, Prolog text, answer stepping, the
machine rebuilt from a real SKB's facts, the allocation matrix and explanations."""

from __future__ import annotations

import re

import pytest

from cod.cli.matrix import cpu_groups
from cod.cli.shell.answers import AnswerStream
from cod.cli.shell.errors import caret_lines, describe, sentence
from cod.cli.shell.explain import explain_task, explanation_lines
from cod.cli.shell.predicates import clause_indicator, module_exports, system_predicates
from cod.cli.shell.render import allocation_matrix, plan_view
from cod.cli.shell.statements import Command, Query, full_stops, is_complete, parse_command, split
from cod.protocol.prolog_text import clause_text, solution_text, term_text
from cod.cli.shell.topology import TOPOLOGY_QUERY, machine_from_answer
from cod.facts import hwloc_xml, machines
from cod.skb import SKB, SKBError
from helpers.data import HWLOC_DIR


# ---- statements ---------------------------------------------------------------------------------
@pytest.mark.parametrize("text, complete", [
    ("get_nr_cores(N).", True),
    ("get_nr_cores(N)", False),
    ("foo(X,\n  Y).", True),
    ("X = 'a. b'", False),
    ("X = 'a. b'.", True),
    ('X = "end. "', False),
    ("X = 1.5", False),
    ("X = 1.5.", True),
    ("X =.. [f]", False),
    ("X =.. [f].", True),
    ("X = 0'.", False),  # the character code of '.', no full stop yet
    ("X = 0'. .", True),
    ("X = a. % a comment", True),
    ("X = a /* not. done", False),
    ("\\+ member(1, [2]).", True),
    (":tasks", True),
    ("  :explain scan", True),
    (":- initialization(foo)", False),
    ("", True),
])
def test_is_complete(text: str, complete: bool) -> None:
    assert is_complete(text) is complete


@pytest.mark.parametrize("text, expected", [
    ("X = 1. Y = 2.", [Query("X = 1.", 1), Query("Y = 2.", 1)]),
    (":tasks\nfoo(X,\n Y).\n% note\n:explain scan", [
        Command("tasks", [], ":tasks", 1), Query("foo(X,\n Y).", 2), Command("explain", ["scan"], ":explain scan", 5)]),
    ("get_nr_cores(N)", [Query("get_nr_cores(N).", 1)]),  # -c without a full stop
    ("X = 'a.\nb'.\n\n:plan", [Query("X = 'a.\nb'.", 1), Command("plan", [], ":plan", 4)]),
    ("\n\n  true.  ", [Query("true.", 3)]),
])
def test_split(text: str, expected: list) -> None:
    assert split(text) == expected


def test_split_requires_a_full_stop_when_asked() -> None:
    with pytest.raises(ValueError, match="full stop"):
        split("foo(X)", require_stop=True)


def test_full_stops_skip_quotes_comments_and_symbol_atoms() -> None:
    text = "X = '.', Y = \"a. b\", Z =.. [f], W = 1.5 /* . */ . % .\nV = a."
    assert [text[i - 1:i + 1] for i in full_stops(text)] == [" .", "a."]


def test_parse_command_words() -> None:
    assert parse_command(':update scan "max_cores=4"') == Command("update", ["scan", "max_cores=4"],
                                                                  ':update scan "max_cores=4"')


# ---- Prolog text ------------------------------------------------------------------------------------
def f(name: str, *args):
    return {"functor": name, "args": list(args)}


@pytest.mark.parametrize("value, text", [
    (1, "1"), (2.5, "2.5"), (1e300, "1.0e300"), ("abc", "abc"), ("Abc", "'Abc'"), ("hello world", "'hello world'"),
    ("it's", "'it\\'s'"), ("[]", "[]"), ("=..", "=.."), (None, "_"), ([], "[]"), ([1, "a", [2]], "[1, a, [2]]"),
    (f("f", "a", None), "f(a, _)"), (f("-", "a", "b"), "a-b"), (f("-", f("-", "a", "b"), "c"), "a-b-c"),
    (f("-", "a", f("-", "b", "c")), "a-(b-c)"), (f("-", 1), "-(1)"), (f("-", "a"), "-a"),
    (f("is", "X", f("+", 1, f("*", 2, 3))), "'X' is 1+2*3"), (f("*", f("+", 1, 2), 3), "(1+2)*3"),
    (f(",", "a", "b"), "a, b"), (f("f", f(",", "a", "b")), "f((a, b))"), (f(":-", "a", f(",", "b", "c")), "a :- b, c"),
    (f("-", 1, -1), "1- -1"), (f(":", "m", "g"), "m:g"), (f("{}", f(",", "a", "b")), "{a, b}"),
    (f("\\+", "a"), "\\+ a"), (f("f", "a b"), "f('a b')"), (f("[|]", 1, {"var": "T"}), "[1|T]"),
])
def test_term_text(value, text: str) -> None:
    assert term_text(value) == text


@pytest.mark.parametrize("solution, text", [
    ({}, "true"), ({"X": None}, "true"), ({"X": 1, "Y": None, "Z": "a"}, "X = 1,\nZ = a"),
    ({"L": [None, None]}, "L = [_, _]"), ({"T": f("-", "a", 1)}, "T = a-1"),
])
def test_solution_text(solution, text: str) -> None:
    assert solution_text(solution) == text


@pytest.mark.parametrize("canonical, text", [
    ("foo(1)", "foo(1)."),
    (":-(bar(A),','(foo(A),>(A,1)))", "bar(A) :-\n    foo(A),\n    A > 1."),
    (":-(db_cost_fn(A,B,C,D),is(D,/(*(A,+(*(0.47,B),265.29)),*(3750000,C))))",
     "db_cost_fn(A, B, C, D) :-\n    D is A*(0.47*B+265.29)/(3750000*C)."),
    ('greeting("hello world")', 'greeting("hello world").'),
    ("f('a b',[1,2|T],[])", "f('a b', [1, 2|T], [])."),
    ("not canonical ((", "not canonical ((."),  # shown as it came rather than lost
])
def test_clause_text(canonical: str, text: str) -> None:
    assert clause_text(canonical) == text


def test_clause_text_reads_what_a_real_skb_lists() -> None:
    with SKB(load_library=False) as skb:
        skb.add_procedure("t", "q(X, Y) :- member(X, [a, 'B c']), Y = \"s\", \\+ X == z.\nfact(1, [x|_]).")
        shown = [clause_text(line.rstrip(".")) for text in skb.list_procedures("t") for line in text.splitlines()]
    assert "q(A, B) :-\n    member(A, [a, 'B c']),\n    B = \"s\",\n    \\+ A == z." in shown
    assert any(re.fullmatch(r"fact\(1, \[x\|_\w*\]\)\.", s) for s in shown)


def test_clause_indicator() -> None:
    assert clause_indicator(":-(bar(A),','(foo(A),>(A,1)))") == "bar/1"
    assert clause_indicator('f("a,b", [1,2], g(x,y))') == "f/3"
    assert clause_indicator("z") == "z/0"


def test_system_predicates_are_the_schema_exports() -> None:
    names = {p.indicator for p in system_predicates()}
    assert {"pu/4", "cache/4", "numa_node/3", "allocated/2", "get_nr_cores/1", "l3_domain/2"} <= names
    assert not any(n.startswith("cod_sys_") for n in names)
    assert module_exports(":- module(m, [ a/1, % x/9\n b/2 ]).")[1] == [("a", 1), ("b", 2)]


# ---- answers one at a time ---------------------------------------------------------------------------
class Limit(Exception):
    pass


def stream_of(solutions: list, fail_from: int | None = None) -> tuple[AnswerStream, list[int]]:
    asked: list[int] = []

    def fetch(n: int) -> list:
        asked.append(n)
        if fail_from is not None and n >= fail_from:
            raise Limit(f"asked {n}")
        return solutions[:n]

    return AnswerStream(fetch, is_limit_error=lambda e: isinstance(e, Limit)), asked


@pytest.mark.parametrize("n", [0, 1, 2, 3, 7, 64])
def test_answers_all_shown_with_last_marked(n: int) -> None:
    stream, asked = stream_of([{"X": i} for i in range(n)])
    got = []
    while (a := stream.next()) is not None:
        got.append((a.solution["X"], a.more))
    assert got == [(i, i < n - 1) for i in range(n)]
    assert len(asked) <= 2 + max(1, n).bit_length()  # doubling: O(log n) requests, O(n) solutions


def test_answers_settle_for_one_when_looking_ahead_hits_a_limit() -> None:
    # Solution 1 comes at once, solution 2 never (the query runs into its limit).
    stream, asked = stream_of([{"X": 1}, {"X": 2}], fail_from=2)
    first = stream.next()
    assert first is not None and first.solution == {"X": 1} and first.more is None
    with pytest.raises(Limit):
        stream.next()
    with pytest.raises(Limit):  # known to fail: not asked again
        stream.next()
    assert asked == [2, 1]


def test_answers_other_errors_are_raised_at_once() -> None:
    def fetch(n: int) -> list:
        raise ValueError("syntax")

    with pytest.raises(ValueError):
        AnswerStream(fetch, is_limit_error=lambda e: isinstance(e, Limit)).next()


# ---- the machine, from a real SKB ------------------------------------------------------------------
SOURCES = [f"machine:{n}" for n in machines.names()] + [p.name for p in sorted(HWLOC_DIR.glob("*.xml"))]


@pytest.fixture(scope="module")
def skb():
    with SKB(load_library=False) as engine:
        yield engine


def _load(source: str):
    if source.startswith("machine:"):
        return machines.load(source.removeprefix("machine:"))
    return hwloc_xml.load(HWLOC_DIR / source)


@pytest.mark.parametrize("source", SOURCES)
def test_machine_rebuilt_from_skb_facts(skb: SKB, source: str) -> None:
    original = _load(source)
    skb.load_machine(original)
    rebuilt = machine_from_answer(skb.execute_query("shell", TOPOLOGY_QUERY)[0])
    o, r = original.to_dict(), rebuilt.to_dict()
    assert r["name"] == o["name"]
    assert [p for p in r["pus"] if p["online"]] == [p for p in o["pus"] if p["online"]]
    assert {p["id"] for p in r["pus"]} == {p["id"] for p in o["pus"]}
    for key in ("packages", "numa_nodes", "cores", "allowed_cpus", "allowed_mems", "total_memory_bytes"):
        assert r[key] == o[key], key
    assert sorted(map(repr, r["caches"])) == sorted(map(repr, o["caches"]))
    assert cpu_groups(rebuilt) == cpu_groups(original)


def test_machine_needs_cpus() -> None:
    from cod.cli.shell.topology import TopologyError

    with pytest.raises(TopologyError, match="no CPUs"):
        machine_from_answer({"Pus": []})


# ---- the allocation matrix --------------------------------------------------------------------------
MAGNY = machines.load("magnycours")
LISTING = {
    "epoch": 3, "plan": {"solver": "cpsat", "status": "optimal", "solve_ms": 12.5, "unavailable": [47]},
    "tasks": [
        {"task": "scan", "pid": 10, "app": "db", "cores": [0, 1, 2, 3, 6, 7, 10, 11], "releasing": [4],
         "properties": {"min_cores": 4, "max_cores": 8, "sensitive": ["numa"]}, "binding": ["max"]},
        {"task": "olap1", "pid": 11, "app": "olap", "cores": [12, 13, 18, 19], "releasing": [],
         "properties": {"min_cores": 2, "working_set_bytes": 8 << 30},
         "binding": ["exclusive neighbour scan", "memory of node 2", "memory of node 3", "unavailable CPUs",
                     "reserved for other.99"]},
    ],
    "other_tasks": [{"pid": 99, "comm": "burn", "cpu": 1.0, "cpus": [47]}],
}


@pytest.mark.parametrize("width", [60, 80, 100, 140, 200, 400])
def test_matrix_folds_to_the_width(width: int) -> None:
    lines = [t.plain for t in allocation_matrix(MAGNY, LISTING, width)]
    assert max(len(line) for line in lines) <= width
    cpu_rows = [line for line in lines if line.startswith("CPU ")]
    shown = [int(c) for row in cpu_rows for c in re.findall(r"\d+", row)]
    assert shown == [c for _, _, cpus in cpu_groups(MAGNY) for c in cpus]  # every CPU once, in group order
    scan = "".join(line.split(" ", 1)[1] for line in lines if line.startswith("scan "))
    assert scan.count("X") == 8 and scan.count("r") == 1
    other = "".join(line for line in lines if line.startswith("other "))
    assert other.count("#") == 1
    if width >= 400:
        assert len(cpu_rows) == 1


def test_matrix_cuts_a_group_wider_than_the_terminal() -> None:
    big = machines.load("nehalem-ex") if "nehalem-ex" in machines.names() else MAGNY
    listing = {"epoch": 1, "plan": {}, "tasks": [], "other_tasks": []}
    lines = [t.plain for t in allocation_matrix(big, listing, 40)]
    assert max(len(line) for line in lines) <= 40


def test_matrix_groups_by_node_and_l3() -> None:
    head = [t.plain for t in allocation_matrix(MAGNY, LISTING, 400)][:2]
    assert head[0].split("|")[1].strip() == "node 0" and head[1].split("|")[1].strip() == "L3 0-5"
    assert len(head[0].split("|")) == 8 + 2


# ---- explanations -----------------------------------------------------------------------------------
def test_explanation_sentences_name_the_evidence() -> None:
    ex = explain_task("olap1", LISTING, MAGNY)
    text = "\n".join(explanation_lines(ex))
    assert "Task scan holds CPUs 0-3,6-7,10-11" in text
    assert "NUMA nodes 2 and 3 have no room for another 8 GiB working set" in text
    assert "CPUs 47 are kept free for busy processes no task registered: pid 99 (burn)" in text
    assert ("Unregistered busy process 99 (burn) is kept on CPUs 47: moving it there cost less than moving "
            "a registered task, so olap1 cannot have them.") in text
    assert "node 2, L3 12-17: 12-13 (2 of 6); working sets 2 x 8 GiB = 16 GiB of 16 GiB" in text
    scan = "\n".join(explanation_lines(explain_task("scan", LISTING, MAGNY)))
    assert "It holds its max_cores (8)" in scan and "giving back CPUs 4" in scan
    assert "NUMA-sensitive: on 2 node(s); the fewest that could hold 8 CPUs: 2." in scan


@pytest.mark.parametrize("pages,says", [
    ({}, ["Not measured yet (the daemon reads numa_maps every few refreshes)."]),
    ({"2": 256 * 900, "3": 256 * 100}, ["1000 MiB resident: node 2 900 MiB (90%), node 3 100 MiB (10%)",
                                        "100% on the nodes of its CPUs (2, 3)."]),
    ({"0": 256 * 30, "2": 256 * 70}, ["100 MiB resident: node 0 30 MiB (30%), node 2 70 MiB (70%)",
                                      "70% on the nodes of its CPUs (2); the rest drifted off them or was not "
                                      "moved (the daemon logs it)."]),
])
def test_explain_says_where_the_tasks_memory_is(pages, says) -> None:
    listing = {**LISTING, "tasks": [{**t, "numa_pages": pages} if t["task"] == "olap1" else t for t in LISTING["tasks"]]}
    if pages == {"0": 256 * 30, "2": 256 * 70}:
        listing["tasks"] = [{**t, "cores": [12, 13]} if t["task"] == "olap1" else t for t in listing["tasks"]]
    ex = explain_task("olap1", listing, MAGNY)
    assert ex["memory"] == says
    text = explanation_lines(ex)
    assert text[text.index("Where its memory is:") + 1:][:len(says)] == [f"  - {m}" for m in says]


def test_explain_says_why_memory_nodes_are_more_than_its_cpus_nodes() -> None:
    """A working set that did not fit its CPUs' nodes: the allocation's memory nodes and its reason."""
    why = "its working set, 2 GiB (1 GiB per CPU x 2 CPUs), does not fit ... node 3 (distance 16, 1 GiB free)"
    listing = {**LISTING, "tasks": [{**t, "cores": [12, 13], "memory_nodes": [2, 3], "memory_reason": why,
                                     "numa_pages": {"2": 256 * 600, "3": 256 * 400}}
                                    if t["task"] == "olap1" else t for t in LISTING["tasks"]]}
    assert explain_task("olap1", listing, MAGNY)["memory"] == [
        f"Memory nodes 2, 3: {why}.", "1000 MiB resident: node 2 600 MiB (60%), node 3 400 MiB (40%)",
        "100% on its memory nodes (2, 3)."]


def test_explain_unknown_task_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="registered tasks: olap1, scan"):
        explain_task("nope", LISTING, MAGNY)


# ---- errors as sentences ------------------------------------------------------------------------------
def test_syntax_error_caret_points_at_the_column() -> None:
    p = describe(SKBError("syntax_error", "syntax error at line 2, column 6: cannot start term",
                          {"line": 2, "column": 6}), source="member(X, [1])\n, Y = ).")
    assert p.message == "Syntax error at line 2, column 6: cannot start term."
    assert p.detail == ["  2:, Y = ).", "         ^"]
    assert caret_lines("foo(a b).", 1, 7) == ["    foo(a b).", "          ^"]


def test_unknown_procedure_that_is_a_command_hints_the_prefix() -> None:
    p = describe(SKBError("existence", "unknown procedure tasks/0", {"predicate": "tasks/0"}),
                 commands=frozenset({"tasks"}))
    assert p.message == "Unknown procedure tasks/0 (shell commands start with ':', as in :tasks)."


@pytest.mark.parametrize("raw, text", [
    ("no task named 'x'", "No task named 'x'."), ("foo/1 is unknown", "foo/1 is unknown."), ("Done.", "Done."),
])
def test_sentence(raw: str, text: str) -> None:
    assert sentence(raw) == text


@pytest.mark.parametrize("plan, says", [
    ({"solver": "greedy", "status": "optimal", "solve_ms": 0.3, "proof": "greedy = waterfill bound"},
     "optimal in 0.30 ms: the greedy allocation reached the waterfill bound, which proves it optimal, "
     "so CP-SAT's search was not needed."),
    ({"solver": "cpsat", "status": "optimal", "solve_ms": 5.0, "proof": "count model = relaxation bound"},
     "optimal in 5.00 ms: CP-SAT's count model reached the bound of the relaxed model, which proves it optimal."),
    ({"solver": "greedy", "status": "fallback", "solve_ms": 1.0, "proof": "cpsat: no solution in time"},
     "CP-SAT found no solution within its time limit, so the greedy allocation is used"),
    ({"solver": "cpsat", "status": "optimal", "solve_ms": 2.0, "proof": "something new"},
     "optimal in 2.00 ms: found by cpsat (something new)."),
])
def test_plan_view_says_how_the_plan_was_proven(plan, says):
    text = "\n".join(str(line) for line in plan_view(plan, {"epoch": 3, "tasks": []}))
    assert says in text and "Epoch 3" in text


@pytest.mark.parametrize("typed, says", [
    ("\\tasks", "shell commands start with ':', not '\\' as in psql: use :tasks"),
    ("\\alloc", "shell commands start with ':', not '\\' as in psql: use :allocation"),
    ("\\explain scan", "shell commands start with ':', not '\\' as in psql: use :explain scan"),
    ("\\q", "shell commands start with ':', not '\\' as in psql: use :quit"),
    ("\\?", "shell commands start with ':', not '\\' as in psql: use :help"),
    ("\\dt", "shell commands start with ':', not '\\' as in psql: use :facts"),
    ("\\zzz", "shell commands start with ':', not '\\' as in psql (try :help)"),
])
def test_a_psql_command_says_what_to_type(typed, says):
    from cod.cli.shell.statements import is_complete, psql_hint, split

    assert is_complete(typed)  # Enter answers at once: no continuation prompt
    [cmd] = split(typed)
    assert psql_hint(cmd, ["tasks", "allocation", "explain", "help", "quit", "facts", "procedures"]) == says


@pytest.mark.parametrize("goal", ["\\+ member(a, [b]).", "\\+member(a, [b]).", "X = \\tasks."])
def test_goals_with_a_backslash_stay_goals(goal):
    from cod.cli.shell.statements import Query, split

    assert [type(s) for s in split(goal)] == [Query]


@pytest.mark.parametrize("load, text", [(70.95123, "71%"), (120.0, "120%"), (4.5, "4.5%"), (4.0, "4%"),
                                        (0.04, "0%"), (None, "-"), (99.5, "100%")])
def test_load_is_rounded_as_a_person_reads_it(load, text):
    from cod.cli.shell.render import load_text

    assert load_text(load) == text

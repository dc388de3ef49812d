"""The one writer and the one reader of Prolog text (cod.protocol.prolog_text, cod.protocol.terms):
escaping tables for data and display, reading tables, and a real SWI-Prolog reading what the
writer wrote and writing what the reader reads."""

from __future__ import annotations

import math

import pytest

from cod.protocol.prolog_text import (
    ANY, PrologTextError, Written, atom, clause_text, compound, display_atom, number, predicate_name, string,
    term, term_text,
)
from cod.protocol.terms import TermSyntaxError, parse, read, unifiable
from cod.skb import SKB


# ---- writing data -----------------------------------------------------------------------------------
@pytest.mark.parametrize("text, written", [
    ("scan", "scan"),                        # a plain word stays bare
    ("scan_2", "scan_2"),
    ("Scan", "'Scan'"),                      # looks like a variable
    ("_scan", "'_scan'"),
    ("_", "'_'"),
    ("", "''"),
    ("hello world", "'hello world'"),
    ("it's", "'it\\'s'"),                    # the quote
    ("a\\b", "'a\\\\b'"),                    # the backslash
    ("a\nb\tc\rd", "'a\\nb\\tc\\rd'"),         # named escapes
    ("bell\x07", "'bell\\x7\\'"),            # other controls in hex
    ("del\x7f", "'del\\x7f\\'"),
    ("c1\x85", "'c1\\x85\\'"),
    ("a\u2028b", "'a\\x2028\\b'"),           # not printable: hex, as writeq
    ("soft\u00adhyphen", "'soft\\xad\\hyphen'"),
    ("é", "'é'"),                            # printable unicode as is
    ("数据库", "'数据库'"),
    ("emoji 🙂", "'emoji 🙂'"),
    ("=..", "'=..'"),                        # operators are quoted in data
    ("-", "'-'"),
    (":-", "':-'"),
    (",", "','"),
    ("|", "'|'"),
    ("[]", "'[]'"),
    ("{}", "'{}'"),
    ("!", "'!'"),
    ("42", "'42'"),                          # a number-looking atom stays an atom
    ("1.5e3", "'1.5e3'"),
    ("foo(X)", "'foo(X)'"),                  # a goal inside an atom stays one atom
    ("a'), halt, ('", "'a\\'), halt, (\\''"),
    ('say "hi"', "'say \"hi\"'"),
])
def test_atom(text: str, written: str) -> None:
    assert atom(text) == written


@pytest.mark.parametrize("text, written", [
    ("plain", '"plain"'),
    ('say "hi"', '"say \\"hi\\""'),
    ("it's", '"it\'s"'),
    ("a\\b\n", '"a\\\\b\\n"'),
    ("x\x00y", '"x\\x0\\y"'),
    ("ü\u2029", '"ü\\x2029\\"'),
])
def test_string(text: str, written: str) -> None:
    assert string(text) == written


@pytest.mark.parametrize("bad", ["a\ud800b", 3, None, b"bytes"])
def test_what_is_not_text_is_refused(bad) -> None:
    with pytest.raises(PrologTextError):
        atom(bad)
    with pytest.raises(PrologTextError):
        string(bad)


@pytest.mark.parametrize("value, written", [
    (0, "0"), (-7, "-7"), (10**30, "1000000000000000000000000000000"),
    (2.5, "2.5"), (-0.0, "-0.0"), (1.0, "1.0"), (0.1, "0.1"),
    (1e20, "1.0e20"), (1.5e-7, "1.5e-7"), (-2e300, "-2.0e300"), (5e-324, "5.0e-324"),
])
def test_number(value, written: str) -> None:
    assert number(value) == written
    assert parse(written) == value and type(parse(written)) is type(value)


@pytest.mark.parametrize("value, display", [
    (math.inf, "1.0Inf"), (-math.inf, "-1.0Inf"), (math.nan, "1.5NaN"),
])
def test_special_floats_are_refused_as_data_and_shown_as_swi_prolog_writes_them(value, display: str) -> None:
    with pytest.raises(PrologTextError, match="cannot write"):
        number(value)
    with pytest.raises(PrologTextError):
        term([1, value])
    assert number(value, special=True) == display == term_text(value)
    back = parse(display)
    assert (math.isnan(back) and math.isnan(value)) or back == value


@pytest.mark.parametrize("value, written", [
    (True, "true"), (False, "false"), (None, "none"),
    ("Scan", "'Scan'"), ([1, "a", [2.5, "B"]], "[1, a, [2.5, 'B']]"), ((3, 1), "[3, 1]"),
    ({3, 1, 2}, "[1, 2, 3]"), ([], "[]"), (ANY, "_"), (Written("f(X)"), "f(X)"),
])
def test_term(value, written: str) -> None:
    assert term(value) == written


def test_term_refuses_what_has_no_prolog_form() -> None:
    with pytest.raises(PrologTextError, match="dict"):
        term({"a": 1})


@pytest.mark.parametrize("args, kwargs, written", [
    (("task", "scan", 12, "db"), {}, "task(scan, 12, db)"),
    (("task", "Scan 1", ANY, ANY), {}, "task('Scan 1', _, _)"),
    (("cores", [0, 1]), {"sep": ","}, "cores([0,1])"),
    (("halt",), {}, "halt"),
    (("Odd name", 1), {}, "'Odd name'(1)"),
])
def test_compound(args, kwargs, written: str) -> None:
    assert compound(*args, **kwargs) == written


@pytest.mark.parametrize("fact, name", [
    ("db_ntuple(3750000)", "db_ntuple"), ("  go :- true", "go"), ("halt.", "halt"), ("X = 1", None),
])
def test_predicate_name(fact: str, name) -> None:
    assert predicate_name(fact) == name


# ---- writing for display ------------------------------------------------------------------------------
@pytest.mark.parametrize("text, shown", [
    ("abc", "abc"), ("=..", "=.."), ("[]", "[]"), ("!", "!"), ("{}", "{}"), ("Abc", "'Abc'"),
    ("it's", "'it\\'s'"), ("a\u2028b", "'a\\x2028\\b'"), ("lone\ud800", "'lone\\xd800\\'"),
])
def test_display_atom(text: str, shown: str) -> None:
    assert display_atom(text) == shown


@pytest.mark.parametrize("value, shown", [
    ({"string": 'say "hi"'}, '"say \\"hi\\""'), ({"string": "it's"}, '"it\'s"'), ({"string": "=.."}, '"=.."'),
    ({"var": "_G1"}, "_G1"),
])
def test_display_strings_and_variables(value, shown: str) -> None:
    assert term_text(value) == shown


# ---- reading ------------------------------------------------------------------------------------------
def f(name: str, *args):
    return {"functor": name, "args": list(args)}


@pytest.mark.parametrize("text, value", [
    ("foo", "foo"), ("'Foo bar'", "Foo bar"), ("'it''s'", "it's"), ("'it\\'s'", "it's"),
    ("'a\\\\b'", "a\\b"), ("'a\\nb'", "a\nb"), ("'\\x41\\\\x2028\\'", "A\u2028"), ("'\\101\\'", "A"),
    ("'a\\\nb'", "ab"), ("'\\e\\s'", "\x1b "),
    ("X", {"var": "X"}), ("_", {"var": "_"}), ("_Y", {"var": "_Y"}),
    ("42", 42), ("-3", -3), ("2.5", 2.5), ("1.0e20", 1e20), ("1e10", 1e10), ("-1.0Inf", -math.inf),
    ('"s\\"q"', {"string": 's"q'}), ('"a""b"', {"string": 'a"b'}),
    ("[]", []), ("[1, a]", [1, "a"]), ("[a|T]", f("[|]", "a", {"var": "T"})), ("{}", "{}"),
    ("{a}", f("{}", "a")), ("{}(a)", f("{}", "a")), ("f(x, [1, 2|T])", f("f", "x", f("[|]", 1, f("[|]", 2, {"var": "T"})))),
    (":-(a,','(b,!))", f(":-", "a", f(",", "b", "!"))), ("=..(X,[f])", f("=..", {"var": "X"}, ["f"])),
    ("-(1)", f("-", 1)), ("'hello world'(1)", f("hello world", 1)),
])
def test_parse(text: str, value) -> None:
    assert parse(text) == value


@pytest.mark.parametrize("text", [
    "", "f(", "f(a", "a b", "[1,2", "'open", "a - b", "'\\q'", "f(a))", "'\\x110000\\'", "X = 1",
])
def test_what_the_reader_cannot_read(text: str) -> None:
    with pytest.raises(TermSyntaxError):
        parse(text)
    assert read(text) is None


def test_read_takes_a_full_stop_and_refuses_deep_nesting_cleanly() -> None:
    assert read("db_rtime(3000).") == f("db_rtime", 3000)
    assert read("f(" * 5000 + "a" + ")" * 5000) is None


@pytest.mark.parametrize("text", [
    "scan", "Scan", "it's", "a\\b", "a\nb\tc\rd", "bell\x07", "a\u2028b", "数据库", "=..", ",", "[]", "42", "",
])
def test_what_the_writer_writes_the_reader_reads(text: str) -> None:
    assert parse(atom(text)) == text
    assert parse(string(text)) == {"string": text}
    if text not in (",", "[]"):  # shown bare, these read as punctuation and as the empty list
        assert parse(display_atom(text)) == text


@pytest.mark.parametrize("a, b, unify", [
    ("db_rtime(_)", "db_rtime(3000)", True),
    ("f(X, X)", "f(1, 1)", True), ("f(X, X)", "f(1, 2)", False), ("f(_, _)", "f(1, 2)", True),
    ("f([a|T])", "f([a, b])", True), ("f([a, b|T])", "f([a])", False), ("f([])", "f('[]')", False),
    ("f(1)", "f(1.0)", False), ("f(\"a\")", "f(a)", False), ("f(1.5NaN)", "f(1.5NaN)", True),
    ("f(X, g(X))", "f(a, g(b))", False), ("f(X, Y)", "f(Y, a)", True),
])
def test_unifiable(a: str, b: str, unify: bool) -> None:
    assert unifiable(read(a), read(b)) is unify


# ---- a real SWI-Prolog ----------------------------------------------------------------------------------
TRICKY = ["scan", "Scan 1", "it's", "a\\b", "a\nb\tc", "bell\x07", "a\u2028b", "soft\u00ad", "é数据🙂", "=..",
          ":-", ",", "|", "[]", "{}", "42", "", "a'), halt, ('", 'say "hi"']


@pytest.fixture(scope="module")
def skb():
    with SKB(load_library=False) as engine:
        yield engine


@pytest.mark.parametrize("text", TRICKY)
def test_swi_prolog_reads_each_atom_and_string_as_the_one_written(skb, text: str) -> None:
    rows = skb.execute_query("t", f"A = {atom(text)}, atom(A), S = {string(text)}, string(S)")
    assert rows == [{"A": text, "S": text}]


def test_the_reader_reads_what_swi_prolog_writes_in_canonical_form(skb) -> None:
    goal = ("member(T, [" + ", ".join(atom(t) for t in TRICKY) + "]), "
            "format(atom(K), '~k', [f(T, \"s\\\"q\", 1.0e20, -3, [x|_], {y})])")
    rows = skb.execute_query("t", goal)
    assert len(rows) == len(TRICKY)
    for text, row in zip(TRICKY, rows):
        value = parse(row["K"])
        assert value["functor"] == "f" and value["args"][0] == text, row["K"]
        assert value["args"][1:4] == [{"string": 's"q'}, 1e20, -3]
        assert value["args"][4]["functor"] == "[|]" and value["args"][5] == f("{}", "y")


def test_clause_text_shows_an_unreadable_clause_as_it_came() -> None:
    assert clause_text("not canonical ((") == "not canonical ((."


ATOMS = [
    # (text, as an atom): the same whether the text is short (cached) or long (not)
    ("abc", "abc"), ("a_B9", "a_B9"), ("Abc", "'Abc'"), ("a b", "'a b'"), ("it's", "'it\\'s'"),
    ("a\nb", "'a\\nb'"), ("é", "'é'"),
]


@pytest.mark.parametrize("text,expected", ATOMS)
def test_atoms_short_and_long_are_written_alike(text: str, expected: str) -> None:
    for _ in range(2):  # the second time from the cache
        assert atom(text) == expected
    long = text + "x" * 100  # past the cached length
    assert atom(long) == (long if expected == text else expected[:-1] + "x" * 100 + "'")
    assert atom(Written(text)) == expected and type(atom(Written(text))) is str


def test_an_unpaired_surrogate_is_refused_every_time() -> None:
    for _ in range(2):  # a refusal is not cached as an answer
        with pytest.raises(PrologTextError):
            atom("a\ud800")


def test_terms_of_plain_strings_and_ints_and_their_subclasses() -> None:
    assert atom("") == "''" and term("abc") == "abc" and term(7) == "7"
    assert term(True) == "true" and term(Written("_")) == "_"
    assert term(["a", 1, "B"]) == "[a, 1, 'B']"

"""docs/design-allocator.md's tables of the task file's and the others file's keys against the code
(issue 53, item 3): every field of `TaskSpec` / `OtherDemand` has a row and every row a field, with
the field's default and kind of value, and, for a key with a fixed set of values, that set. A key
added to the code without a row fails here; so does the README's pointer to the table leading
nowhere."""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from typing import Any, Callable

import pytest

from cod.rm.allocator.model import BOUNDS, LOCALITIES, SENSITIVITIES, OtherDemand, TaskSpec
from helpers.paths import REPO

DOC = REPO / "docs" / "design-allocator.md"
TASKS_HEADING = "## The task file's keys"
OTHERS_HEADING = "### The others file's keys"
# Keys whose values are one of a fixed set: the type cell names exactly these, each in backticks.
VALUE_SETS: dict[str, tuple[str, ...]] = {"bound": BOUNDS, "sensitive": SENSITIVITIES, "locality": LOCALITIES}
# The type cell's first word for each kind of annotation (a string with a fixed set: "one of").
KIND_WORDS: dict[type, tuple[str, ...]] = {
    bool: ("boolean",), int: ("integer",), str: ("string", "one of"),
    frozenset: ("list",), tuple: ("list",),
}

Row = dict[str, str]


def table_after(heading: str, text: str | None = None) -> dict[str, Row]:
    """The rows, by key, of the first Markdown table after `heading` (a line of its own)."""
    lines = (DOC.read_text() if text is None else text).splitlines()
    assert heading in lines, f"{DOC.relative_to(REPO)} has no heading {heading!r}"
    start = lines.index(heading)
    table = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            table.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif table:
            break
    header, _rule, *body = table
    assert header == ["key", "type", "default", "meaning"], header
    return {row[0].strip("`"): dict(zip(header, row)) for row in body}


def _kind(hint: Any) -> tuple[type, bool]:
    """(the base type, whether null is allowed) of a field's annotation."""
    nullable = False
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        nullable = len(args) < len(typing.get_args(hint))
        (hint,) = args
    return (typing.get_origin(hint) or hint), nullable


def _as_json(value: Any) -> Any:
    return sorted(value) if isinstance(value, (frozenset, tuple)) else value


def mismatches(rows: dict[str, Row], cls: type) -> list[str]:
    """Every way the table differs from the dataclass's fields; [] when it describes them."""
    hints = typing.get_type_hints(cls)
    found = []
    fields = {f.name: f for f in dataclasses.fields(cls)}
    found += [f"no row for key {k!r}" for k in fields if k not in rows]
    found += [f"row {k!r} is no key of {cls.__name__}" for k in rows if k not in fields]
    for name, field in fields.items():
        row = rows.get(name)
        if row is None:
            continue
        if field.default is dataclasses.MISSING:
            if row["default"] != "required":
                found.append(f"{name}: the default is 'required', not {row['default']!r}")
        elif not re.fullmatch(r"`[^`]*`", row["default"]) \
                or json.loads(row["default"].strip("`")) != _as_json(field.default):
            found.append(f"{name}: the default is `{json.dumps(_as_json(field.default))}`, "
                         f"not {row['default']!r}")
        base, nullable = _kind(hints[name])
        if not row["type"].startswith(KIND_WORDS[base]):
            found.append(f"{name}: the type is {' or '.join(KIND_WORDS[base])}..., not {row['type']!r}")
        if nullable != row["type"].endswith("or null"):
            found.append(f"{name}: {'may' if nullable else 'may not'} be null; the type says {row['type']!r}")
        named = set(re.findall(r"`([^`]*)`", row["type"])) - set(fields)
        if name in VALUE_SETS and named != set(VALUE_SETS[name]):
            found.append(f"{name}: the values are {sorted(VALUE_SETS[name])}, the row names {sorted(named)}")
    return found


@pytest.mark.parametrize("heading, cls", [(TASKS_HEADING, TaskSpec), (OTHERS_HEADING, OtherDemand)])
def test_the_table_is_the_code(heading: str, cls: type) -> None:
    assert mismatches(table_after(heading), cls) == []


@dataclasses.dataclass(frozen=True)
class _Grown(TaskSpec):
    budget_us: int = 0


def _edited(key: str, column: str, value: str) -> Callable[[], dict[str, Row]]:
    def rows() -> dict[str, Row]:
        table = table_after(TASKS_HEADING)
        return {**table, key: {**table[key], column: value}}
    return rows


def _added(key: str) -> dict[str, Row]:
    table = table_after(TASKS_HEADING)
    return {**table, key: table["priority"]}


# What the check must catch: each edit of the code or the table (made when the test runs), and
# the words it says.
CAUGHT = [
    ("a key the table lacks", lambda: table_after(TASKS_HEADING), _Grown, "no row for key 'budget_us'"),
    ("a row the code lacks", lambda: _added("gpus"), TaskSpec, "row 'gpus' is no key"),
    ("another default", _edited("min_cores", "default", "`2`"), TaskSpec, "min_cores: the default is `1`"),
    ("a default not JSON", _edited("exclusive", "default", "yes"), TaskSpec, "exclusive: the default is `true`"),
    ("another kind", _edited("priority", "type", "boolean"), TaskSpec, "priority: the type is integer"),
    ("null not said", _edited("max_cores", "type", "integer >= 1"), TaskSpec, "max_cores: may be null"),
    ("a value missing", _edited("bound", "type", "one of `cpu`"), TaskSpec, "bound: the values are"),
    ("required not said", _edited("name", "default", '`""`'), TaskSpec, "name: the default is 'required'"),
]


@pytest.mark.parametrize("case, rows, cls, words", CAUGHT, ids=[c[0] for c in CAUGHT])
def test_the_check_catches(case: str, rows: Callable[[], dict[str, Row]], cls: type, words: str) -> None:
    said = mismatches(rows(), cls)
    assert len(said) == 1 and words in said[0], said


def github_anchor(heading: str) -> str:
    """The fragment GitHub gives a Markdown heading."""
    words = heading.lstrip("#").strip().lower()
    return re.sub(r"[^\w\- ]", "", words).replace(" ", "-")


def test_the_readme_points_at_the_table() -> None:
    link = f"docs/design-allocator.md#{github_anchor(TASKS_HEADING)}"
    assert link in (REPO / "README.md").read_text()
    assert link.split("/", 1)[1] in (REPO / "docs" / "examples" / "tasks.toml").read_text()

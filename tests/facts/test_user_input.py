"""The bounds on a user's input (facts/user_input.py) and terminal-safe text (clients/cli/terminal.py),
table by table, at and just past each limit.  The commands that use them: test_cli_bad_input.py."""

from __future__ import annotations

import io
import os
import threading

import pytest

from cod.cli.terminal import terminal_safe, terminal_safe_lines
from cod.facts.user_input import MAX_NESTING, InputError, loads_json, loads_toml, nesting, read_bytes, read_stream


@pytest.mark.parametrize("value, depth", [
    (1, 0), ("[[[", 0), ([], 1), ({}, 1), ([1, [2, [3]]], 3), ({"a": {"b": []}}, 3),
    ([[], [[[]]], []], 4), ({"a": 1, "b": [{"c": [[]]}]}, 5),
])
def test_nesting_counts_lists_and_dicts(value, depth):
    assert nesting(value) == depth


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize("loads, text", [
    (loads_json, _deep(MAX_NESTING)),
    (loads_json, '{"a": ' + _deep(MAX_NESTING - 1) + "}"),
    (loads_toml, "a = " + _deep(MAX_NESTING - 1)),  # the document itself is a table: one level
    (loads_toml, ".".join(f"k{i}" for i in range(MAX_NESTING)) + " = 1"),
])
def test_the_limit_itself_is_accepted(loads, text):
    assert nesting(loads(text)) == MAX_NESTING


@pytest.mark.parametrize("loads, text", [
    (loads_json, _deep(MAX_NESTING + 1)),
    (loads_json, _deep(100_000)),  # json raises RecursionError here
    (loads_toml, "a = " + _deep(MAX_NESTING)),
    (loads_toml, "a = " + _deep(100_000)),  # so does tomllib
    (loads_toml, ".".join(f"k{i}" for i in range(MAX_NESTING + 1)) + " = 1"),  # dotted keys nest too
])
def test_one_level_more_is_refused(loads, text):
    with pytest.raises(InputError, match=f"nested deeper than {MAX_NESTING} levels"):
        loads(text)


@pytest.mark.parametrize("size, refused", [(0, False), (99, False), (100, False), (101, True), (10_000, True)])
def test_read_bytes_and_read_stream_stop_at_the_limit(tmp_path, size, refused):
    path = tmp_path / "f"
    path.write_bytes(b"x" * size)
    for read in (lambda: read_bytes(path, limit=100), lambda: read_stream(io.BytesIO(b"x" * size), limit=100)):
        if refused:
            with pytest.raises(InputError, match="larger than"):
                read()
        else:
            assert read() == b"x" * size


def test_an_endless_device_is_read_only_to_the_limit():
    with pytest.raises(InputError, match=r"\(or endless\)"):
        read_bytes("/dev/zero", limit=1 << 20)


def test_a_fifo_is_read_as_a_stream(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)

    def write() -> None:  # 300 bytes, then the end (or the reader's)
        try:
            with open(fifo, "wb") as f:
                f.write(b"y" * 300)
        except BrokenPipeError:
            pass

    writer = threading.Thread(target=write)
    writer.start()
    try:
        with pytest.raises(InputError):
            read_bytes(fifo, limit=100)
    finally:
        writer.join(10)


@pytest.mark.parametrize("text, shown", [
    ("scan", "scan"),
    ("Zürich 東京 pg-main", "Zürich 東京 pg-main"),  # printable, whatever the script
    ("a\x1b[2Jb", "a\\x1b[2Jb"),
    ("a\nb\tc\rd", "a\\nb\\tc\\rd"),
    ("\x00\x07\x7f\x9b", "\\x00\\x07\\x7f\\x9b"),  # NUL, BEL, DEL, the C1 CSI
    ("abc\u202edef", "abc\\u202edef"),  # right-to-left override
    ("a\u2028b\u00a0c", "a\\u2028b\\xa0c"),  # line separator, no-break space
    ("\U000e0001tag", "\\U000e0001tag"),  # a tag character, outside the BMP
    ("x\udcffy", "x\\udcffy"),  # a lone surrogate (os.fsdecode's escape of a bad byte)
])
def test_terminal_safe_escapes_what_is_not_printable(text, shown):
    assert terminal_safe(text) == shown
    assert terminal_safe(shown) == shown  # what it shows is printable


def test_terminal_safe_lines_keeps_newlines_only():
    assert terminal_safe_lines("a\x1bb\nc\td\n") == "a\\x1bb\nc\\td\n"

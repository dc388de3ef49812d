"""Where the shell writes: a terminal (colours, width, pager) or a pipe (plain text, or JSON).

Everything goes through rich consoles: colours only on a terminal (and not with
``NO_COLOR`` or ``--color never``), the terminal's width for folding, plain
text otherwise.  Output taller than the terminal goes through the pager
(``$PAGER``, else ``less``) when the shell is interactive and ``pager`` is on.

Everything printed is terminal-safe (clients/cli/terminal.py): each text, and
each cell of a :class:`SafeTable`, has its unprintable characters escaped before
it is laid out, so a name holding an ESC shows as ``\x1b`` and the columns stay
aligned.  JSON output is safe as it is (json.dumps escapes them).
"""

from __future__ import annotations

import json
import os
import sys
from typing import IO, Any, Iterable

from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from ..terminal import terminal_safe, terminal_safe_lines
from .errors import Problem

# The widest a line is made into a pipe (a table of very long values is folded beyond it).
PIPE_MAX_WIDTH = 1000


def safe_text(text: Text) -> Text:
    """``text`` with its unprintable characters (newlines aside) escaped, each in the style it had."""
    plain = text.plain
    if plain.replace("\n", "").isprintable():
        return text
    cuts = sorted({i + d for i, ch in enumerate(plain) if not ch.isprintable() and ch != "\n" for d in (0, 1)})
    out = text.blank_copy()
    for part in text.divide(cuts):
        if part.plain.isprintable() or part.plain == "\n":
            out.append_text(part)
            continue
        escaped = Text(terminal_safe(part.plain), style=part.style)
        for span in part.spans:  # a span over the one character it replaces covers its escape
            escaped.stylize(span.style)
        out.append_text(escaped)
    return out


def safe(item: RenderableType | None) -> RenderableType | None:
    """What the shell prints, made terminal-safe: a text escaped; a SafeTable is already; the rest
    (our own grids and rules) as it is."""
    if isinstance(item, str):
        return terminal_safe_lines(item)
    if isinstance(item, Text):
        return safe_text(item)
    return item


class SafeTable(Table):
    """A rich Table whose cells are made terminal-safe as they are added."""

    def add_row(self, *renderables: RenderableType | None, style: str | None = None,
                end_section: bool = False) -> None:
        super().add_row(*(safe(r) for r in renderables), style=style, end_section=end_section)


class Output:
    def __init__(self, *, fmt: str = "text", color: str = "auto", stdout: IO[str] | None = None,
                 stderr: IO[str] | None = None, interactive: bool = False) -> None:
        self.fmt = fmt
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.is_tty = _isatty(self.stdout)
        self.interactive = interactive
        self.pager = "auto"
        colour = {"always": True, "never": False}.get(color, self.is_tty and "NO_COLOR" not in os.environ)
        self.colour = bool(colour)
        # On a terminal, rich folds long lines at word boundaries; into a pipe, lines stay whole.
        self.console = Console(file=self.stdout, force_terminal=self.colour if color != "auto" else None,
                               no_color=not self.colour, highlight=False, emoji=False, markup=False,
                               soft_wrap=not self.is_tty)
        err_tty = _isatty(self.stderr)
        self.err = Console(file=self.stderr, force_terminal=None, no_color=not (err_tty and self.colour),
                           highlight=False, emoji=False, markup=False, soft_wrap=not err_tty)

    @property
    def width(self) -> int:
        return max(40, self.console.width)

    @property
    def height(self) -> int:
        return max(10, self.console.height)

    # -- text mode --
    def show(self, items: Iterable[RenderableType], *, page: bool = True) -> None:
        """Print renderables; through the pager when they are taller than an interactive terminal."""
        items = [safe(item) for item in items]
        if page and self._should_page(items):
            os.environ.setdefault("LESS", "-RFX")  # colours, quit when it fits, keep the screen
            with self.console.pager(styles=self.colour):
                for item in items:
                    self.console.print(item)
            return
        for item in items:
            if self.is_tty:
                self.console.print(item)
            else:
                self._print_whole(item)
        self.stdout.flush()

    def _print_whole(self, item: RenderableType) -> None:
        """Into a pipe or a file lines are left whole: a table keeps its natural width rather than
        being squeezed into wrapped columns to fit $COLUMNS."""
        width = self.console.width
        try:
            self.console.width = self._natural_width(item)
            if self.colour:
                self.console.print(item)
                return
            with self.console.capture() as captured:
                self.console.print(item)
        finally:
            self.console.width = width
        # A table pads its last column to the widest cell: no trailing blanks in a file.
        self.stdout.write("".join(line.rstrip() + "\n" for line in captured.get().splitlines()))

    def _natural_width(self, item: RenderableType) -> int:
        wide = self.console.options.update(max_width=PIPE_MAX_WIDTH)
        return max(self.console.width, min(PIPE_MAX_WIDTH, Measurement.get(self.console, wide, item).maximum))

    def _should_page(self, items: list[RenderableType]) -> bool:
        if not (self.interactive and self.is_tty) or self.pager == "off":
            return False
        if self.pager == "always":
            return True
        lines = 0
        for item in items:
            lines += len(self.console.render_lines(item, self.console.options, pad=False))
            if lines >= self.height - 1:
                return True
        return False

    def line(self, text: str | Text = "", style: str | None = None) -> None:
        self.console.print(safe_text(text) if isinstance(text, Text) else
                           Text(terminal_safe_lines(text), style=style or ""))
        self.stdout.flush()

    def write_raw(self, text: str) -> None:
        """Text without a newline (the top level's answer prompts)."""
        self.console.print(Text(terminal_safe_lines(text)), end="")
        self.stdout.flush()

    def note(self, text: str) -> None:
        self.err.print(Text(terminal_safe_lines(text), style="yellow"))

    def problem(self, problem: Problem) -> None:
        """``Error: <message>``, one line whatever the message holds, then its detail lines."""
        self.err.print(Text(f"Error: {terminal_safe(problem.message)}", style="bold red"))
        for line in problem.detail:
            self.err.print(Text(terminal_safe(line), style="red"))
        self.stderr.flush()

    # -- JSON mode --
    def json(self, obj: Any) -> None:
        self.stdout.write(json.dumps(obj, default=_jsonable) + "\n")
        self.stdout.flush()


def _isatty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, (set, frozenset, tuple)):
        return sorted(obj) if isinstance(obj, (set, frozenset)) else list(obj)
    return str(obj)

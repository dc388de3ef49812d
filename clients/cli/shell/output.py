"""Where the shell writes: a terminal (colours, width, pager) or a pipe (plain text, or JSON).

Everything goes through rich consoles: colours only on a terminal (and not with
``NO_COLOR`` or ``--color never``), the terminal's width for folding, plain
text otherwise.  Output taller than the terminal goes through the pager
(``$PAGER``, else ``less``) when the shell is interactive and ``pager`` is on.
"""

from __future__ import annotations

import json
import os
import sys
from typing import IO, Any, Iterable

from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.text import Text

from .errors import Problem

# The widest a line is made into a pipe (a table of very long values is folded beyond it).
PIPE_MAX_WIDTH = 1000


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
        items = list(items)
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
        self.console.print(text if isinstance(text, Text) else Text(text, style=style or ""))
        self.stdout.flush()

    def write_raw(self, text: str) -> None:
        """Text without a newline (the top level's answer prompts)."""
        self.console.print(Text(text), end="")
        self.stdout.flush()

    def note(self, text: str) -> None:
        self.err.print(Text(text, style="yellow"))

    def problem(self, problem: Problem) -> None:
        self.err.print(Text(f"Error: {problem.message}", style="bold red"))
        for line in problem.detail:
            self.err.print(Text(line, style="red"))
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

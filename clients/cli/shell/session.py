"""One shell session: settings, and running statements (queries and commands) against a backend.

The interactive front end (interactive.py) and scripts (``-c``, standard input)
both come here.  A query is shown as SWI-Prolog's top level shows it: answers
one at a time when a person is at the terminal and the ``answers`` setting is
``one``; all at once otherwise.  Every statement returns an exit status:
0 done, 1 a query without answers (``false.``), 2 an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from cod.client import errors as client_errors
from cod.protocol.prolog_text import solution_text
from cod.skb import SKBError as EngineError

from .answers import MAX_SOLUTIONS, AnswerStream
from .backend import Backend
from .errors import STATUS_ERROR, STATUS_FALSE, STATUS_OK, Problem, ShellError, describe, status_of
from .output import Output
from .statements import PSQL_PREFIX, Command, Query, Statement, psql_hint

DEFAULT_TIMEOUT_S = 5.0  # the SKB's and the daemon's default query time limit

# Keys that step through answers, as in SWI-Prolog's top level.
NEXT_KEYS = frozenset(";nrv\t ")
STOP_KEYS = frozenset("\r\n.ca")


@dataclass
class Settings:
    answers: str = "one"  # "one": one at a time; "all": every answer at once
    timeout: float | None = None  # None: the daemon's (or engine's) default
    pager: str = "auto"  # auto | always | off
    max_facts: int = 1000  # rows `:facts NAME` shows

    DESCRIPTIONS = {
        "answers": "one (step with ';', stop with Enter) or all (every answer at once)",
        "timeout": "query time limit in seconds, or default (the daemon caps it at its own limit)",
        "pager": "auto (page output taller than the terminal), always or off",
        "max_facts": "how many facts :facts NAME shows",
    }

    def set(self, name: str, value: str) -> None:
        if name == "answers":
            if value not in ("one", "all"):
                raise ShellError("answers must be one or all")
            self.answers = value
        elif name == "timeout":
            if value in ("default", "none"):
                self.timeout = None
                return
            try:
                seconds = float(value)
            except ValueError:
                raise ShellError(f"timeout must be a number of seconds or default, not {value!r}") from None
            if seconds <= 0:
                raise ShellError("timeout must be positive")
            self.timeout = seconds
        elif name == "pager":
            if value not in ("auto", "always", "off"):
                raise ShellError("pager must be auto, always or off")
            self.pager = value
        elif name == "max_facts":
            if not value.isdigit() or int(value) < 1:
                raise ShellError("max_facts must be a positive whole number")
            self.max_facts = int(value)
        else:
            raise ShellError(f"there is no setting {name!r}; settings: {', '.join(self.DESCRIPTIONS)}")

    def as_dict(self) -> dict[str, Any]:
        return {"answers": self.answers, "timeout": self.timeout or "default", "pager": self.pager,
                "max_facts": self.max_facts}


def is_limit_error(err: Exception) -> bool:
    """A query stopped by its time or inference limit (looking further ahead may be what hit it)."""
    if isinstance(err, EngineError):
        return err.code in ("timeout", "resource")
    if isinstance(err, client_errors.RMError) and isinstance(err.data, dict):
        return err.data.get("skb_code") in ("timeout", "resource")
    return False


class Shell:
    """``commands``: name -> command (``commands.COMMANDS``, given by the caller: the commands
    import this module, not the other way round)."""

    def __init__(self, backend: Backend, out: Output, *, commands: Mapping[str, Any], interactive: bool = False,
                 settings: Settings | None = None) -> None:
        self.backend = backend
        self.out = out
        self.interactive = interactive
        self.settings = settings or Settings()
        self.read_key: Callable[[], str] | None = None  # set by the interactive front end
        self.done = False  # :quit
        self.commands = commands
        self._machine = None

    # ---- the machine (cached: hardware does not change under a running daemon) ----
    def machine(self, *, fresh: bool = False):
        from . import skbviews

        if self._machine is None or fresh:
            if self.backend.offers("get_topology"):
                from cod.facts.model import Machine

                self._machine = Machine.from_dict(self.backend.call("get_topology")["machine"])
            else:
                self._machine = skbviews.machine(self.backend.query, source=self.backend.mode)
        return self._machine

    # ---- running statements ----
    def run(self, stmt: Statement) -> int:
        if not self.backend.info().get("connected"):
            self.backend.reconnect()  # a lost daemon may be back: say so before the answer
        for note in self.backend.take_notes():
            self.out.note(note)
        try:
            if isinstance(stmt, Command):
                status = self._command(stmt)
            else:
                status = self._query(stmt)
        except KeyboardInterrupt:
            try:
                message = self.backend.interrupted()
            except Exception as err:  # restarting failed: say so, the shell stays
                self._report(describe(err), stmt)
                return STATUS_ERROR
            if self.interactive:
                self.out.line("")  # past the ^C the terminal echoed
            self.out.note(message)
            return STATUS_ERROR
        except Exception as err:
            source = stmt.text if isinstance(stmt, Query) else None
            problem = describe(err, source=source, timeout_s=self.settings.timeout or DEFAULT_TIMEOUT_S,
                               commands=frozenset(self.commands))
            self._report(problem, stmt)
            return status_of(problem)
        for note in self.backend.take_notes():
            self.out.note(note)
        return status

    def _report(self, problem: Problem, stmt: Statement) -> None:
        if self.out.fmt == "json":
            self.out.json({"input": stmt.text, "error": problem.to_dict()})
        self.out.problem(problem)

    def emit(self, stmt: Statement | None, data: Any, items: list[Any] | Callable[[], list[Any]]) -> None:
        """A command's answer: `data` as JSON, or the renderables in text mode."""
        if self.out.fmt == "json":
            self.out.json({"input": stmt.text if stmt else None, "result": data})
            return
        self.out.pager = self.settings.pager
        self.out.show(items() if callable(items) else items)

    def _command(self, cmd: Command) -> int:
        if not cmd.name:
            raise ShellError("a command name must follow ':' (try :help)")
        if cmd.text.startswith(PSQL_PREFIX):
            raise ShellError(psql_hint(cmd, self.commands))
        spec = self.commands.get(cmd.name) or self._abbreviation(cmd.name)
        return int(spec.run(self, cmd) or 0)

    def _abbreviation(self, name: str):
        matches = [c for n, c in self.commands.items() if n.startswith(name)]
        if len({c.name for c in matches}) == 1:
            return matches[0]
        if matches:
            raise ShellError(f":{name} is ambiguous: {', '.join(sorted(':' + c.name for c in matches))}")
        raise ShellError(f"there is no command :{name} (try :help)")

    # ---- queries ----
    def fetch(self, goal: str) -> Callable[[int], list[dict[str, Any]]]:
        return lambda n: self.backend.query(goal, max_solutions=n, timeout_s=self.settings.timeout)

    def _query(self, q: Query) -> int:
        if q.text.lstrip().startswith(":-"):
            raise ShellError("directives (:- ...) cannot be run from the shell; to add clauses use :load FILE "
                             "or :assert FACT")
        stepping = (self.out.fmt == "text" and self.interactive and self.read_key is not None
                    and self.settings.answers == "one")
        if not stepping:
            solutions = self.fetch(q.text)(MAX_SOLUTIONS)
            capped = len(solutions) >= MAX_SOLUTIONS
            if self.out.fmt == "json":
                self.out.json({"input": q.text, "solutions": solutions, "truncated": capped})
            else:
                self._print_all(solutions, capped)
            return STATUS_OK if solutions else STATUS_FALSE
        return self._step(q)

    def _print_all(self, solutions: list[dict[str, Any]], capped: bool) -> None:
        if not solutions:
            self.out.line("false.", style="bold")
            return
        for i, sol in enumerate(solutions):
            last = i == len(solutions) - 1
            end = (" ;" if capped else ".") if last else " ;"
            self.out.line(solution_text(sol) + end)
        if capped:
            self.out.note(f"Stopped after {len(solutions)} answers, the most one query returns.")

    def _step(self, q: Query) -> int:
        stream = AnswerStream(self.fetch(q.text), is_limit_error=is_limit_error)
        shown = 0
        while True:
            answer = stream.next()
            if answer is None:
                self.out.line("false." if shown else "false.", style="bold")
                return STATUS_OK if shown else STATUS_FALSE
            shown += 1
            text = solution_text(answer.solution)
            if answer.more is False:
                self.out.line(text + ".")
                return STATUS_OK
            self.out.write_raw(text + " ")
            assert self.read_key is not None
            while True:
                key = self.read_key()
                if key in NEXT_KEYS:
                    self.out.line(";")
                    break
                if key in STOP_KEYS or key == "":
                    self.out.line(".")
                    if answer.more is None and stream.capped:
                        self.out.note(f"Stopped after {stream.shown} answers, the most one query returns.")
                    return STATUS_OK
                if key in "h?":
                    self.out.line("")
                    self.out.note("Answers: ';' or space for the next one, Enter or '.' to stop.")
                    self.out.write_raw(text + " ")

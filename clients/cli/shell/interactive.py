"""The interactive front end, on prompt_toolkit: line editing, history, completion, keys.

* Enter runs the input when it is a whole statement (a command line, or
  Prolog up to its full stop); otherwise it starts a new line, as ``swipl``
  does with its ``|`` continuation prompt.
* History is kept across sessions in ``$XDG_STATE_HOME/cod/shell_history``
  (``~/.local/state/cod/shell_history``).
* Tab completes command names, their arguments (tasks, applications,
  predicates, settings, files) and, in Prolog, the predicate names the SKB
  holds (system, library, this application's) and common built-ins.
* Ctrl-C at the prompt clears the input; while a query runs it cancels the
  query and the shell stays.  Ctrl-D on an empty line leaves.
"""

from __future__ import annotations

import os
import re
import stat
import sys
import termios
import time
import tty
from pathlib import Path
from typing import Iterable

from prompt_toolkit import PromptSession
from prompt_toolkit.completion import CompleteEvent, Completer, Completion, PathCompleter
from prompt_toolkit.document import Document
from prompt_toolkit.history import FileHistory, History, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings

from cod.facts.user_input import MAX_INPUT_BYTES

from .commands import COMMANDS, completion_words, prolog_words
from .errors import STATUS_OK
from .predicates import builtin_predicates, system_predicates
from .session import Shell
from .statements import COMMAND_PREFIX, is_command, is_complete, split

PROMPT = "?- "
CONTINUATION = "|    "
_WORD = re.compile(r"[a-z][A-Za-z0-9_]*")
COMPLETION_TTL_S = 5.0


def history_path() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "cod" / "shell_history"


def open_history(path: Path | None = None) -> tuple[History, str | None]:
    """The history file, or an in-memory history and the reason when the file cannot be used."""
    path = path or history_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and not path.is_file():  # before touch, which only root may do to /dev/zero
            return InMemoryHistory(), f"History is not kept: {path} is not a regular file."
        path.touch(exist_ok=True)
        info = path.stat()
    except OSError as err:
        return InMemoryHistory(), f"History is not kept: cannot write {path} ({err.strerror})."
    # prompt_toolkit reads the whole file: not /dev/zero or a FIFO, and no more than any input (docs/security.md)
    if not stat.S_ISREG(info.st_mode):
        return InMemoryHistory(), f"History is not kept: {path} is not a regular file."
    if info.st_size > MAX_INPUT_BYTES:
        return InMemoryHistory(), f"History is not kept: {path} is over {MAX_INPUT_BYTES >> 20} MiB."
    return FileHistory(str(path)), None


class ShellCompleter(Completer):
    def __init__(self, shell: Shell) -> None:
        self.shell = shell
        self._cache: dict[str, tuple[float, list[str]]] = {}
        self._paths = PathCompleter(expanduser=True)

    def _words(self, kind: str | None) -> list[str]:
        key = kind or "prolog"
        hit = self._cache.get(key)
        if hit and time.monotonic() - hit[0] < COMPLETION_TTL_S:
            return hit[1]
        try:
            words = prolog_words(self.shell) if kind is None else completion_words(kind, self.shell)
        except Exception:  # completion must never break the prompt (e.g. the daemon is gone)
            words = []
        self._cache[key] = (time.monotonic(), words)
        return words

    def get_completions(self, document: Document, complete_event: CompleteEvent) -> Iterable[Completion]:
        text = document.text_before_cursor
        if is_command(text) and "\n" not in text:
            body = text.lstrip()[len(COMMAND_PREFIX):]
            parts = body.split(" ")
            if len(parts) == 1:
                for name in sorted({s.name for s in COMMANDS.values()}):
                    if name.startswith(parts[0]):
                        yield Completion(name, -len(parts[0]), display_meta=COMMANDS[name].summary[:50])
                return
            spec = COMMANDS.get(parts[0].lower())
            if spec is None or spec.complete is None:
                return
            if spec.complete == "file":
                sub = Document(parts[-1], len(parts[-1]))
                yield from self._paths.get_completions(sub, complete_event)
                return
            word = parts[-1]
            for cand in self._words(spec.complete):
                if cand.startswith(word):
                    yield Completion(cand, -len(word))
            return
        m = re.search(r"[a-z][A-Za-z0-9_]*\Z", text)
        if not m:
            return
        word = m.group()
        kinds = {p.name: p.kind for p in system_predicates() + builtin_predicates()}
        for cand in self._words(None):
            if cand.startswith(word) and cand != word:
                yield Completion(cand, -len(word), display_meta=kinds.get(cand, "library/app"))


def read_key() -> str:
    """One key, without echo and without waiting for Enter (Ctrl-C and end of input read as 'stop')."""
    fd = sys.stdin.fileno()
    old = termios.tcgetattr(fd)
    try:
        tty.setcbreak(fd)
        new = termios.tcgetattr(fd)
        new[3] &= ~termios.ECHO
        termios.tcsetattr(fd, termios.TCSANOW, new)
        data = os.read(fd, 1)
    except KeyboardInterrupt:
        return "c"
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, old)
    return data.decode(errors="replace") if data else ""


def banner(shell: Shell) -> str:
    info = shell.backend.info()
    if info["mode"] == "daemon":
        priv = ", privileged" if info.get("privileged") else ""
        where = (f"the COD daemon on {info.get('socket')} (machine {info.get('machine')}, "
                 f"application {info.get('app')}{priv})")
    else:
        where = f"an SKB of its own for machine {info.get('machine')} (application {info.get('app')}, no daemon)"
    return (f"cod shell: connected to {where}.\n"
            f"Type a Prolog query ending with '.', or :help for the commands. Ctrl-D leaves.")


def run(shell: Shell, history: Path | None = None) -> int:
    hist, problem = open_history(history)
    bindings = KeyBindings()

    @bindings.add("enter")
    def _(event) -> None:  # type: ignore[no-untyped-def]
        buffer = event.current_buffer
        if is_complete(buffer.text):
            buffer.validate_and_handle()
        else:
            buffer.insert_text("\n")

    session: PromptSession[str] = PromptSession(
        history=hist, completer=ShellCompleter(shell), complete_while_typing=False, multiline=True,
        key_bindings=bindings, enable_history_search=False,
        prompt_continuation=lambda width, line, soft: CONTINUATION.ljust(width))
    shell.read_key = read_key
    shell.out.line(banner(shell), style="dim")
    if problem:
        shell.out.note(problem)
    while not shell.done:
        try:
            text = session.prompt(PROMPT)
        except KeyboardInterrupt:
            continue
        except EOFError:
            break
        if not text.strip():
            continue
        try:
            statements = split(text)
        except ValueError as err:
            shell.out.note(str(err))
            continue
        for stmt in statements:
            shell.run(stmt)
            if shell.done:
                break
    shell.out.line("")
    return STATUS_OK

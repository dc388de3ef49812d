"""The SKB engine, synchronous flavour: SWI-Prolog in a child process, driven over pipes.

Why a child process and not an in-process binding: measured in
docs/design.md (a swipl child answers a trivial query in ~20 us round trip
against ~50 us for pyswip), and a child gives isolation for free: a query
that runs away is stopped by its own thread's limits inside the engine, and
a memory bomb can at worst kill the child, which is restarted with its state
replayed from the journal.

:class:`SKB` is for ``cod query``, ``cod shell`` without a daemon, tests and
benchmarks: one caller at a time, one request in flight.
:class:`cod.skb.AsyncSKB` is the daemon's, with many requests in flight.
Both share the conversation (:class:`cod.skb.session.Session`) and the
process's life: start without privileges, kill, restart, replay
(:class:`cod.skb.lifecycle.EngineProcess`); each only moves the bytes.
"""

from __future__ import annotations

import logging
import os
import select
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import codec
from .codec import NO_LIMITS, PERSISTENT, Limits, Op
from .errors import SKBError
from .lifecycle import EngineProcess, StartupWatch
from .session import STARTUP_MAX_WAIT_S, STARTUP_TIMEOUT_S, WATCHDOG_GRACE_S, EngineConfig, Session

if TYPE_CHECKING:
    from cod.facts.model import Machine

log = logging.getLogger("cod.skb")


def machine_prolog(machine: "Machine") -> str:
    from cod.facts.prolog import to_prolog

    return to_prolog(machine)


class SKB:
    """The System Knowledge Base, synchronous flavour.  See docs/skb-schema.md.

    Application facts added here are held by no connection (``persistent``):
    there are no connections without a daemon."""

    def __init__(self, *, query_timeout_s: float = 5.0, inference_limit: int | None = 10_000_000,
                 stack_limit_bytes: int = 256 << 20, load_library: bool = True,
                 library_dir: Path | None = None, config: EngineConfig | None = None) -> None:
        self.config = config or EngineConfig(query_timeout_s=query_timeout_s, inference_limit=inference_limit,
                                             large_stack_bytes=stack_limit_bytes, load_library=load_library,
                                             library_dir=library_dir)
        self._session = Session(self.config.journal_compact_at)
        self._engine = EngineProcess(self.config, self._session)
        self._lines: list[bytes] = []
        try:
            self._spawn()
            for op in self._engine.startup_ops():
                self._run(op, STARTUP_MAX_WAIT_S)  # start-up, not a query (see AsyncSKB.start)
        except BaseException:
            self._engine.close()
            raise

    @property
    def restarts(self) -> int:
        return self._engine.restarts

    # ---- lifecycle (skb/lifecycle.py) -----------------------------------
    def _spawn(self) -> None:
        proc = self._engine.spawn()
        self._lines = []
        watch, line, why = StartupWatch(proc.pid), None, ""
        while why == "":
            try:
                line = self._read_line(time.monotonic() + STARTUP_TIMEOUT_S)
                break
            except TimeoutError:
                why = watch.period_over()
        self._engine.started(line, why)

    def _restart(self, why: str) -> None:
        ops = self._engine.restart_ops(why)
        self._spawn()
        for op in ops:
            try:
                self._exchange(op, time.monotonic() + STARTUP_TIMEOUT_S)
            except (SKBError, EOFError, TimeoutError) as err:
                self._engine.replay_failed(op, err)

    def close(self) -> None:
        proc = self._engine.proc
        if proc is not None and proc.stdin is not None:
            try:
                proc.stdin.close()  # end of file: the engine halts
                proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._engine.close()

    def __enter__(self) -> "SKB":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        proc = self._engine.proc
        return proc.pid if proc else None

    # ---- transport ---------------------------------------------------
    def _read_line(self, deadline: float) -> bytes | None:
        """The next reply line; None at end of file; raises TimeoutError."""
        proc = self._engine.proc
        assert proc is not None and proc.stdout is not None
        fd = proc.stdout.fileno()
        while not self._lines:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                raise TimeoutError
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self._lines.extend(self._session.feed(chunk))
        return self._lines.pop(0)

    def _exchange(self, op: Op, deadline: float) -> Any:
        return self._exchange_line(*self._session.request(op), deadline)

    def _exchange_line(self, rid: int, line: bytes, deadline: float) -> Any:
        proc = self._engine.proc
        if proc is None:
            raise SKBError("engine", "the SKB is closed")
        assert proc.stdin is not None
        try:
            proc.stdin.write(line)
            proc.stdin.flush()
        except BrokenPipeError:
            raise EOFError from None
        while True:
            reply = self._read_line(deadline)
            if reply is None:
                raise EOFError
            decoded = Session.decode(reply)
            if decoded is None or decoded[0] != rid:
                continue  # a line naming no request, or the late answer of a call we gave up on
            result = decoded[1]
            if isinstance(result, SKBError):
                raise result
            return result

    def _run(self, op: Op, timeout_s: float | None = None) -> Any:
        wait = (self.config.query_timeout_s if timeout_s is None else timeout_s) + WATCHDOG_GRACE_S
        rid, line = self._session.request(op)
        try:
            result = self._exchange_line(rid, line, time.monotonic() + wait)
        except TimeoutError:
            self._restart("it did not answer in time")
            raise SKBError("timeout", f"the engine did not answer within {wait:.1f} s; it was restarted") from None
        except EOFError:
            self._restart("it exited")
            raise SKBError("engine", "the engine died during the request; it was restarted") from None
        if op.journal and self._session.succeeded(op, rid):
            snap_rid, snap_line = self._session.snapshot_request()
            self._session.compact(snap_rid, self._exchange_line(snap_rid, snap_line,
                                                                time.monotonic() + STARTUP_TIMEOUT_S))
        return result

    # ---- system-level facts (trusted callers) -------------------------
    def load_machine(self, machine: "Machine") -> int:
        """Replace all hardware facts with those of ``machine``."""
        return int(self._run(codec.load_system(machine_prolog(machine))))

    def load_system_text(self, prolog_text: str) -> int:
        return int(self._run(codec.load_system(prolog_text)))

    def add_system_facts(self, facts: list[str]) -> int:
        return int(self._run(codec.add_system_facts(list(facts))))

    def remove_system_facts(self, pattern: str) -> int:
        return int(self._run(codec.remove_system_facts(pattern)))

    def replace_system_facts(self, pattern: str, facts: list[str]) -> int:
        """Atomically retract every fact matching ``pattern`` and add ``facts``."""
        return int(self._run(codec.replace_system_facts(pattern, list(facts))))

    # ---- application-level facts and procedures ------------------------
    def add_facts(self, app: str, facts: list[str], *, limits: Limits = NO_LIMITS) -> int:
        return int(self._run(codec.add_facts(app, PERSISTENT, list(facts), limits))["added"])

    def add_fact(self, app: str, fact: str) -> int:
        return self.add_facts(app, [fact])

    def remove_facts(self, app: str, pattern: str | list[str]) -> int:
        patterns = [pattern] if isinstance(pattern, str) else list(pattern)
        return int(self._run(codec.remove_facts(app, patterns))["removed"])

    def add_procedure(self, app: str, text: str, *, limits: Limits = NO_LIMITS) -> list[str]:
        return list(self._run(codec.add_procedure(app, text, True, limits))["predicates"])

    def drop_app(self, app: str) -> None:
        self._run(codec.drop_app(app))

    def list_facts(self, app: str, predicate: str | None = None) -> list[str]:
        return list(self._run(codec.list_facts(app, predicate)))

    def list_procedures(self, app: str) -> list[str]:
        return list(self._run(codec.list_procedures(app)))

    def usage(self, app: str) -> dict[str, int]:
        return dict(self._run(codec.usage(app)))

    def load_library(self, path: str | Path) -> list[str]:
        return list(self._run(codec.load_library(self._engine.engine_path(Path(path).resolve()))))

    # ---- queries --------------------------------------------------------
    def query(self, app: str, goal: str, *, all_solutions: bool = True, timeout_s: float | None = None,
              max_solutions: int = 10_000) -> dict[str, Any]:
        """The full answer: ``solutions``, ``truncated``, ``elapsed_us`` (engine time)."""
        op, timeout = self.config.query_op(app, goal, all_solutions, timeout_s, max_solutions)
        return dict(self._run(op, timeout))

    def execute_query(self, app: str, goal: str, *, all_solutions: bool = True, timeout_s: float | None = None,
                      max_solutions: int = 10_000) -> list[dict[str, Any]]:
        """One dict per solution, variable name to JSON-able value."""
        return list(self.query(app, goal, all_solutions=all_solutions, timeout_s=timeout_s,
                               max_solutions=max_solutions)["solutions"])

    def time_query(self, app: str, goal: str, times: int) -> dict[str, Any]:
        """Run ``goal`` ``times`` times inside the engine.

        ``wall_us``: wall time of each limited call of the query, in µs;
        ``cpu_us_per_call``: engine CPU time per whole operation (parsing,
        safety check, limits, query), averaged over the run."""
        return dict(self._run(codec.time_query(app, goal, times), 60.0))

    def ping(self) -> None:
        self._run(codec.PING)

    def stats(self) -> dict[str, int]:
        """The engine's threads, applications and modules (for tests and benches)."""
        return dict(self._run(codec.STATS))

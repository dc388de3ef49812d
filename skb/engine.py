"""The SKB engine: SWI-Prolog in a child process, driven over pipes.

Why a child process and not an in-process binding: measured in
docs/design.md (a swipl child answers a trivial query in ~20 us round trip
against ~50 us for pyswip), and a child gives isolation for free: a query
that runs away or a memory bomb can at worst kill the child, which is
restarted with its state replayed from the journal, while the daemon keeps
serving.  The child also runs beside the RM's event loop instead of
blocking it (see AsyncSKB).

:class:`SKB` is the synchronous engine (for ``cod query``, tests and
benchmarks); :class:`cod.skb.AsyncSKB` is the same over asyncio for the RM.
Neither is thread-safe: one owner at a time.
"""

from __future__ import annotations

import logging
import os
import select
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import codec
from .codec import Op
from .errors import SKBError

if TYPE_CHECKING:
    from cod.facts.model import Machine

log = logging.getLogger("cod.skb")

PROLOG_DIR = Path(__file__).resolve().parent / "prolog"
SERVER_FILE = PROLOG_DIR / "cod_server.pl"
# stored_procedures/ sits beside skb/ in the source tree (the package is
# installed in editable mode); COD_STORED_PROCEDURES overrides it.
DEFAULT_LIBRARY_DIR = Path(__file__).resolve().parent.parent / "stored_procedures"

# Grace on top of a query's own time limit before the engine is presumed
# stuck (the limit is enforced inside Prolog; this is the backstop).
WATCHDOG_GRACE_S = 2.0
STARTUP_TIMEOUT_S = 20.0
MAX_REPLY_BYTES = 64 << 20


def library_dir() -> Path:
    return Path(os.environ.get("COD_STORED_PROCEDURES", DEFAULT_LIBRARY_DIR))


def library_files(directory: Path | None = None) -> list[Path]:
    d = directory or library_dir()
    return sorted(d.glob("*.pl")) if d.is_dir() else []


@dataclass
class EngineConfig:
    query_timeout_s: float = 5.0
    inference_limit: int | None = 10_000_000
    stack_limit_bytes: int = 256 << 20
    load_library: bool = True
    library_dir: Path | None = None
    swipl: str = field(default_factory=lambda: shutil.which("swipl") or "swipl")

    def query_op(
        self, app: str, goal: str, all_solutions: bool, timeout_s: float | None, max_solutions: int
    ) -> tuple[Op, float]:
        """The engine operation for a query, and the time limit it runs under."""
        timeout = timeout_s if timeout_s is not None else self.query_timeout_s
        op = codec.query(
            app,
            goal,
            all_solutions=all_solutions,
            max_solutions=max_solutions,
            timeout_s=timeout,
            inference_limit=self.inference_limit,
        )
        return op, timeout

    def command(self) -> list[str]:
        return [
            self.swipl,
            "-q",
            "-f",
            "none",
            f"--stack-limit={self.stack_limit_bytes // 1024}k",
            "-g",
            "cod_server:main",
            "-t",
            "halt",
            str(SERVER_FILE),
        ]


class Journal:
    """Every state change that succeeded, so a restarted engine can be rebuilt.

    Entries that later ones make obsolete are dropped as they come (see
    :meth:`record`); churn that cannot be dropped that way (facts added and
    removed, tasks coming and going) is folded by :meth:`compacted` into a
    snapshot of the engine's state once the journal has doubled.
    """

    COMPACT_AT_LEAST = 1000

    def __init__(self) -> None:
        self._ops: list[Op] = []
        self._compact_at = self.COMPACT_AT_LEAST

    def record(self, op: Op) -> None:
        if op.text.startswith("drop_app("):
            self._ops = [o for o in self._ops if o.app != op.app]
            return
        if op.replaces is not None:
            self._ops = [o for o in self._ops if o.replaces != op.replaces]
        self._ops.append(op)

    def ops(self) -> list[Op]:
        return list(self._ops)

    def needs_compaction(self) -> bool:
        return len(self._ops) >= self._compact_at

    def compact(self, snapshot: dict[str, Any]) -> None:
        """Replace the journal by library loads plus a snapshot of the state."""
        ops = [o for o in self._ops if o.text.startswith("load_library(")]
        ops.append(codec.restore_system(list(snapshot.get("system", []))))
        for app, clauses in sorted(snapshot.get("apps", {}).items()):
            ops.append(codec.add_procedure(app, ".\n".join(clauses) + "."))
        self._ops = ops
        self._compact_at = max(self.COMPACT_AT_LEAST, 2 * len(ops))

    def __len__(self) -> int:
        return len(self._ops)


def machine_prolog(machine: "Machine") -> str:
    from cod.facts.prolog import to_prolog

    return to_prolog(machine)


class SKB:
    """The System Knowledge Base, synchronous flavour.  See docs/skb-schema.md."""

    def __init__(
        self,
        *,
        query_timeout_s: float = 5.0,
        inference_limit: int | None = 10_000_000,
        stack_limit_bytes: int = 256 << 20,
        load_library: bool = True,
        library_dir: Path | None = None,
    ) -> None:
        self.config = EngineConfig(
            query_timeout_s, inference_limit, stack_limit_bytes, load_library, library_dir
        )
        self._journal = Journal()
        self._next_id = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self.restarts = 0
        self._spawn()
        if load_library:
            for path in library_files(library_dir):
                self._run(codec.load_library(str(path)))

    # ---- lifecycle ---------------------------------------------------
    def _spawn(self) -> None:
        try:
            self._proc = subprocess.Popen(
                self.config.command(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                start_new_session=True,  # a Ctrl-C for the owner is not for the engine
            )
        except OSError as err:
            raise SKBError(
                "engine", f"cannot start SWI-Prolog ({self.config.swipl}): {err}; install swi-prolog-nox"
            ) from err
        self._buffer = b""
        line = self._read_line(time.monotonic() + STARTUP_TIMEOUT_S)
        if line is None or b'"ready"' not in line:
            self._kill()
            raise SKBError("engine", f"SWI-Prolog did not start: {line!r}")

    def _restart(self) -> None:
        self._kill()
        self.restarts += 1
        log.warning("SKB engine restarted; replaying %d journal entries", len(self._journal))
        self._spawn()
        for op in self._journal.ops():
            try:
                self._exchange(op, None)
            except SKBError as err:  # should not happen: each op succeeded before
                log.error("SKB replay of %s failed: %s", op.text[:80], err)

    def _kill(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()
        self._proc = None

    def close(self) -> None:
        proc = self._proc
        if proc is None:
            return
        try:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self._kill()

    def __enter__(self) -> "SKB":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    # ---- transport ---------------------------------------------------
    def _read_line(self, deadline: float | None) -> bytes | None:
        """One reply line; None on end of file; raises TimeoutError."""
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while True:
            nl = self._buffer.find(b"\n")
            if nl >= 0:
                line, self._buffer = self._buffer[:nl], self._buffer[nl + 1 :]
                return line
            if len(self._buffer) > MAX_REPLY_BYTES:
                raise SKBError("resource", f"reply larger than {MAX_REPLY_BYTES} bytes")
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([fd], [], [], timeout)
            if not ready:
                raise TimeoutError
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self._buffer += chunk

    def _exchange(self, op: Op, deadline: float | None) -> Any:
        if self._proc is None:
            raise SKBError("engine", "the SKB is closed")
        self._next_id += 1
        request_id = self._next_id
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(codec.request_line(request_id, op))
            self._proc.stdin.flush()
        except BrokenPipeError:
            raise EOFError from None
        while True:
            line = self._read_line(deadline)
            if line is None:
                raise EOFError
            try:
                return codec.decode_reply(line, request_id)
            except codec.StaleReply:
                continue

    def _run(self, op: Op, timeout_s: float | None = None) -> Any:
        wait = (timeout_s if timeout_s is not None else self.config.query_timeout_s) + WATCHDOG_GRACE_S
        try:
            result = self._exchange(op, time.monotonic() + wait)
        except TimeoutError:
            self._restart()
            raise SKBError(
                "timeout", f"the engine did not answer within {wait:.1f} s; it was restarted"
            ) from None
        except EOFError:
            self._restart()
            raise SKBError("engine", "the engine died during the request; it was restarted") from None
        if op.journal:
            self._journal.record(op)
            if self._journal.needs_compaction():
                self._journal.compact(self._exchange(codec.snapshot(), None))
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
    def add_facts(self, app: str, facts: list[str]) -> int:
        return int(self._run(codec.add_facts(app, list(facts))))

    def add_fact(self, app: str, fact: str) -> int:
        return self.add_facts(app, [fact])

    def remove_facts(self, app: str, pattern: str) -> int:
        return int(self._run(codec.remove_facts(app, pattern)))

    def add_procedure(self, app: str, text: str) -> list[str]:
        return list(self._run(codec.add_procedure(app, text)))

    def drop_app(self, app: str) -> None:
        self._run(codec.drop_app(app))

    def list_facts(self, app: str, predicate: str | None = None) -> list[str]:
        return list(self._run(codec.list_facts(app, predicate)))

    def load_library(self, path: str | Path) -> list[str]:
        return list(self._run(codec.load_library(str(Path(path).resolve()))))

    # ---- queries --------------------------------------------------------
    def query(
        self,
        app: str,
        goal: str,
        *,
        all_solutions: bool = True,
        timeout_s: float | None = None,
        max_solutions: int = 10_000,
    ) -> dict[str, Any]:
        """The full answer: ``solutions``, ``truncated``, ``elapsed_us`` (engine time)."""
        op, timeout = self.config.query_op(app, goal, all_solutions, timeout_s, max_solutions)
        return dict(self._run(op, timeout))

    def execute_query(
        self,
        app: str,
        goal: str,
        *,
        all_solutions: bool = True,
        timeout_s: float | None = None,
        max_solutions: int = 10_000,
    ) -> list[dict[str, Any]]:
        """One dict per solution, variable name to JSON-able value."""
        return list(
            self.query(
                app, goal, all_solutions=all_solutions, timeout_s=timeout_s, max_solutions=max_solutions
            )["solutions"]
        )

    def time_query(self, app: str, goal: str, times: int) -> dict[str, Any]:
        """Run ``goal`` ``times`` times inside the engine.

        ``wall_us``: wall time of each limited call of the query, in µs;
        ``cpu_us_per_call``: engine CPU time per whole operation (parsing,
        safety check, limits, query), averaged over the run."""
        return dict(self._run(codec.time_query(app, goal, times), 60.0))

    def ping(self) -> None:
        self._run(Op("ping"))

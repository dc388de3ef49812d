"""The SKB over asyncio, for the Resource Manager's event loop.

Same operations and semantics as :class:`cod.skb.engine.SKB`.  Requests
are serialised by a lock (the engine answers one at a time), but waiting
for an answer never blocks the loop: other clients' I/O goes on while the
engine works.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import codec
from .codec import Op
from .engine import (
    MAX_REPLY_BYTES,
    STARTUP_TIMEOUT_S,
    WATCHDOG_GRACE_S,
    EngineConfig,
    Journal,
    library_files,
    machine_prolog,
)
from .errors import SKBError

if TYPE_CHECKING:
    from cod.facts.model import Machine

log = logging.getLogger("cod.skb")


class AsyncSKB:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._journal = Journal()
        self._next_id = 0
        self._proc: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()
        self.restarts = 0

    @classmethod
    async def start(
        cls,
        *,
        query_timeout_s: float = 5.0,
        inference_limit: int | None = 10_000_000,
        stack_limit_bytes: int = 256 << 20,
        load_library: bool = True,
        library_dir: Path | None = None,
    ) -> "AsyncSKB":
        self = cls(
            EngineConfig(query_timeout_s, inference_limit, stack_limit_bytes, load_library, library_dir)
        )
        await self._spawn()
        if load_library:
            for path in library_files(library_dir):
                await self._run(codec.load_library(str(path)))
        return self

    # ---- lifecycle ---------------------------------------------------
    async def _spawn(self) -> None:
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self.config.command(),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                start_new_session=True,
                limit=MAX_REPLY_BYTES,
            )
        except OSError as err:
            raise SKBError(
                "engine", f"cannot start SWI-Prolog ({self.config.swipl}): {err}; install swi-prolog-nox"
            ) from err
        assert self._proc.stdout is not None
        try:
            line = await asyncio.wait_for(self._proc.stdout.readline(), STARTUP_TIMEOUT_S)
        except asyncio.TimeoutError:
            line = b""
        if b'"ready"' not in line:
            await self._kill()
            raise SKBError("engine", f"SWI-Prolog did not start: {line!r}")

    async def _kill(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.returncode is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        await proc.wait()
        self._proc = None

    async def _restart(self) -> None:
        await self._kill()
        self.restarts += 1
        log.warning("SKB engine restarted; replaying %d journal entries", len(self._journal))
        await self._spawn()
        for op in self._journal.ops():
            try:
                await self._exchange(op)
            except (SKBError, EOFError) as err:
                log.error("SKB replay of %s failed: %s", op.text[:80], err)

    async def close(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 2)
        except asyncio.TimeoutError:
            pass
        await self._kill()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    # ---- transport ---------------------------------------------------
    async def _exchange(self, op: Op) -> Any:
        proc = self._proc
        if proc is None:
            raise SKBError("engine", "the SKB is closed")
        assert proc.stdin is not None and proc.stdout is not None
        self._next_id += 1
        request_id = self._next_id
        try:
            proc.stdin.write(codec.request_line(request_id, op))
            await proc.stdin.drain()
            line = await proc.stdout.readline()
        except (BrokenPipeError, ConnectionResetError):
            raise EOFError from None
        except ValueError as err:  # line longer than the stream limit
            raise SKBError("resource", f"reply larger than {MAX_REPLY_BYTES} bytes") from err
        if not line:
            raise EOFError
        return codec.decode_reply(line, request_id)

    async def _run(self, op: Op, timeout_s: float | None = None) -> Any:
        wait = (timeout_s if timeout_s is not None else self.config.query_timeout_s) + WATCHDOG_GRACE_S
        async with self._lock:
            try:
                result = await asyncio.wait_for(self._exchange(op), wait)
            except asyncio.TimeoutError:
                await self._restart()
                raise SKBError(
                    "timeout", f"the engine did not answer within {wait:.1f} s; it was restarted"
                ) from None
            except EOFError:
                await self._restart()
                raise SKBError("engine", "the engine died during the request; it was restarted") from None
            if op.journal:
                self._journal.record(op)
            return result

    # ---- operations (see SKB for their meaning) -----------------------
    async def load_machine(self, machine: "Machine") -> int:
        return int(await self._run(codec.load_system(machine_prolog(machine))))

    async def load_system_text(self, prolog_text: str) -> int:
        return int(await self._run(codec.load_system(prolog_text)))

    async def add_system_facts(self, facts: list[str]) -> int:
        return int(await self._run(codec.add_system_facts(list(facts))))

    async def remove_system_facts(self, pattern: str) -> int:
        return int(await self._run(codec.remove_system_facts(pattern)))

    async def replace_system_facts(self, pattern: str, facts: list[str]) -> int:
        return int(await self._run(codec.replace_system_facts(pattern, list(facts))))

    async def add_facts(self, app: str, facts: list[str]) -> int:
        return int(await self._run(codec.add_facts(app, list(facts))))

    async def remove_facts(self, app: str, pattern: str) -> int:
        return int(await self._run(codec.remove_facts(app, pattern)))

    async def add_procedure(self, app: str, text: str) -> list[str]:
        return list(await self._run(codec.add_procedure(app, text)))

    async def drop_app(self, app: str) -> None:
        await self._run(codec.drop_app(app))

    async def list_facts(self, app: str, predicate: str | None = None) -> list[str]:
        return list(await self._run(codec.list_facts(app, predicate)))

    async def load_library(self, path: str | Path) -> list[str]:
        return list(await self._run(codec.load_library(str(Path(path).resolve()))))

    async def query(
        self,
        app: str,
        goal: str,
        *,
        all_solutions: bool = True,
        timeout_s: float | None = None,
        max_solutions: int = 10_000,
    ) -> dict[str, Any]:
        timeout = timeout_s if timeout_s is not None else self.config.query_timeout_s
        op = codec.query(
            app,
            goal,
            all_solutions=all_solutions,
            max_solutions=max_solutions,
            timeout_s=timeout,
            inference_limit=self.config.inference_limit,
        )
        return dict(await self._run(op, timeout))

    async def execute_query(
        self,
        app: str,
        goal: str,
        *,
        all_solutions: bool = True,
        timeout_s: float | None = None,
        max_solutions: int = 10_000,
    ) -> list[dict[str, Any]]:
        answer = await self.query(
            app, goal, all_solutions=all_solutions, timeout_s=timeout_s, max_solutions=max_solutions
        )
        return list(answer["solutions"])

    async def ping(self) -> None:
        await self._run(Op("ping"))

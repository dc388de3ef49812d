"""The SKB over asyncio, for the Resource Manager's event loop.

Same operations and semantics as :class:`cod.skb.engine.SKB`.  Requests
are serialised by a lock (the engine answers one at a time), but waiting
for an answer never blocks the loop: other clients' I/O goes on while the
engine works.
"""

from __future__ import annotations

import asyncio
import collections
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


class _EngineProtocol(asyncio.SubprocessProtocol):
    """Reply lines from the engine's stdout, handed to one waiter at a time.

    A bare protocol instead of asyncio streams plus wait_for: on this path
    every microsecond counts (docs/design.md), and streams cost a task and
    several wake-ups per line.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._lines: collections.deque[bytes] = collections.deque()
        self._waiter: asyncio.Future[bytes] | None = None
        self.exited = False

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd != 1:
            return
        self._buffer += data
        if len(self._buffer) > MAX_REPLY_BYTES:
            self._buffer.clear()
            self._fail(SKBError("resource", f"reply larger than {MAX_REPLY_BYTES} bytes"))
            return
        while True:
            nl = self._buffer.find(b"\n")
            if nl < 0:
                break
            self._lines.append(bytes(self._buffer[:nl]))
            del self._buffer[: nl + 1]
        self._deliver()

    def _deliver(self) -> None:
        w = self._waiter
        if w is not None and self._lines and not w.done():
            self._waiter = None
            w.set_result(self._lines.popleft())

    def _fail(self, exc: BaseException) -> None:
        w = self._waiter
        if w is not None and not w.done():
            self._waiter = None
            w.set_exception(exc)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 1:
            self.exited = True
            self._fail(EOFError())

    def process_exited(self) -> None:
        self.exited = True
        self._fail(EOFError())

    def next_line(self, loop: asyncio.AbstractEventLoop) -> "asyncio.Future[bytes]":
        fut: asyncio.Future[bytes] = loop.create_future()
        if self._lines:
            fut.set_result(self._lines.popleft())
        elif self.exited:
            fut.set_exception(EOFError())
        else:
            self._waiter = fut
        return fut


def _expire(fut: "asyncio.Future[bytes]") -> None:
    if not fut.done():
        fut.set_exception(TimeoutError())


class AsyncSKB:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._journal = Journal()
        self._next_id = 0
        self._transport: asyncio.SubprocessTransport | None = None
        self._protocol: _EngineProtocol | None = None
        self._stdin: asyncio.WriteTransport | None = None
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
        loop = asyncio.get_running_loop()
        try:
            transport, protocol = await loop.subprocess_exec(
                _EngineProtocol,
                *self.config.command(),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=None,
                start_new_session=True,
            )
        except OSError as err:
            raise SKBError(
                "engine", f"cannot start SWI-Prolog ({self.config.swipl}): {err}; install swi-prolog-nox"
            ) from err
        self._transport, self._protocol = transport, protocol
        self._stdin = transport.get_pipe_transport(0)  # type: ignore[assignment]
        try:
            line = await self._read_line(loop, STARTUP_TIMEOUT_S)
        except (TimeoutError, EOFError):
            line = b""
        if b'"ready"' not in line:
            await self._kill()
            raise SKBError("engine", f"SWI-Prolog did not start: {line!r}")

    async def _read_line(self, loop: asyncio.AbstractEventLoop, timeout_s: float) -> bytes:
        assert self._protocol is not None
        fut = self._protocol.next_line(loop)
        timer = loop.call_later(timeout_s, _expire, fut)
        try:
            return await fut
        finally:
            timer.cancel()

    async def _kill(self) -> None:
        transport = self._transport
        if transport is None:
            return
        pid = transport.get_pid()
        if transport.get_returncode() is None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        transport.close()
        # Reap the child: wait until the transport has seen the exit.
        for _ in range(200):
            if transport.get_returncode() is not None:
                break
            await asyncio.sleep(0.01)
        self._transport = self._protocol = self._stdin = None

    async def _restart(self) -> None:
        await self._kill()
        self.restarts += 1
        log.warning("SKB engine restarted; replaying %d journal entries", len(self._journal))
        await self._spawn()
        for op in self._journal.ops():
            try:
                await self._exchange(op, STARTUP_TIMEOUT_S)
            except (SKBError, EOFError, TimeoutError) as err:
                log.error("SKB replay of %s failed: %s", op.text[:80], err)

    async def close(self) -> None:
        transport = self._transport
        if transport is None:
            return
        if self._stdin is not None:
            self._stdin.close()  # end of file: the engine halts
        for _ in range(200):
            if transport.get_returncode() is not None:
                break
            await asyncio.sleep(0.01)
        await self._kill()

    @property
    def pid(self) -> int | None:
        return self._transport.get_pid() if self._transport else None

    # ---- transport ---------------------------------------------------
    async def _exchange(self, op: Op, timeout_s: float) -> Any:
        if self._stdin is None or self._protocol is None or self._protocol.exited:
            raise EOFError
        self._next_id += 1
        request_id = self._next_id
        loop = asyncio.get_running_loop()
        self._stdin.write(codec.request_line(request_id, op))
        deadline = loop.time() + timeout_s
        while True:
            line = await self._read_line(loop, max(0.0, deadline - loop.time()))
            try:
                return codec.decode_reply(line, request_id)
            except codec.StaleReply:
                continue  # the answer to a call that was cancelled

    async def _run(self, op: Op, timeout_s: float | None = None) -> Any:
        wait = (timeout_s if timeout_s is not None else self.config.query_timeout_s) + WATCHDOG_GRACE_S
        async with self._lock:
            if self._transport is None:
                raise SKBError("engine", "the SKB is closed")
            try:
                result = await self._exchange(op, wait)
            except TimeoutError:
                await self._restart()
                raise SKBError(
                    "timeout", f"the engine did not answer within {wait:.1f} s; it was restarted"
                ) from None
            except EOFError:
                await self._restart()
                raise SKBError("engine", "the engine died during the request; it was restarted") from None
            if op.journal:
                self._journal.record(op)
                if self._journal.needs_compaction():
                    self._journal.compact(await self._exchange(codec.snapshot(), STARTUP_TIMEOUT_S))
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
        op, timeout = self.config.query_op(app, goal, all_solutions, timeout_s, max_solutions)
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

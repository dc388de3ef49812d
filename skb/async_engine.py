"""The SKB over asyncio, for the Resource Manager's event loop.

Same operations and semantics as :class:`cod.skb.engine.SKB`, but many
requests are in flight at once: the engine runs writes on its writer thread
and queries on a pool of threads, and its replies come back in any order,
matched to their callers by id.  A slow query therefore delays nobody
else's request, and the daemon's own writes (the allocation, the live
state) never wait behind an application's query.

Writes are journalled when their reply arrives, whether or not their caller
is still waiting, so a caller that gives up (a client that hangs up) cannot
leave the journal behind the engine.  A write not answered in time is not
reported as failed: it raises :class:`~cod.skb.errors.OutcomeUnknown`, whose
future settles with the truth (its late result, or an error once a restart
has made sure it will never be applied).  If the engine dies, every request in
flight fails with a clean error, a new engine is started and the journal
replayed; requests made meanwhile wait for it.  Starting, killing and
restarting the process, and what is replayed, are the same as for the
synchronous driver (:class:`cod.skb.lifecycle.EngineProcess`); only the
bytes move differently here.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import logging
import sys
import termios
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from . import codec
from .codec import NO_LIMITS, Limits, Op, Owner, Staged
from .engine import machine_prolog
from .errors import OutcomeUnknown, SKBError
from .lifecycle import EngineProcess, StartupWatch, cpu_seconds
from .session import STARTUP_MAX_WAIT_S, STARTUP_TIMEOUT_S, WATCHDOG_GRACE_S, EngineConfig, Session

if TYPE_CHECKING:
    from cod.facts.model import Machine

log = logging.getLogger("cod.skb")

# How long a health check waits before the engine is presumed stuck: PING_TIMEOUT_S without
# progress, or PING_MAX_WAIT_S in all while it makes progress.  Progress: replies to others keep
# coming, or its threads use CPU (an engine busy with hundreds of large answers on a loaded machine
# answered no ping within 5 s, and was restarted, failing every request in flight; issue 23).
PING_TIMEOUT_S = 5.0
PING_MAX_WAIT_S = 30.0
PING_PROGRESS_CPU_S = 0.25  # CPU time over PING_TIMEOUT_S that shows an engine at work


def _retrieved(fut: "asyncio.Future[Any]") -> None:
    """Mark a settled future's exception as seen (asyncio logs one that nobody retrieved)."""
    if not fut.cancelled():
        fut.exception()


class _Pending:
    __slots__ = ("op", "future", "on_result")

    def __init__(self, op: Op, future: "asyncio.Future[Any] | None",
                 on_result: Callable[[Any], None] | None = None) -> None:
        self.op = op
        self.future = future
        self.on_result = on_result


class _EngineOutput(asyncio.Protocol):
    """Reply lines from the engine's stdout, handed to the engine's dispatcher.

    A bare protocol instead of asyncio streams: on this path every
    microsecond counts (docs/design.md), and streams cost a task and several
    wake-ups per line."""

    def __init__(self, owner: "AsyncSKB") -> None:
        self.owner = owner
        self.exited = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.owner._on_data(self, data)

    def eof_received(self) -> bool:
        self._exit()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._exit()

    def _exit(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)
            self.owner._on_exit(self)


def _pipe_bytes(transport: asyncio.BaseTransport | None) -> int:
    """Bytes waiting in a transport's pipe (FIONREAD: on the read end, written and not yet read; on the
    write end, written by us and not yet read by the engine); 0 when it cannot tell."""
    try:
        pipe = transport.get_extra_info("pipe")  # type: ignore[union-attr]
        buf = fcntl.ioctl(pipe.fileno(), termios.FIONREAD, b"\0\0\0\0")
        return int.from_bytes(buf, sys.byteorder)
    except (AttributeError, OSError, ValueError):
        return 0


def _unsent(stdin: asyncio.WriteTransport | None) -> int:
    """What of our writes to the engine it has not read: in our buffer, and in the pipe."""
    try:
        buffered = stdin.get_write_buffer_size()  # type: ignore[union-attr]
    except (AttributeError, OSError, ValueError):
        buffered = 0
    return buffered + _pipe_bytes(stdin)


class AsyncSKB:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self._session = Session(config.journal_compact_at)
        self._engine = EngineProcess(config, self._session)
        self._pending: dict[int, _Pending] = {}
        self._output: asyncio.ReadTransport | None = None
        self._protocol: _EngineOutput | None = None
        self._stdin: asyncio.WriteTransport | None = None
        self._ready = asyncio.Event()
        self._startup_line: asyncio.Future[bytes] | None = None
        self._restarting: asyncio.Task[None] | None = None
        self._closing = False
        self._received = 0  # bytes read from the engine: a health check's sign of progress
        self._sent = 0  # bytes handed to the engine's input (with _input_unread: what it has read)

    @classmethod
    async def start(cls, config: EngineConfig | None = None, **kwargs: Any) -> "AsyncSKB":
        self = cls(config or EngineConfig(**kwargs))
        try:
            await self._spawn()
            self._ready.set()
            for op in self._engine.startup_ops():
                # Loading the libraries is start-up, not a query: in a TCG guest at host load 40-77
                # it took over the query timeout's 7 s ("cannot start the SKB: timeout").
                await self._run(op, STARTUP_MAX_WAIT_S)
        except BaseException:
            await self.close()
            raise
        return self

    @property
    def restarts(self) -> int:
        return self._engine.restarts

    # ---- lifecycle (skb/lifecycle.py) -----------------------------------
    async def _spawn(self) -> None:
        loop = asyncio.get_running_loop()
        self._startup_line = loop.create_future()
        proc = self._engine.spawn()
        # The transports own the pipes from here on (the lifecycle closes only what is left).
        stdout, stdin, proc.stdout, proc.stdin = proc.stdout, proc.stdin, None, None
        # The protocol is ours before the pipe is read: uvloop may deliver what the engine wrote
        # already (its ready line, on a loaded machine) before connect_read_pipe returns, and
        # _on_data drops what comes through any other protocol (an old engine's).
        self._protocol = protocol = _EngineOutput(self)
        self._output, _ = await loop.connect_read_pipe(lambda: protocol, stdout)
        self._stdin, _ = await loop.connect_write_pipe(asyncio.Protocol, stdin)
        watch, line, why = StartupWatch(proc.pid), None, ""
        while why == "":
            try:
                line = await asyncio.wait_for(asyncio.shield(self._startup_line), STARTUP_TIMEOUT_S)
                break
            except EOFError:
                break  # started() says how it exited
            except TimeoutError:
                if self._startup_line.done() and not self._startup_line.exception():
                    line = self._startup_line.result()  # it came as the period ended
                    break
                why = watch.period_over()
                if not why:
                    log.info("the SKB engine is still starting after %g s (a loaded machine)", watch.waited_s)
        if not Session.ready(line):
            self._close_pipes()
        self._engine.started(line, why)

    def _close_pipes(self) -> None:
        for t in (self._stdin, self._output):
            if t is not None:
                t.close()
        self._output = self._protocol = self._stdin = None

    async def _kill(self) -> None:
        protocol = self._protocol
        self._engine.kill()
        self._close_pipes()
        if protocol is not None:
            try:
                await asyncio.wait_for(asyncio.shield(protocol.exited), 2.0)
            except TimeoutError:
                pass

    def _on_exit(self, protocol: _EngineOutput) -> None:
        if protocol is not self._protocol:
            return
        if self._startup_line is not None and not self._startup_line.done():
            self._startup_line.set_exception(EOFError())
        self._fail_pending(SKBError("engine", "the engine died during the request; it was restarted"))
        if not self._closing and self._ready.is_set():
            self._begin_restart("the engine exited")

    def _begin_restart(self, why: str) -> None:
        if self._restarting is not None and not self._restarting.done():
            return
        self._ready.clear()
        self._restarting = asyncio.get_running_loop().create_task(self._restart(why))

    async def _restart(self, why: str) -> None:
        self._protocol = None  # what the old engine still says is not for us
        ops = self._engine.restart_ops(why)
        self._close_pipes()
        self._fail_pending(SKBError("engine", "the engine was restarted during the request"))
        if self._closing:
            return
        while not self._closing:
            try:
                await self._spawn()
                break
            except SKBError as err:
                log.error("restarting the SKB engine: %s", err)
                await asyncio.sleep(1.0)
        futures = [self._send(op, track_journal=False) for op in ops]
        for op, fut in zip(ops, futures):
            try:
                await asyncio.wait_for(fut, STARTUP_TIMEOUT_S)
            except (SKBError, TimeoutError) as err:
                self._engine.replay_failed(op, err)
        self._ready.set()

    async def close(self) -> None:
        self._closing = True
        if self._restarting is not None:
            self._restarting.cancel()
        proc = self._engine.proc
        if proc is not None and self._stdin is not None:
            self._stdin.close()  # end of file: the engine halts
            for _ in range(200):
                if proc.poll() is not None:
                    break
                await asyncio.sleep(0.01)
        await self._kill()
        self._engine.close()
        self._fail_pending(SKBError("engine", "the SKB is closed"))

    @property
    def pid(self) -> int | None:
        proc = self._engine.proc
        return proc.pid if proc else None

    # ---- transport ---------------------------------------------------
    def _on_data(self, protocol: _EngineOutput, data: bytes) -> None:
        if protocol is not self._protocol:
            return
        self._received += len(data)
        try:
            lines = self._session.feed(data)
        except SKBError as err:
            log.error("engine output: %s; restarting it", err)
            self._begin_restart(str(err))
            return
        for line in lines:
            if self._startup_line is not None and not self._startup_line.done():
                self._startup_line.set_result(line)
                continue
            decoded = Session.decode(line)
            if decoded is None:
                continue
            rid, result = decoded
            pending = self._pending.pop(rid, None)
            if pending is None:
                continue  # a reply to a request of an engine that was restarted
            if pending.on_result is not None and not isinstance(result, SKBError):
                pending.on_result(result)
            fut = pending.future
            if fut is not None and not fut.done():
                if isinstance(result, SKBError):
                    fut.set_exception(result)
                else:
                    fut.set_result(result)

    def _fail_pending(self, err: SKBError) -> None:
        pending, self._pending = self._pending, {}
        for p in pending.values():
            if p.future is not None and not p.future.done():
                p.future.set_exception(err)

    def _send(self, op: Op, *, track_journal: bool = True) -> "asyncio.Future[Any]":
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        if self._stdin is None or self._stdin.is_closing():
            fut.set_exception(SKBError("engine", "the SKB is not running"))
            return fut
        rid, line = self._session.request(op)
        on_result = self._journal_hook(op, rid) if (track_journal and op.journal) else None
        self._pending[rid] = _Pending(op, fut, on_result)
        self._write(line)
        return fut

    def _write(self, line: bytes) -> None:
        assert self._stdin is not None
        self._stdin.write(line)
        self._sent += len(line)

    def _journal_hook(self, op: Op, rid: int) -> Callable[[Any], None]:
        def record(_result: Any) -> None:
            if self._session.succeeded(op, rid):
                self._compact_soon()
        return record

    def _compact_soon(self) -> None:
        """Fold the journal into a snapshot; the writer thread runs it after every write sent before."""
        if self._stdin is None:
            return
        rid, line = self._session.snapshot_request()
        self._pending[rid] = _Pending(codec.snapshot(), None, functools.partial(self._session.compact, rid))
        self._write(line)

    async def _run(self, op: Op, timeout_s: float | None = None) -> Any:
        if self._closing:
            raise SKBError("engine", "the SKB is closed")
        if not self._ready.is_set():
            try:
                await asyncio.wait_for(self._ready.wait(), STARTUP_TIMEOUT_S)
            except TimeoutError:
                raise SKBError("engine", "the engine is restarting and did not come back in time") from None
        wait = (self.config.query_timeout_s if timeout_s is None else timeout_s) + WATCHDOG_GRACE_S
        fut = self._send(op)
        try:
            # A write's future outlives the wait: it is how its caller learns the true outcome.
            return await asyncio.wait_for(asyncio.shield(fut) if op.journal else fut, wait)
        except TimeoutError:
            if fut.done() and not fut.cancelled():
                # The answer came in the same turn of the loop as the time-out: it is the outcome
                # (a write reported as timed out here was applied, and its retry learnt a failure).
                return fut.result()
            # The request stays known (a read's late reply is dropped); check the engine is alive.
            asyncio.get_running_loop().create_task(self._health_check())
            if op.journal and not fut.done():
                fut.add_done_callback(_retrieved)  # nobody may be left to await it
                raise OutcomeUnknown(f"the engine did not answer within {wait:.1f} s; the write may still be "
                                     "applied", fut) from None
            raise SKBError("timeout", f"the engine did not answer within {wait:.1f} s") from None

    async def _health_check(self) -> None:
        """Restart an engine that answers no ping, or whose ping fails (its query pool stopped serving)."""
        if not self._ready.is_set():
            return
        why = "it did not answer a ping"
        pong = self._send(codec.PING)
        pong.add_done_callback(_retrieved)  # a restart fails it after the check gave up on it
        ping_end = self._sent  # the engine has read the ping once it has read this many bytes
        waited = 0.0
        try:
            while True:
                before, cpu, read = self._received, cpu_seconds(self.pid), self._sent - _unsent(self._stdin)
                try:
                    await asyncio.wait_for(asyncio.shield(pong), PING_TIMEOUT_S)
                    return
                except TimeoutError:
                    now_read = self._sent - _unsent(self._stdin)
                    # While the engine still reads the requests sent before the ping (252 clients
                    # leaving at once: 252 abandons and releases ahead of it, read by one thread that
                    # gets ~2 % of a CPU at load 30), the ping is not yet its to answer: that time
                    # does not count towards PING_MAX_WAIT_S (issue 23: restarted "for no ping in 30 s").
                    if not (read < now_read < ping_end):
                        waited += PING_TIMEOUT_S
                    else:
                        log.info("the engine's ping waits behind %d bytes of requests it is reading",
                                 ping_end - now_read)
                    busy = cpu_seconds(self.pid) - cpu >= PING_PROGRESS_CPU_S or now_read > read
                    if waited >= PING_MAX_WAIT_S:
                        why = f"it answered no ping in {waited:g} s"
                        raise
                    if self._received == before and not busy and not _pipe_bytes(self._output):
                        why = f"it did not answer a ping in {PING_TIMEOUT_S:g} s and made no progress"
                        raise
        except TimeoutError:
            pass
        except SKBError as err:
            why = f"its ping failed: {err.message}"
        if not self._closing:
            self._begin_restart(why)

    # ---- system-level facts ------------------------------------------
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

    async def replace_many(self, replacements: Mapping[str, Iterable[str]]) -> int:
        """Several replacements as one change: no reader sees some done and others not."""
        return int(await self._run(codec.replace_many(replacements)))

    async def batch(self, ops: list[Op]) -> list[Any]:
        """Several writes as one transaction: all or nothing."""
        return list(await self._run(codec.batch(ops)))

    # ---- application facts and procedures ------------------------------
    async def add_facts(self, app: str, owner: Owner, facts: list[str],
                        limits: Limits = NO_LIMITS) -> dict[str, Any]:
        return dict(await self._run(codec.add_facts(app, owner, list(facts), limits)))

    async def remove_facts(self, app: str, patterns: list[str]) -> dict[str, Any]:
        return dict(await self._run(codec.remove_facts(app, list(patterns))))

    async def add_procedure(self, app: str, text: str, persistent: bool = False,
                            limits: Limits = NO_LIMITS) -> dict[str, Any]:
        return dict(await self._run(codec.add_procedure(app, text, persistent, limits)))

    async def drop_owner(self, app: str, owner: Owner) -> dict[str, Any]:
        return dict(await self._run(codec.drop_owner(app, owner)))

    async def release_app(self, app: str) -> dict[str, Any]:
        return dict(await self._run(codec.release_app(app)))

    async def drop_app(self, app: str) -> None:
        await self._run(codec.drop_app(app))

    async def list_facts(self, app: str, predicate: str | None = None) -> list[str]:
        return list(await self._run(codec.list_facts(app, predicate)))

    async def list_procedures(self, app: str) -> list[str]:
        return list(await self._run(codec.list_procedures(app)))

    async def usage(self, app: str) -> dict[str, int]:
        return dict(await self._run(codec.usage(app)))

    async def describe_app(self, app: str) -> dict[str, Any]:
        """{"procedures": [{"predicate", "text", "persistent"}], "facts": [{"predicate", "count"}]}"""
        return dict(await self._run(codec.describe_app(app)))

    async def predicates(self, app: str, kind: str = "all") -> list[dict[str, Any]]:
        """[{"name", "arity", "kind"}] of what the app's code may call."""
        return list((await self._run(codec.predicates(app, kind)))["predicates"])

    async def abandon(self, tag: str) -> int:
        """The client of ``tag`` is gone (codec.abandon); how many of its queries were running."""
        return int(await self._run(codec.abandon(tag)))

    async def cancel(self, tag: str) -> int:
        """Stop the queries running for ``tag``; how many were running."""
        return int(await self._run(codec.cancel(tag)))

    async def load_library(self, path: str | Path) -> list[str]:
        return list(await self._run(codec.load_library(self._engine.engine_path(Path(path).resolve()))))

    # ---- capabilities of the direct channel -----------------------------
    async def grant(self, token: str, app: str, client: codec.Client | None = None) -> None:
        await self._run(codec.grant(token, app, client))

    async def revoke(self, token: str) -> None:
        await self._run(codec.revoke(token))

    async def stats(self) -> dict[str, int]:
        """The engine's threads, applications and modules (for tests and benches)."""
        return dict(await self._run(codec.STATS))

    # ---- queries --------------------------------------------------------
    async def query(self, app: str, goal: str, *, all_solutions: bool = True, timeout_s: float | None = None,
                    max_solutions: int = 10_000, tag: str | None = None,
                    client: codec.Client | None = None) -> dict[str, Any]:
        """``tag``: whom the query runs for, so that cancel(tag) can stop it; ``client``: (uid, privileged),
        for the engine's per-uid shares of its threads (none: the daemon's own query)."""
        op, timeout = self.config.query_op(app, goal, all_solutions, timeout_s, max_solutions, tag, client)
        return dict(await self._run(op, timeout))

    async def execute_query(self, app: str, goal: str, *, all_solutions: bool = True,
                            timeout_s: float | None = None, max_solutions: int = 10_000) -> list[dict[str, Any]]:
        answer = await self.query(app, goal, all_solutions=all_solutions, timeout_s=timeout_s,
                                  max_solutions=max_solutions)
        return list(answer["solutions"])

    async def evaluate(self, app: str, staged: Staged, queries: list[tuple[str, str]], *,
                       timeout_s: float | None = None, round_limit_s: float | None = None,
                       client: codec.Client | None = None) -> list[dict[str, Any]]:
        """Each query's first value as the namespace would be after ``staged`` (nothing changes).
        ``round_limit_s``: no query starts after the evaluation has run this long (those are
        ``{"skipped": true}``); ``client``: (uid, privileged), for the engine's per-uid shares."""
        timeout = self.config.query_timeout_s if timeout_s is None else min(timeout_s, self.config.query_timeout_s)
        op = codec.evaluate(app, staged, queries, timeout_s=timeout, inference_limit=self.config.inference_limit,
                            round_limit_s=round_limit_s, client=client)
        # Every query may run for its whole time limit (in a round: those that start in it).
        longest = timeout * max(1, len(queries)) if round_limit_s is None else \
            min(timeout * max(1, len(queries)), round_limit_s + timeout)
        return list(await self._run(op, longest + 1.0))

    async def ping(self) -> None:
        await self._run(codec.PING)

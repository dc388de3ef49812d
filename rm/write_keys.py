"""Idempotency keys of writes: a retry learns the first outcome instead of writing twice.

A client may send any write (:data:`cod.protocol.jsonrpc.WRITE_METHODS`) with a ``request_key``
of its choice.  The daemon keeps the outcome of each keyed write of a connection, so that the
same request sent again with that key, on that connection, gets that outcome exactly (its result,
or its error) instead of running a second time; while the first is still under way (its answer
was OUTCOME_UNKNOWN and it goes on in the background), the retry waits for its outcome, up to the
write's answer time, and else answers OUTCOME_UNKNOWN again (docs/protocol.md, "Write outcomes").

The table of a connection is bounded: at most ``keys`` outcomes and ``bytes`` of them (the
oldest go first, settled or not), each kept ``ttl_s``; it goes with its connection, whose
non-persistent facts go too (a retry on a new connection writes again, which is what it then
needs).  Mechanism only: the write itself is the caller's, and what the outcome is, its answer.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from cod.protocol.jsonrpc import INVALID_PARAMS, OUTCOME_UNKNOWN, REQUEST_KEY, RpcError

KEY_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")
ENTRY_OVERHEAD_BYTES = 200  # the entry, its key and fingerprint, beside its outcome's JSON


@dataclass(frozen=True)
class KeyLimits:
    keys: int      # outcomes kept per connection
    bytes: int     # their size in all (outcome JSON plus ENTRY_OVERHEAD_BYTES each)
    ttl_s: float   # how long one is kept after its write began


def key_problem(key: Any) -> str | None:
    """Why ``key`` is not a request key (None: it is one)."""
    if not isinstance(key, str):
        return f"must be a string, not {type(key).__name__}"
    if KEY_PATTERN.fullmatch(key) is None:
        return "must be 1 to 128 characters of letters, digits, '.', '_', ':' and '-'"
    return None


def fingerprint(method: str, params: dict[str, Any]) -> str:
    """What a key stands for: the method and its parameters (the key left out), in one digest."""
    text = json.dumps([method, params], sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


class WriteUnsettled(RpcError):
    """OUTCOME_UNKNOWN from a write that goes on in the background: ``settled`` ends with its true
    outcome (its result, or the RpcError of a write that will not be applied)."""

    def __init__(self, message: str, settled: "asyncio.Future[Any]") -> None:
        super().__init__(OUTCOME_UNKNOWN, message)
        self.settled = settled


@dataclass
class _Entry:
    fingerprint: str
    method: str
    began: float
    outcome: "asyncio.Future[Any]"  # the result, or a tuple (code, message, data) of its error
    size: int = ENTRY_OVERHEAD_BYTES


@dataclass
class ConnectionKeys:
    """The keyed outcomes of one connection, oldest first."""

    limits: KeyLimits
    clock: Callable[[], float] = time.monotonic
    entries: "OrderedDict[str, _Entry]" = field(default_factory=OrderedDict)
    size: int = 0

    def find(self, key: str) -> _Entry | None:
        now = self.clock()
        while self.entries:
            oldest_key, oldest = next(iter(self.entries.items()))
            if now - oldest.began < self.limits.ttl_s:
                break
            self._drop(oldest_key)
        return self.entries.get(key)

    def add(self, key: str, entry: _Entry) -> None:
        self.entries[key] = entry
        self.size += entry.size
        self._trim()

    def settle(self, key: str, entry: _Entry, outcome: Any) -> None:
        """The write of ``key`` ended: ``outcome`` is its result or (code, message, data)."""
        if not entry.outcome.done():
            entry.outcome.set_result(outcome)
        if self.entries.get(key) is entry:
            grown = ENTRY_OVERHEAD_BYTES + len(json.dumps(outcome, default=str))
            self.size += grown - entry.size
            entry.size = grown
            self._trim()

    def drop(self, key: str, entry: _Entry) -> None:
        if self.entries.get(key) is entry:
            self._drop(key)

    def _drop(self, key: str) -> None:
        self.size -= self.entries.pop(key).size

    def _trim(self) -> None:
        """The oldest go while over a limit; the newest always stays."""
        while len(self.entries) > 1 and (len(self.entries) > self.limits.keys or self.size > self.limits.bytes):
            self._drop(next(iter(self.entries)))


def _error_of(err: RpcError) -> tuple[int, str, Any]:
    return (err.code, err.message, err.data)


class WriteKeys:
    """The keyed outcomes of every connection."""

    def __init__(self, limits: KeyLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.clock = clock
        self._tables: dict[int, ConnectionKeys] = {}

    def forget(self, conn_id: int) -> None:
        self._tables.pop(conn_id, None)

    def held(self, conn_id: int) -> int:
        table = self._tables.get(conn_id)
        return len(table.entries) if table is not None else 0

    async def run(self, conn_id: int, method: str, params: dict[str, Any],
                  write: Callable[[dict[str, Any]], Awaitable[Any]], answer_s: float) -> Any:
        """``write(params)`` (the key taken out) once per key: the first outcome for every request of that key."""
        key = params[REQUEST_KEY]
        problem = key_problem(key)
        if problem is not None:
            raise RpcError(INVALID_PARAMS, f"{method}: {REQUEST_KEY} {problem}")
        rest = {k: v for k, v in params.items() if k != REQUEST_KEY}
        table = self._tables.setdefault(conn_id, ConnectionKeys(self.limits, self.clock))
        digest = fingerprint(method, rest)
        entry = table.find(key)
        if entry is not None:
            if entry.fingerprint != digest:
                raise RpcError(INVALID_PARAMS, f"{method}: {REQUEST_KEY} {key!r} was used on this connection for "
                                               f"another request ({entry.method} with other parameters); a new request "
                                               "needs a new key")
            return await self._outcome(entry, key, answer_s)
        entry = _Entry(digest, method, self.clock(), asyncio.get_running_loop().create_future())
        table.add(key, entry)
        try:
            result = await write(rest)
        except WriteUnsettled as err:
            err.settled.add_done_callback(lambda done: table.settle(key, entry, _settled(done)))
            raise RpcError(OUTCOME_UNKNOWN, f"{err.message}; send it again with {REQUEST_KEY} {key!r} to learn "
                                            "its outcome", {REQUEST_KEY: key}) from None
        except RpcError as err:
            table.settle(key, entry, _error_of(err))
            raise
        except BaseException:
            table.drop(key, entry)  # a daemon bug or a cancellation: its retry runs again
            raise
        table.settle(key, entry, {"result": result})
        return result

    @staticmethod
    async def _outcome(entry: _Entry, key: str, answer_s: float) -> Any:
        try:
            outcome = await asyncio.wait_for(asyncio.shield(entry.outcome), answer_s)
        except TimeoutError:
            raise RpcError(OUTCOME_UNKNOWN, f"{entry.method}: the request with {REQUEST_KEY} {key!r} is still under "
                                            f"way after {answer_s:g} s more; its outcome is not known yet",
                           {REQUEST_KEY: key}) from None
        if isinstance(outcome, dict):
            return outcome["result"]
        code, message, data = outcome
        raise RpcError(code, message, data)


def _settled(done: "asyncio.Future[Any]") -> Any:
    """A background write's outcome as the table keeps it."""
    if done.cancelled():
        return (OUTCOME_UNKNOWN, "the write was stopped with the daemon; its outcome is not known", None)
    err = done.exception()
    if err is None:
        return {"result": done.result()}
    if isinstance(err, RpcError):
        return _error_of(err)
    return (OUTCOME_UNKNOWN, f"the write failed inside the daemon ({type(err).__name__}); its outcome is not known",
            None)

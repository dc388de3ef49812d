"""The idempotency keys of writes (cod.rm.write_keys) as tables: no daemon, no SKB; a fake clock."""

from __future__ import annotations

import asyncio

import pytest

from cod.protocol.jsonrpc import INVALID_PARAMS, OUTCOME_UNKNOWN, QUOTA_EXCEEDED, RpcError
from cod.rm.write_keys import (
    ENTRY_OVERHEAD_BYTES,
    ConnectionKeys,
    KeyLimits,
    WriteKeys,
    WriteUnsettled,
    fingerprint,
    key_problem,
)

KEYS = [
    ("a uuid's hex", "3f2c9a0e8b7d4c1fa2b3c4d5e6f70812", None),
    ("letters, digits and . _ : -", "app-1.write_2:x", None),
    ("128 characters", "k" * 128, None),
    ("empty", "", "1 to 128 characters"),
    ("129 characters", "k" * 129, "1 to 128 characters"),
    ("a space", "a b", "1 to 128 characters"),
    ("a newline", "a\nb", "1 to 128 characters"),
    ("not ASCII", "clé", "1 to 128 characters"),
    ("a number", 7, "must be a string, not int"),
    ("null", None, "must be a string, not NoneType"),
]


@pytest.mark.parametrize("desc, key, problem", KEYS, ids=[k[0] for k in KEYS])
def test_key_problem(desc, key, problem):
    got = key_problem(key)
    assert (got is None) if problem is None else (got is not None and problem in got), got


FINGERPRINTS = [
    ("same params in another order", ("add_facts", {"facts": ["a(1)"], "persistent": True}),
     ("add_facts", {"persistent": True, "facts": ["a(1)"]}), True),
    ("another fact", ("add_facts", {"facts": ["a(1)"]}), ("add_facts", {"facts": ["a(2)"]}), False),
    ("another method, same params", ("add_facts", {"facts": ["a(1)"]}), ("remove_facts", {"facts": ["a(1)"]}), False),
    ("a flag more", ("add_facts", {"facts": ["a(1)"]}), ("add_facts", {"facts": ["a(1)"], "persistent": False}), False),
]


@pytest.mark.parametrize("desc, one, other, same", FINGERPRINTS, ids=[f[0] for f in FINGERPRINTS])
def test_fingerprint(desc, one, other, same):
    assert (fingerprint(*one) == fingerprint(*other)) is same


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run(coro):
    return asyncio.run(coro)


def table_with(limits: KeyLimits, clock: Clock, keys: list[str], outcome_bytes: int = 10) -> ConnectionKeys:
    """A table holding settled outcomes of ``keys`` (one per clock second), oldest first."""
    async def fill() -> ConnectionKeys:
        from cod.rm.write_keys import _Entry
        table = ConnectionKeys(limits, clock)
        for key in keys:
            entry = _Entry("fp", "add_facts", clock(), asyncio.get_running_loop().create_future())
            table.add(key, entry)
            table.settle(key, entry, {"result": "x" * (outcome_bytes - len('{"result": ""}'))})
            clock.now += 1
        return table
    return run(fill())


BOUNDS = [
    # (description, limits, keys written, seconds later, keys still known)
    ("under every limit", KeyLimits(4, 1 << 20, 60), ["a", "b", "c"], 0, ["a", "b", "c"]),
    ("over the count: the oldest go", KeyLimits(2, 1 << 20, 60), ["a", "b", "c"], 0, ["b", "c"]),
    ("over the bytes: the oldest go", KeyLimits(99, 2 * (ENTRY_OVERHEAD_BYTES + 100), 60), ["a", "b", "c"], 0,
     ["b", "c"]),
    ("the newest stays, even alone over the bytes", KeyLimits(99, 10, 60), ["a", "b"], 0, ["b"]),
    ("past the time: forgotten", KeyLimits(99, 1 << 20, 2.5), ["a", "b", "c"], 0.0, ["b", "c"]),
    ("all past the time", KeyLimits(99, 1 << 20, 2.5), ["a", "b", "c"], 10.0, []),
]


@pytest.mark.parametrize("desc, limits, keys, later, known", BOUNDS, ids=[b[0] for b in BOUNDS])
def test_bounds(desc, limits, keys, later, known):
    clock = Clock()
    table = table_with(limits, clock, keys, outcome_bytes=100)
    clock.now += later
    assert [k for k in keys if table.find(k) is not None] == known
    assert table.size == sum(e.size for e in table.entries.values())


def keys(limits: KeyLimits = KeyLimits(8, 1 << 20, 60)) -> tuple[WriteKeys, Clock]:
    clock = Clock()
    return WriteKeys(limits, clock), clock


class Write:
    """A write that counts its runs; what it does is given by ``outcome``."""

    def __init__(self, outcome) -> None:
        self.outcome = outcome
        self.runs = 0

    async def __call__(self, params):
        self.runs += 1
        assert "request_key" not in params
        return await self.outcome(params)


async def added(params):
    return {"added": len(params["facts"])}


async def over_quota(params):
    raise RpcError(QUOTA_EXCEEDED, "add_facts: over app_max_facts", {"limit": 1})


def test_a_retry_gets_the_first_result_without_writing_again():
    async def go():
        wk, _ = keys()
        write = Write(added)
        params = {"facts": ["a(1)", "a(2)"], "request_key": "k1"}
        first = await wk.run(1, "add_facts", params, write, 1.0)
        second = await wk.run(1, "add_facts", dict(params), write, 1.0)
        return first, second, write.runs
    assert run(go()) == ({"added": 2}, {"added": 2}, 1)


def test_a_refusal_is_an_outcome_too():
    async def go():
        wk, _ = keys()
        write = Write(over_quota)
        params = {"facts": ["a(1)"], "request_key": "k1"}
        errors = []
        for _ in range(2):
            with pytest.raises(RpcError) as err:
                await wk.run(1, "add_facts", params, write, 1.0)
            errors.append((err.value.code, err.value.message, err.value.data))
        return errors, write.runs
    errors, runs = run(go())
    assert runs == 1 and errors[0] == errors[1] == (QUOTA_EXCEEDED, "add_facts: over app_max_facts", {"limit": 1})


SCOPES = [
    # (description, first (conn, method, params), second, runs of the write, second's error code)
    ("another key runs again", (1, "add_facts", {"facts": ["a(1)"], "request_key": "k1"}),
     (1, "add_facts", {"facts": ["a(1)"], "request_key": "k2"}), 2, None),
    ("another connection runs again", (1, "add_facts", {"facts": ["a(1)"], "request_key": "k1"}),
     (2, "add_facts", {"facts": ["a(1)"], "request_key": "k1"}), 2, None),
    ("the same key for other params is refused", (1, "add_facts", {"facts": ["a(1)"], "request_key": "k1"}),
     (1, "add_facts", {"facts": ["a(2)"], "request_key": "k1"}), 1, INVALID_PARAMS),
    ("the same key for another method is refused", (1, "add_facts", {"facts": ["a(1)"], "request_key": "k1"}),
     (1, "remove_facts", {"facts": ["a(1)"], "request_key": "k1"}), 1, INVALID_PARAMS),
    ("a key that is not one is refused, nothing runs", (1, "add_facts", {"facts": ["a(1)"], "request_key": "k1"}),
     (1, "add_facts", {"facts": ["a(1)"], "request_key": "k 1"}), 1, INVALID_PARAMS),
]


@pytest.mark.parametrize("desc, first, second, runs, code", SCOPES, ids=[s[0] for s in SCOPES])
def test_what_a_key_stands_for(desc, first, second, runs, code):
    async def go():
        wk, _ = keys()
        write = Write(added)
        await wk.run(*first, write, 1.0)
        try:
            await wk.run(*second, write, 1.0)
            got = None
        except RpcError as err:
            got = err.code
        return write.runs, got
    assert run(go()) == (runs, code)


def test_an_unsettled_write_answers_unknown_then_its_retry_learns_the_outcome():
    async def go():
        wk, _ = keys()
        loop = asyncio.get_running_loop()
        settled = loop.create_future()

        async def slow(params):
            raise WriteUnsettled("add_facts: the SKB did not answer within 1 s", settled)
        write = Write(slow)
        params = {"facts": ["a(1)"], "request_key": "k1"}
        with pytest.raises(RpcError) as first:
            await wk.run(1, "add_facts", params, write, 0.05)
        # Still under way: the retry waits its answer time, then says so again.
        with pytest.raises(RpcError) as pending:
            await wk.run(1, "add_facts", params, write, 0.05)
        loop.call_later(0.01, settled.set_result, {"added": 1})
        third = await wk.run(1, "add_facts", params, write, 5.0)
        return first.value, pending.value, third, write.runs
    first, pending, third, runs = run(go())
    assert first.code == OUTCOME_UNKNOWN and first.data == {"request_key": "k1"} and "'k1'" in first.message
    assert pending.code == OUTCOME_UNKNOWN and "still under way" in pending.message
    assert third == {"added": 1} and runs == 1


def test_an_unsettled_write_that_fails_late_is_a_definite_failure_on_retry():
    async def go():
        wk, _ = keys()
        settled = asyncio.get_running_loop().create_future()

        async def slow(params):
            raise WriteUnsettled("add_facts: no answer in time", settled)
        params = {"facts": ["a(1)"], "request_key": "k1"}
        with pytest.raises(RpcError):
            await wk.run(1, "add_facts", params, Write(slow), 0.05)
        settled.set_exception(RpcError(-32050, "the write was not applied: the engine was restarted"))
        with pytest.raises(RpcError) as retry:
            await wk.run(1, "add_facts", params, Write(added), 1.0)
        return retry.value
    err = run(go())
    assert err.code == -32050 and "not applied" in err.message


def test_a_connection_that_goes_takes_its_keys():
    async def go():
        wk, _ = keys()
        write = Write(added)
        params = {"facts": ["a(1)"], "request_key": "k1"}
        await wk.run(1, "add_facts", params, write, 1.0)
        held = wk.held(1)
        wk.forget(1)
        await wk.run(1, "add_facts", params, write, 1.0)
        return held, write.runs
    assert run(go()) == (1, 2)

"""Write outcomes against a real daemon and engine: a write the SKB engine did not answer in time
(the engine stopped with SIGSTOP) is never reported as failed; a retry with its request key says
what happened, and never applies it twice (docs/protocol.md, "Write outcomes").

Before: the daemon answered such a write -32042 ("the engine did not answer"), and applied it when
the engine went on; a client that believed it and wrote again removed another client's fact.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from pathlib import Path

import pytest

from cod.client import Client, OutcomeUnknown, RMError
from cod.protocol.jsonrpc import OUTCOME_UNKNOWN
from helpers.waiting import load_scaled, wait_until
from helpers.rm_support import start_daemon

# A write is answered within query_timeout_s + 2 s (the engine's grace): 3 s here.
DAEMON_ARGS = ("--machine", "magnycours", "--log-level", "info", "--set", "query_timeout_s=1")


def engine_pid(daemon_pid: int) -> int | None:
    """The daemon's SWI-Prolog child, the SKB engine."""
    for pid in Path(f"/proc/{daemon_pid}/task/{daemon_pid}/children").read_text().split():
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/comm").read_text().strip() == "swipl":
                return int(pid)
    return None


@contextlib.contextmanager
def stopped(pid: int):
    """The engine stopped (SIGSTOP) for the block, and going on (SIGCONT) after it."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


@pytest.fixture
def daemon(tmp_path):
    d = start_daemon(tmp_path, *DAEMON_ARGS)
    yield d
    d.stop()


def facts(c: Client, goal: str) -> list[dict]:
    return c.call("execute_query", {"goal": goal})["solutions"]


def test_a_write_the_stopped_engine_did_not_answer_is_unknown_and_its_retry_tells_what_happened(daemon):
    with Client.connect(str(daemon.path), app="w1", reconnect=False) as c, \
            Client.connect(str(daemon.path), app="w1", reconnect=False) as other:
        c.call("add_facts", {"facts": ["seen(1)"]})
        engine = engine_pid(daemon.proc.pid)
        with stopped(engine):
            with pytest.raises(RMError) as unkeyed:
                c.call("add_facts", {"facts": ["late(1)"]})
            with pytest.raises(RMError) as keyed:
                c.call("remove_facts", {"patterns": ["seen(_)"], "request_key": "rm-1"})
        # Neither is "failed": each may still be applied (and both are, now the engine goes on).
        assert unkeyed.value.code == OUTCOME_UNKNOWN, unkeyed.value
        assert keyed.value.code == OUTCOME_UNKNOWN and keyed.value.data == {"request_key": "rm-1"}, keyed.value
        assert "may still be applied" in keyed.value.message
        first = c.call("remove_facts", {"patterns": ["seen(_)"], "request_key": "rm-1"})
        assert first == {"removed": 1}
        assert facts(c, "late(X)") == [{"X": 1}]
        # Another client adds a fact the pattern matches; the same request again does not take it.
        other.call("add_facts", {"facts": ["seen(2)"]})
        assert c.call("remove_facts", {"patterns": ["seen(_)"], "request_key": "rm-1"}) == {"removed": 1}
        assert facts(c, "seen(X)") == [{"X": 2}]
        # The key stands for that request only.
        with pytest.raises(RMError) as reused:
            c.call("remove_facts", {"patterns": ["late(_)"], "request_key": "rm-1"})
        assert reused.value.code == -32602 and "another request" in reused.value.message


def test_a_write_the_restarted_engine_never_got_is_a_definite_failure(daemon):
    with Client.connect(str(daemon.path), app="w2", reconnect=False) as c:
        c.call("add_facts", {"facts": ["lost(0)"]})
        engine = engine_pid(daemon.proc.pid)
        with stopped(engine):
            with pytest.raises(RMError) as unknown:
                c.call("add_facts", {"facts": ["lost(1)"], "request_key": "add-1"})
            assert unknown.value.code == OUTCOME_UNKNOWN
            # The daemon restarts an engine that answers no ping and makes no progress.
            wait_until(lambda: engine_pid(daemon.proc.pid) not in (None, engine), load_scaled(60),
                       "the daemon to restart the stopped engine")
        with pytest.raises(RMError) as retry:
            c.call("add_facts", {"facts": ["lost(1)"], "request_key": "add-1"})
        assert retry.value.code == -32050 and "not applied" in retry.value.message, retry.value
        assert facts(c, "lost(X)") == [{"X": 0}]  # the journal gave the new engine what was answered


def test_the_python_client_says_unknown_and_its_retry_applies_once(daemon):
    events: list[dict] = []
    seen = threading.Event()

    def on_change(event: dict) -> None:
        events.append(event)
        seen.set()

    with Client.connect(str(daemon.path), app="w3", reconnect=False) as c:
        c.subscribe("facts_changed", {"app": "w3"}, on_change)
        with stopped(engine_pid(daemon.proc.pid)):
            with pytest.raises(OutcomeUnknown) as err:
                c.add_facts(["late(1)"])
        assert err.value.code == OUTCOME_UNKNOWN and err.value.request_key is not None
        assert c.retry(err.value) == {"added": 1}  # the first outcome, not a second add (0)
        held = [t for op in c._held.fact_ops for t in op.texts]
        assert held == ["late(1)"]  # held once its outcome is known: a reconnection puts it back
        # The late write brought what any write brings: its facts_changed upcall.
        assert seen.wait(load_scaled(10)) and events[0]["op"] == "add" and events[0]["predicates"] == ["late"]


def test_a_client_side_timeout_is_unknown_too_and_the_retry_learns_the_first_outcome(tmp_path):
    d = start_daemon(tmp_path, *DAEMON_ARGS)
    try:
        with Client.connect(str(d.path), app="w4", reconnect=False, call_timeout_s=0.5) as c:
            with stopped(engine_pid(d.proc.pid)):
                with pytest.raises(OutcomeUnknown) as err:
                    c.add_facts(["late(1)"])
            assert err.value.request_key is not None and "no reply within 0.5 s" in err.value.message
            c.call_timeout_s = 30.0
            assert c.retry(err.value) == {"added": 1}
            assert c.add_facts(["late(1)"]) == 0  # a new request, on what the first one did
    finally:
        d.stop()


def test_a_uid_holds_a_bounded_number_of_unsettled_writes_and_one_more_is_refused_unsent(tmp_path):
    d = start_daemon(tmp_path, *DAEMON_ARGS, "--set", "max_unsettled_writes_per_uid=1")
    try:
        with Client.connect(str(d.path), app="w5", reconnect=False) as c:
            with stopped(engine_pid(d.proc.pid)):
                with pytest.raises(OutcomeUnknown) as first:
                    c.add_facts(["late(1)"])
                with pytest.raises(RMError) as refused:
                    c.add_facts(["late(2)"])
            assert refused.value.code == -32031 and "was not sent" in refused.value.message, refused.value
            assert refused.value.data == {"quota": "max_unsettled_writes_per_uid", "limit": 1}
            assert c.retry(first.value) == {"added": 1}
            assert facts(c, "late(X)") == [{"X": 1}]  # the refused one never was applied
    finally:
        d.stop()

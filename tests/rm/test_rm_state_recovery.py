"""Issue 47, item 1, through the daemon: after journal compactions and an engine killed, every
application has its facts, their owners and its procedures back.

Before the fix, an engine restart after a compaction brought back only the first application that
held anything (3,000 facts added one at a time by several applications: 552 left)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from cod.client import Client, CodError
from test_rm_security import engine_pid
from helpers.rm_support import start_daemon

FACTS_EACH = 60  # one at a time: 420 writes, the journal compacted several times at 50 entries


def all_of(c: Client, pred: str) -> list[int]:
    return sorted(s["X"] for s in c.execute_query(f"{pred}(X)"))


def wait_for_new_engine(d, old: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if engine_pid(d) != old:
                return
        except (IndexError, OSError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"the engine was not restarted; daemon log:\n{d.log_text()[-3000:]}")


def test_every_application_keeps_its_state_through_compaction_and_an_engine_kill(tmp_path: Path) -> None:
    d = start_daemon(tmp_path, "--machine", "magnycours", "--set", "skb_journal_compact_at=50")
    try:
        path = str(d.path)
        connected = {name: Client(path, app=name) for name in ("db1", "db2", "db3")}
        for name, c in connected.items():
            c.add_procedure("double(Y) :- held(X), Y is 2 * X.")
            c.add_procedure("kept(1).", persistent=True)
        for i in range(FACTS_EACH):
            for c in connected.values():
                c.add_fact(f"held({i})")  # held by the connection
                c.add_fact(f"stays({i})", persistent=True)
        for name in ("gone1", "gone2", "gone3", "gone4"):  # applications whose clients left
            with Client(path, app=name) as c:
                for i in range(FACTS_EACH // 4):
                    c.add_fact(f"stays({i})", persistent=True)
                    c.add_fact(f"lost({i})")  # goes with the connection
                c.add_procedure("p(1).", persistent=True)
                c.add_procedure("q(1).")  # goes with the last connection
        want = list(range(FACTS_EACH))
        old = engine_pid(d)
        os.kill(old, signal.SIGKILL)
        wait_for_new_engine(d, old)
        for name, c in connected.items():
            assert all_of(c, "held") == want, name
            assert all_of(c, "stays") == want, name
            assert all_of(c, "double") == [2 * i for i in want], name
            assert c.execute_query("kept(X)") == [{"X": 1}], name
        for name in ("gone1", "gone2", "gone3", "gone4"):
            with Client(path, app=name) as c:
                assert all_of(c, "stays") == list(range(FACTS_EACH // 4)), name
                assert c.execute_query("p(X)") == [{"X": 1}], name
                assert _gone(c, "lost(_)") and _gone(c, "q(_)"), name
        # The owners came back: db1's connection leaving takes its facts and procedures, not the rest.
        connected.pop("db1").close()
        with Client(path, app="db1") as c:
            # The daemon handles the departure after this new connection's hello, maybe: wait for it.
            deadline = time.monotonic() + 30
            while not _gone(c, "held(_)") and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _gone(c, "held(_)"), "the facts of db1's departed connection are still held"
            assert all_of(c, "stays") == want
            assert c.execute_query("kept(X)") == [{"X": 1}]
        for name, c in connected.items():
            assert all_of(c, "held") == want, name
        for c in connected.values():
            c.close()
        assert "replay of" not in d.log_text(), "a journal entry failed to replay"
    finally:
        d.stop()


def _gone(c: Client, goal: str) -> bool:
    """No solution, or no such predicate any more."""
    try:
        return c.execute_query(goal) == []
    except CodError as err:
        return "unknown" in err.message.lower()

"""Tasks a privileged client enforces itself (the NRI plugin's containers): register_task's enforced_by."""

from __future__ import annotations

import os
import time

import pytest
from helpers.paths import REPO
from helpers.rm_support import NOBODY, RawConn, as_user, magny, shared_dir, start_daemon  # noqa: F401  (magny is a fixture)

from cod.protocol import jsonrpc as rpc


@pytest.mark.parametrize("params, code, needle", [
    ({"enforced_by": "container"}, rpc.INVALID_PARAMS, "enforced_by must be"),
    ({"enforced_by": "client", "pid": os.getpid()}, rpc.INVALID_PARAMS, "leave out 'pid'"),
    ({"enforced_by": 3}, rpc.INVALID_PARAMS, "enforced_by"),
])
def test_bad_enforced_by_is_named_and_changes_nothing(magny, params, code, needle):
    c = RawConn(magny.path)
    c.hello("plugin")
    r = c.call("register_task", {"name": "ctr", **params})
    assert r["error"]["code"] == code and needle in r["error"]["message"], r
    assert c.call("list_tasks", {})["result"]["tasks"] == []


def test_a_client_enforced_task_is_allocated_without_a_process_and_leaves_with_its_connection(magny):
    c, watcher = RawConn(magny.path), RawConn(magny.path)
    c.hello("ns/pod/db")
    watcher.hello("watcher")
    r = c.call("register_task", {"name": "ns/pod/db", "enforced_by": "client",
                                 "properties": {"min_cores": 4, "max_cores": 4}})["result"]
    assert r["pid"] == 0 and len(r["allocation"]["cores"]) == 4
    [task] = watcher.call("list_tasks", {})["result"]["tasks"]
    assert task["enforced_by"] == "client" and task["pid"] == 0
    facts = watcher.call("execute_query", {"goal": "task('ns/pod/db', P, A)"})["result"]["solutions"]
    assert facts == [{"P": 0, "A": "ns/pod/db"}]
    c.close()
    deadline = time.monotonic() + 30
    while watcher.call("list_tasks", {})["result"]["tasks"]:
        assert time.monotonic() < deadline, "the task outlived its client's connection"
        time.sleep(0.05)


def _unprivileged_client_enforced(path):
    c = RawConn(path)
    c.hello("nobodyplugin")
    r = c.call("register_task", {"name": "ctr", "enforced_by": "client"})
    assert r["error"]["code"] == rpc.PERMISSION_DENIED and "privileged" in r["error"]["message"], r


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_only_privileged_clients_may_enforce_their_tasks():
    with shared_dir("cod-rm-test-") as tmp:
        d = start_daemon(tmp, "--machine", "magnycours")
        try:
            assert as_user(NOBODY, _unprivileged_client_enforced, d.path) == 0
        finally:
            d.stop()


LISTING3_FACTS = ["db_ntuple(30000000)", "db_tsize(315)", "db_nquery(2048)", "db_nupdate(0)", "db_rtime(2000)"]


def _no_tasks(path):
    w = RawConn(path)
    w.hello("watcher")
    deadline = time.monotonic() + 30
    while w.call("list_tasks", {})["result"]["tasks"]:
        assert time.monotonic() < deadline, "a task outlived its connection"
        time.sleep(0.001)
    w.close()


@pytest.mark.slow
def test_a_client_that_reconnects_registers_into_its_application_again(tmp_path):
    """The NRI plugin restarted: each container's new connection registers into the application its
    old connection is leaving.  The registration's derived min_cores was evaluated while the engine
    released the application, and 1 in 20 saw "the query has no solution"."""
    with open(os.path.join(REPO, "stored_procedures", "examples",
                           "cscs_cost_fn.pl")) as f:
        procedure = f.read()
    params = {"name": "db/a/db", "enforced_by": "client", "facts": LISTING3_FACTS, "procedures": [procedure],
              "properties": {key: {"query": "dbos_cost_function(_, N, _)", "var": "N"} for key in ("min_cores", "max_cores")}}
    d = start_daemon(tmp_path, "--machine", "magnycours")  # no debug log: it hides the race
    try:
        for attempt in range(60):
            c = RawConn(d.path)
            c.hello("db/a/db")
            r = c.call("register_task", params)
            assert "result" in r and len(r["result"]["allocation"]["cores"]) == 8, (attempt, r)
            c.close()
            _no_tasks(d.path)  # the task has gone; its application may still be leaving
    finally:
        d.stop()

"""libcod_preload.so (clients/c/preload): an unmodified process, started with LD_PRELOAD and
COD_TASK, is registered as that task by the library, its threads get the allocation's memory
nodes as their policy (those started later inherit it), and every thread gets them again on an
allocation_changed upcall, here after each thread had dropped it.  Against a real `cod rm` on this
machine (one node: the nodes do not change, the policy coming back is what shows); the 4x2 guest
shows the pages on the nodes (tests/vm/test_memory.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from test_cclient import BUILD, make
from helpers.rm_support import RawConn, start_daemon

# The "unmodified" program: it never talks to COD; it reads its threads' memory policy
# (get_mempolicy through cod.client.memory, for the test's eyes only) and can drop it.
PROGRAM = r"""
import json, queue, sys, threading, time
from cod.client.memory import thread_policy, unbind_thread
jobs, answers = queue.Queue(), queue.Queue()

def worker():
    while True:
        job = jobs.get()
        if job == "drop":
            unbind_thread()
        answers.put(thread_policy())

threading.Thread(target=worker, daemon=True).start()

def both(job=None):
    if job == "drop":
        unbind_thread()
    jobs.put(job)
    return {"main": thread_policy(), "worker": answers.get(timeout=10)}

print(json.dumps(both()), flush=True)
for line in sys.stdin:
    if line.strip() == "drop":
        print(json.dumps(both("drop")), flush=True)
    elif line.strip() == "wait":  # until both have a policy again (an upcall re-applied it), at most 30 s
        deadline = time.monotonic() + 30
        while (got := both())["main"][0] == "default" or got["worker"][0] == "default":
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        print(json.dumps(got), flush=True)
"""


@pytest.fixture(scope="module")
def preload():
    make("all")
    return str(BUILD / "libcod_preload.so")


def start(preload: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", PROGRAM], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=os.environ | {"LD_PRELOAD": preload, **env})


def ask(proc: subprocess.Popen, line: str | None = None) -> dict:
    if line is not None:
        proc.stdin.write(line + "\n")
        proc.stdin.flush()
    out = proc.stdout.readline()
    assert out, proc.stderr.read()
    return {k: (mode, tuple(nodes)) for k, (mode, nodes) in json.loads(out).items()}


def test_the_preload_sets_every_threads_policy_and_sets_it_again_on_an_upcall(tmp_path, preload):
    d = start_daemon(tmp_path, "--no-enforce", "--no-busy-detect", "--state-dir", str(tmp_path / "state"),
                     "--revoke-deadline", "0.5")
    proc = start(preload, {"COD_SOCKET": str(d.path), "COD_TASK": "scan", "COD_TASK_MIN_CORES": "1"})
    other = RawConn(d.path)
    try:
        bound = {"main": ("bind", (0,)), "worker": ("bind", (0,))}
        assert ask(proc) == bound, "the policy from the first allocation, inherited by a thread started later"
        other.hello("newcomer")
        listing = other.call("list_tasks", {})["result"]
        [scan] = [t for t in listing["tasks"] if t["task"] == "scan"]
        assert scan["pid"] == proc.pid, "the library registered the process itself"
        assert ask(proc, "drop") == {"main": ("default", ()), "worker": ("default", ())}
        # A newcomer takes a CPU from scan: its allocation changes, the upcall reaches the library.
        assert "result" in other.call("register_task", {"name": "olap", "pid": os.getpid(),
                                                        "properties": {"min_cores": 1}})
        assert ask(proc, "wait") == bound
    finally:
        other.close()
        proc.kill()
        proc.wait()
        d.stop()


def test_without_cod_task_the_preload_does_nothing(preload, tmp_path):
    proc = start(preload, {"COD_SOCKET": str(tmp_path / "none.sock")})
    try:
        assert ask(proc) == {"main": ("default", ()), "worker": ("default", ())}
    finally:
        proc.kill()
        proc.wait()
    assert proc.stderr.read() == ""


def test_without_an_rm_the_process_runs_unmanaged_and_says_so(preload, tmp_path):
    proc = start(preload, {"COD_SOCKET": str(tmp_path / "none.sock"), "COD_TASK": "scan"})
    try:
        assert ask(proc) == {"main": ("default", ()), "worker": ("default", ())}
    finally:
        proc.kill()
        proc.wait()
    assert proc.stderr.read().startswith("cod_preload: no COD daemon answers on ")

"""cod.client.memory: the calls an engine makes to put its new pages on its task's memory nodes,
against this machine's kernel (where pages then land on several nodes: tests/vm/test_memory.py)."""

from __future__ import annotations

import ctypes
import mmap
import threading

import pytest

from cod.client import CodError
from cod.client.memory import MemoryRanges, bind_range, bind_thread, thread_policy, unbind_thread

NODE = 0  # every Linux machine has node 0


def in_thread(fn):
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", fn()))
    t.start()
    t.join()
    return out["r"]


def test_a_threads_policy_is_its_own():
    def bound():
        bind_thread([NODE])
        return thread_policy()
    assert in_thread(bound) == ("bind", (NODE,))
    assert thread_policy() == ("default", ())  # this thread is untouched


@pytest.mark.parametrize("mode,expected", [("bind", "bind"), ("preferred", "preferred"), ("interleave", "interleave")])
def test_each_mode_and_back_to_default(mode, expected):
    def cycle():
        bind_thread([NODE], mode)
        during = thread_policy()
        unbind_thread()
        return during, thread_policy()
    assert in_thread(cycle) == ((expected, (NODE,)), ("default", ()))


def address(m: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(m))


def test_registered_ranges_follow_the_allocations_memory_nodes():
    m = mmap.mmap(-1, 1 << 20)
    addr = address(m)
    ranges = MemoryRanges()
    ranges.register(addr, 1 << 20)
    assert thread_policy(addr) == ("default", ())  # no nodes known yet
    ranges.follow({"task": "db", "memory_nodes": []})  # no CPU yet: nothing changes
    assert thread_policy(addr) == ("default", ())
    ranges.follow({"task": "db", "memory_nodes": [NODE]})
    assert thread_policy(addr) == ("bind", (NODE,))
    later = mmap.mmap(-1, 1 << 16)
    ranges.register(address(later), 1 << 16)  # bound at once
    assert thread_policy(address(later)) == ("bind", (NODE,))
    ranges.unregister(addr)
    with pytest.raises(CodError, match="no registered range"):
        ranges.unregister(addr)


@pytest.mark.parametrize("call,needle", [
    (lambda: bind_thread([]), "one or more node numbers"),
    (lambda: bind_thread([-1]), "one or more node numbers"),
    (lambda: bind_thread([True]), "one or more node numbers"),
    (lambda: bind_thread([NODE], "default"), "use 'bind', 'preferred' or 'interleave'"),
    (lambda: bind_thread([NODE], "local"), "use 'bind', 'preferred' or 'interleave'"),
    (lambda: bind_thread([4000]), r"set_mempolicy\(bind, nodes \[4000\]\) failed: Invalid argument"),
    (lambda: bind_range(1, 4096, [NODE]), "page-aligned"),
    (lambda: MemoryRanges("local"), "use 'bind'"),
])
def test_bad_calls_say_what_was_wrong_and_change_nothing(call, needle):
    def attempt():
        with pytest.raises(CodError, match=needle):
            call()
        return thread_policy()
    assert in_thread(attempt) == ("default", ())


def test_register_task_binds_the_ranges_before_the_tasks_handler_runs(tmp_path):
    """Against a real daemon for this machine (planning only): the first allocation binds the
    registered ranges, and each allocation_changed upcall re-binds them before on_allocation runs."""
    from cod.client import Client
    from helpers.rm_support import start_daemon

    d = start_daemon(tmp_path, "--no-enforce", "--no-busy-detect")
    m = mmap.mmap(-1, 1 << 20)
    addr = address(m)
    ranges = MemoryRanges()
    ranges.register(addr, 1 << 20)
    seen, done = [], threading.Event()

    def on_allocation(event):
        seen.append((event["memory_nodes"], ranges.nodes, thread_policy(addr)))
        done.set()

    try:
        with Client.connect(str(d.path), app="db") as c:
            reply = c.register_task("scan", min_cores=1, memory=ranges, on_allocation=on_allocation)
            nodes = reply["allocation"]["memory_nodes"]
            assert nodes and thread_policy(addr) == ("bind", tuple(nodes))
            assert done.wait(30), "no allocation_changed upcall"
            assert seen[0] == (nodes, tuple(nodes), ("bind", tuple(nodes)))
    finally:
        d.stop()

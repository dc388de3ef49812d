"""Live-state samplers on the real machine."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from cod.rm.enforce.livestate import (
    CpuLoadSampler, LiveStateSampler, TaskSampler, node_free_bytes, numa_pages, parse_numa_maps,
)
from helpers.procs import spawn, spinner_cmd  # noqa: F401 (fixtures)
from test_enforce_busy import write_stat

CPUS = sorted(os.sched_getaffinity(0))
NODES = sorted(int(n[4:]) for n in os.listdir("/sys/devices/system/node") if n[4:].isdigit() and n.startswith("node"))


@pytest.mark.parametrize("text,expected", [
    (b"7f00 default file=/lib/x.so mapped=3 mapmax=2 N0=3 kernelpagesize_kB=4\n", {0: 3}),
    (b"1000 interleave:0-1 anon=10 dirty=10 N0=4 N1=6\n2000 bind:1 anon=2 N1=2\n", {0: 4, 1: 6 + 2}),
    (b"3000 default stack anon=1 dirty=1 N12=1\n", {12: 1}),
    (b"4000 default\n", {}),  # nothing resident
])
def test_parse_numa_maps(text, expected):
    assert parse_numa_maps(text) == expected


def test_numa_pages_of_a_real_process(spawn):
    task = spawn(2, "sleep")
    pages = numa_pages(task.pid)
    assert pages and set(pages) <= set(NODES) and sum(pages.values()) > 0
    task.stop()
    assert numa_pages(task.pid) is None


def test_free_memory_per_node():
    free = node_free_bytes()
    assert sorted(free) == NODES
    for node, value in free.items():
        total = next(int(line.split()[3]) * 1024 for line in open(f"/sys/devices/system/node/node{node}/meminfo")
                     if line.split()[2] == "MemTotal:")
        assert 0 < value <= total


def test_cpu_load_sees_a_pinned_spinner(spawn):
    hog = spawn(1, "spin")
    os.sched_setaffinity(hog.pid, [CPUS[-1]])
    for tid in hog.tids:
        os.sched_setaffinity(tid, [CPUS[-1]])
    sampler = CpuLoadSampler()
    sampler.sample()
    time.sleep(0.3)
    load = sampler.sample()
    assert sorted(load) == sorted(set(load) | set(CPUS))
    assert load[CPUS[-1]] > 0.5
    assert all(0.0 <= v <= 1.0 for v in load.values())


def test_task_cpu_use_and_departure(spawn):
    hog, idle = spawn(3, "spin"), spawn(1, "sleep")  # three spinners: well above 0.3 on a shared box
    if os.geteuid() == 0:  # at load 50 three nice-0 spinners got 0.13 CPUs: at nice -10, ~0.7 there
        for tid in os.listdir(f"/proc/{hog.pid}/task"):
            os.setpriority(os.PRIO_PROCESS, int(tid), -10)
    sampler = TaskSampler()
    tasks = {"hog": [hog.pid], "idle": [idle.pid]}
    sampler.sample(tasks)
    time.sleep(0.3)
    state = sampler.sample(tasks)
    assert state["hog"].cpu > 0.3 and state["idle"].cpu < 0.1
    assert state["hog"].pids == (hog.pid,) and sum(state["hog"].pages.values()) > 0
    hog.stop()
    assert sampler.sample(tasks)["hog"].pids == ()


def test_a_task_reading_delayed_within_a_sample_is_divided_by_its_own_time(tmp_path):
    # Two tasks, samples 1 s apart; the second task's reading comes 0.5 s after the sample's start
    # in the first sample (the first task's numa_maps, a loaded machine), at once in the second.
    # It used 0.5 core all along: over its readings' own span that is 0.5, over the samples' 1 s
    # it was 0.25.
    times = iter([0.0, 0.5, 1.0, 1.0])  # the readings of task a, b; then a, b
    sampler = TaskSampler(proc=str(tmp_path), clock=lambda: next(times))
    write_stat(tmp_path, 11, 0)
    write_stat(tmp_path, 12, 25)  # read at 0.5 s: 0.5 core since 0
    sampler.sample({"a": [11], "b": [12]}, pages=False)
    write_stat(tmp_path, 11, 100)
    write_stat(tmp_path, 12, 50)
    state = sampler.sample({"a": [11], "b": [12]}, pages=False)
    assert state["a"].cpu == pytest.approx(1.0)
    assert state["b"].cpu == pytest.approx(0.5)


def test_live_state_in_one_call(spawn):
    task = spawn(1, "sleep")
    state = LiveStateSampler().sample({"db": [task.pid]})
    assert set(state.cpu_load) >= set(CPUS)
    assert sorted(state.node_free_bytes) == NODES
    assert state.tasks["db"].pids == (task.pid,)


def test_one_node_takes_the_machines_free_memory_when_its_own_count_lags(tmp_path):
    """A kernel may count part of a one-node machine's memory per node only once used (issue 32): the
    node's MemFree then under-counts, and /proc/meminfo's is the node's; with two nodes nothing moves."""
    def tree(nodes: dict[int, int]) -> Path:
        root = tmp_path / f"tree{len(list(tmp_path.iterdir()))}"
        for node, free_kb in nodes.items():
            d = root / f"node{node}"
            d.mkdir(parents=True)
            (d / "meminfo").write_text(f"Node {node} MemTotal:  8000000 kB\nNode {node} MemFree:  {free_kb} kB\n")
        return root

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:  24000000 kB\nMemFree:  16000000 kB\n")
    assert node_free_bytes(str(tree({0: 4000000})), str(meminfo)) == {0: 16000000 * 1024}
    assert node_free_bytes(str(tree({0: 4000000})), None) == {0: 4000000 * 1024}
    assert node_free_bytes(str(tree({0: 4000000, 1: 1000})), str(meminfo)) == {0: 4000000 * 1024, 1: 1000 * 1024}
    assert node_free_bytes(str(tree({0: 4000000})), str(tmp_path / "none")) == {0: 4000000 * 1024}

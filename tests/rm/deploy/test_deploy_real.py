"""Real operator threads: profiled, deployed on the fewest cores, pinned; and `cod bandwidth` into a real RM.

The duty-cycle measurements hold the shared bench lock (/tmp/cod-bench.lock) so
no benchmark runs beside them (and may wait for it).  Every process here is one the test started.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cod.client import Client
from cod.facts import sysfs
from cod.rm.deploy import deploy, parse_graph
from cod.rm.deploy.measure.profile import measure, to_graph
from helpers import opthreads
from helpers.benchlock import bench_lock
from helpers.rm_support import start_daemon

COD = [sys.executable, "-m", "cod.cli.main"]
# Eight operator threads of 5-25 % each, 72 % of a core together (names <= 15 bytes).
DUTIES = {"scan_item": 0.25, "join_ol": 0.10, "sort_bestsel": 0.08, "kv_cart": 0.07,
          "groupby_rel": 0.06, "topn_new": 0.06, "scan_author": 0.05, "union_res": 0.05}
NAMES = "^(" + "|".join(DUTIES) + ")$"


@pytest.fixture(scope="module")
def exe(tmp_path_factory) -> str:
    return opthreads.build(str(tmp_path_factory.mktemp("opthreads")))


def host_and_own_busy(pid: int) -> tuple[float, float]:
    """(CPU seconds the whole host has been busy, CPU seconds of process ``pid``)."""
    ticks = os.sysconf("SC_CLK_TCK")
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    host = (sum(fields) - fields[3] - fields[4]) / ticks  # all but idle and iowait
    stat = Path(f"/proc/{pid}/stat").read_text()
    own = sum(int(x) for x in stat[stat.rindex(")") + 2:].split()[11:13]) / ticks
    return host, own


def others_cpus(before: tuple[float, float], after: tuple[float, float], seconds: float) -> float:
    """CPUs kept busy by everything but ``pid`` between two samples."""
    return ((after[0] - before[0]) - (after[1] - before[1])) / seconds


def first_in_line(tids) -> None:
    """The paper profiles on an idle machine.  On a shared one (load 50 in a clean-clone run) the
    threads got less than their duty, then ran over it catching up (join_ol 15 % for 10 %): as
    root, SCHED_FIFO makes other work wait while they run, so they show their duty (72 % of a CPU
    in all, under the kernel's 95 % real-time limit: nothing else starves)."""
    if os.geteuid() != 0:
        return
    for tid in tids:
        os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(1))


def last_cpu(pid: int, tid: int) -> int:
    text = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    return int(text[text.rindex(")") + 2:].split()[36])  # field 39: processor


@pytest.mark.slow
@pytest.mark.timeout(1500)  # may wait for another engineer's benchmark to free the lock
def test_profile_deploy_and_pin_named_operator_threads(exe):
    with bench_lock():
        ops = opthreads.start(exe, DUTIES, seconds=120)
        try:
            first_in_line(ops.tids.values())
            ops.go()
            time.sleep(0.5)
            # The paper profiles on an otherwise idle machine.  On a shared host, a
            # window in which other processes kept more than half a CPU busy may measure
            # the host, not the threads: such a window is put aside and another taken (for
            # up to a minute and a half; a dedicated CI machine takes the first window).
            # If none is quiet, the quietest is judged: the threads are handed fixed work
            # and catch up when they fall behind, so they still show their duty unless the
            # host leaves them less than they need, and the RAV check below says so.
            deadline = time.monotonic() + 90
            best = None
            while True:
                before = host_and_own_busy(ops.pid)
                window = measure(ops.pid, 2.0)
                others = others_cpus(before, host_and_own_busy(ops.pid), window.seconds)
                if best is None or others < best[0]:
                    best = (others, window)
                if others < 0.5 or time.monotonic() > deadline:
                    break
            others, window = best
            graph = to_graph(window, threads=NAMES)
            measured = {o["id"]: o["cpu_util"] for o in graph["operators"]}
            assert set(measured) == set(DUTIES)
            for name, duty in DUTIES.items():  # each RAV within 5 percentage points
                assert abs(measured[name] - duty) <= 0.05, (name, measured[name], duty,
                                                            f"other work kept {others:.2f} CPUs busy")

            machine = sysfs.discover("/")
            plan = deploy(parse_graph(graph), machine)
            assert plan.cores == plan.cores_lower_bound  # the fewest cores: 1 for 72 % of a core
            assert plan.cores == plan.min_cores == 1
            assert set(plan.placement) == set(DUTIES)
            for name, cpu in plan.placement.items():
                os.sched_setaffinity(ops.tids[name], {cpu})  # our own threads only
            for name, cpu in plan.placement.items():
                assert os.sched_getaffinity(ops.tids[name]) == {cpu}
            time.sleep(0.5)
            for name, cpu in plan.placement.items():
                assert last_cpu(ops.pid, ops.tids[name]) == cpu
            assert ops.proc.poll() is None  # still running its operators
        finally:
            ops.stop()


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_profile_pipes_into_deploy_plan(exe):
    with bench_lock():
        # Until stopped below: on a busy machine `cod profile` alone took 3.7 s to start, and threads
        # that ran 4 s were gone before it sampled them.
        ops = opthreads.start(exe, DUTIES, seconds=120)
        try:
            ops.go()
            time.sleep(0.3)
            prof = subprocess.run([*COD, "profile", "--pid", str(ops.pid), "--seconds", "1", "--threads", NAMES],
                                  capture_output=True, text=True, timeout=60)
            assert prof.returncode == 0, prof.stderr
            plan = subprocess.run([*COD, "deploy-plan", "--graph", "-", "--format", "json", "--socket",
                                   "/nonexistent/rm.sock"], input=prof.stdout, capture_output=True,
                                  text=True, timeout=60)
        finally:
            ops.stop()
    assert plan.returncode == 0, plan.stderr
    out = json.loads(plan.stdout)
    assert set(out["placement"]) == set(DUTIES)
    assert json.loads(prof.stdout)["profile"]["pmu"]["available"] in (True, False)


def test_profile_errors(capsys):
    from cod.cli.main import main
    assert main(["profile", "--pid", "999999999", "--seconds", "0.1"]) == 2  # ExitStatus.BAD_INPUT: a pid on the command line that names nothing
    assert "process 999999999: no such process" in capsys.readouterr().err
    assert main(["profile", "--pid", str(os.getpid()), "--seconds", "0"]) == 2
    assert "--seconds: must be > 0" in capsys.readouterr().err
    assert main(["profile", "--pid", str(os.getpid()), "--seconds", "0.1", "--threads", "("]) == 2
    assert "--threads: not a regular expression" in capsys.readouterr().err


def deploy_plan_usage(socket: Path) -> dict:
    g = json.dumps({"operators": [{"id": "a", "cpu_util": 0.5, "mem_bw": 1e9}]})
    plan = subprocess.run([*COD, "deploy-plan", "--graph", "-", "--format", "json", "--socket", str(socket)],
                          input=g, capture_output=True, text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    [usage] = json.loads(plan.stdout)["numa_nodes"]["usage"]
    return usage


def test_bandwidth_is_stored_in_a_running_rm_and_read_by_deploy_plan(tmp_path):
    daemon = start_daemon(tmp_path, "--no-enforce", "--no-busy-detect", "--state-dir", str(tmp_path / "state"))
    try:
        # A short run whose figure is only checked to be stored: no bench lock needed.
        run = subprocess.run([*COD, "bandwidth", "--socket", str(daemon.path), "--size-mib", "4",
                              "--iterations", "2", "--format", "json"],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        out = json.loads(run.stdout)
        assert out["nodes"] and all(n["checked"] and n["bandwidth_bytes_per_s"] > 0 for n in out["nodes"])
        assert out["stored"].startswith("stored as system facts"), out["stored"]
        with Client(str(daemon.path), reconnect=False) as c:
            got = {r["N"]: r["B"] for r in c.execute_query("numa_bandwidth(N, B)")}
        assert got == {n["node"]: int(n["bandwidth_bytes_per_s"]) for n in out["nodes"]}
        # The node x node matrix: on this one-node host 1 x 1, its one cell the local figure.
        nodes = [n["node"] for n in out["nodes"]]
        assert sorted((m["node"], m["memory_node"]) for m in out["matrix"]) == [(a, b) for a in nodes for b in nodes]
        with Client(str(daemon.path), reconnect=False) as c:
            cells = {(r["C"], r["M"]): r["B"] for r in c.execute_query("memory_bandwidth(C, M, B)")}
        assert cells == {(m["node"], m["memory_node"]): int(m["bandwidth_bytes_per_s"]) for m in out["matrix"]}
        assert all(b > 0 for b in cells.values())
        # Measuring again replaces the fact rather than adding a second one.
        again = subprocess.run([*COD, "bandwidth", "--socket", str(daemon.path), "--size-mib", "4",
                                "--iterations", "2"], capture_output=True, text=True, timeout=120)
        assert again.returncode == 0, again.stderr
        with Client(str(daemon.path), reconnect=False) as c:
            assert len(c.execute_query("numa_bandwidth(N, B)")) == len(out["nodes"])
            assert len(c.execute_query("memory_bandwidth(C, M, B)")) == len(out["matrix"])
            got = {r["N"]: r["B"] for r in c.execute_query("numa_bandwidth(N, B)")}
        usage = deploy_plan_usage(daemon.path)
        assert usage["bandwidth_source"] == "rm" and usage["bandwidth"] == got[usage["node"]]
    finally:
        daemon.stop()


def test_deploy_plan_ignores_a_daemon_planning_for_another_machine(tmp_path):
    daemon = start_daemon(tmp_path, "--machine", "magnycours")  # it has numa_bandwidth facts of its own
    try:
        usage = deploy_plan_usage(daemon.path)
    finally:
        daemon.stop()
    assert usage["bandwidth_source"] == "unknown"


def test_bandwidth_without_a_daemon_just_prints(tmp_path):
    run = subprocess.run([*COD, "bandwidth", "--socket", str(tmp_path / "none.sock"), "--size-mib", "2",
                          "--iterations", "2"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "GB/s triad" in run.stdout and "not stored: no COD daemon answers" in run.stdout

"""CSCS under COD end to end (issue 15, phase 2): a real enforcing daemon, the engine registered
through libcod, an unregistered CPU stressor that arrives and leaves, the upcalls, the tuple
redistribution planned by the SKB, the acks, and every answer of every batch checked against
the Python reference scan.  Plus `make demo`'s script, run for real."""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cod.client import Client
from cod.rm.config import RMConfig
from helpers.paths import REPO
from helpers import cscs_ref
from helpers.procs import needs_root, spawn, spinner_cmd  # noqa: F401 (fixtures)
from helpers.waiting import wait_until
from test_cscs_engine import ALLOWED, LiveEngine, cpulist, pinned_threads, two_cpus
from test_integration_rm import enforcing_daemon, no_cgroup_left_behind  # noqa: F401 (autouse fixture)
from helpers.rm_support import start_daemon

NAME = "cscs-test"


@pytest.fixture(scope="module")
def builds() -> dict[str, Path]:
    return {"release": cscs_ref.build("cscs"), "asan": cscs_ref.build("build/cscs_asan")}


def batch_lines(lines: list[str]) -> int:
    return sum(1 for line in lines if line.split() and line.split()[0].isdigit())


def count(lines: list[str], needle: str) -> int:
    return sum(needle in line for line in lines)


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


@two_cpus
@pytest.mark.parametrize("flavour, mode", [
    ("release", "cpuset"), ("release", "affinity"), ("asan", "cpuset"),
])
def test_cscs_follows_the_rm_and_every_answer_stays_right(tmp_path, builds, spawn, flavour, mode):
    if mode == "cpuset" and os.geteuid() != 0:
        pytest.skip("the cpuset backend needs root")
    a, b = ALLOWED[0], ALLOWED[1]
    both = cpulist([a, b])
    tuples, seed = 2001, 5
    results = tmp_path / "results.txt"
    # The deployment's grace (revoke_deadline_s, 2 s), not the helper's 0.3 s: the margin below is
    # what this test checks, and beside other work CSCS took 314-380 ms to move its tuples and ack
    # (load average 10, both builds), past a 0.3 s deadline though nothing was wrong.
    d, _ = enforcing_daemon(tmp_path, mode, revoke_deadline_s=RMConfig.revoke_deadline_s)
    engine = None
    try:
        engine = LiveEngine([
            str(builds[flavour]), "run", "--tuples", str(tuples), "--seed", str(seed), "--seconds", "300",
            "--sla-ms", "1000", "--batch-queries", "16", "--batch-updates", "4", "--think-ms", "10",
            "--socket", str(d.path), "--name", NAME, "--results", str(results)])
        pid = engine.proc.pid
        engine.wait_for(lambda lines: batch_lines(lines) >= 10)
        out = "".join(engine.lines)
        assert f"# cod: registered as task {NAME}" in out and "cores 0,1" in out.replace(f"{a},{b}", "0,1"), out
        # Registered as Listing 1 says: its properties, facts and derived requirements.
        with Client(str(d.path), app="observer") as c:
            [task] = [t for t in c.list_tasks() if t["task"] == NAME]
            props = task["properties"]
            assert props["bound"] == "cpu" and set(props["sensitive"]) == {"cache", "numa"}
            assert props["max_cores"] == len(ALLOWED)
            assert "dbos_cost_function" in props["min_cores"]["query"]
        # One scan thread pinned to each core (the other threads have both).
        wait_until(lambda: sorted(pinned_threads(pid)) == [a, b], 10, f"scan threads on {both}")

        # A stressor nobody registered arrives: the RM keeps a CPU for it and takes it from CSCS.
        hog = spawn(1, "spin")
        engine.wait_for(lambda lines: count(lines, "# cod: acked epoch") >= 1, 30)
        engine.wait_for(lambda lines: count(lines, "# reconfigure") >= 1, 10)
        moved = next(line for line in engine.lines if "# reconfigure" in line)
        m = re.search(r"cores (\S+) -> (\S+): (\d+) tuples moved", moved)
        assert m and m.group(1) == both and m.group(2) in (str(a), str(b)), moved
        left = int(m.group(2))
        assert int(m.group(3)) in (tuples // 2, tuples - tuples // 2)
        ack = next(line for line in engine.lines if "# cod: acked epoch" in line)
        margin = re.search(r"([\d.-]+) ms before the RM's deadline", ack)
        assert margin and float(margin.group(1)) > 0, ack
        # One scan thread left, on the core CSCS kept; the stressor on the other.
        wait_until(lambda: set(pinned_threads(pid)) == {left} and threads_of(pid) == 4, 10,
                   f"one scan thread on CPU {left}")
        wait_until(lambda: set(os.sched_getaffinity(hog.pid)) == {a, b} - {left}, 10, "the stressor confined")
        engine.wait_for(lambda lines: engine.batches_after("# reconfigure") >= 10, 30)

        # It leaves: CSCS gets the core back and scans on both again.
        hog.stop()
        engine.wait_for(lambda lines: count(lines, "# reconfigure") >= 2, 30)
        back = [line for line in engine.lines if "# reconfigure" in line][1]
        assert f"cores {left} -> {both}" in back, back
        # Each scan thread on its own core again, whatever the RM's re-pin did meanwhile.
        wait_until(lambda: sorted(pinned_threads(pid)) == [a, b] and threads_of(pid) == 5, 10,
                   f"scan threads on {both} again")
        engine.wait_for(lambda lines: engine.batches_after("# reconfigure") >= 10, 30)
        engine.proc.send_signal(signal.SIGTERM)
        assert engine.proc.wait(60) == 0, engine.proc.stderr.read()
    finally:
        if engine is not None:
            engine.stop()
        d.stop()
    out = "".join(engine.lines)
    assert "# stopped by a signal" in out and "refused" not in out and "# cod: lost" not in out, out
    assert count(engine.lines, "# cod: redistribution for epoch") == 2, out
    log = d.log_text()
    assert "did not release its CPUs in time" not in log
    assert f"task {NAME} (pid {pid}) left: deregistered" in log
    # Every answer of every batch, before, during and after, as the reference scan gives it.
    batches = cscs_ref.parse_results(results)
    checked = cscs_ref.check_answers(cscs_ref.generate_table(seed, tuples), batches)
    assert checked == sum(len(x.queries) for x in batches) > 0
    assert sum(len(q.answer) for x in batches for q in x.queries) > checked // 2
    seen = [x.cpus for x in batches]
    first_one = seen.index(str(left))
    last_one = len(seen) - 1 - seen[::-1].index(str(left))
    assert set(seen[:first_one]) == {both} and set(seen[first_one:last_one + 1]) == {str(left)}
    assert set(seen[last_one + 1:]) == {both} and len(seen) - last_one > 10


def test_an_sla_this_machine_cannot_meet_is_said(tmp_path, builds):
    """With the paper's constants, a 1 ms SLA for 30,000 tuples asks for 19 cores: CSCS registers
    with all it may use and says the SLA will be missed; a 1 s SLA asks for one."""
    d = start_daemon(tmp_path, "--no-enforce")
    try:
        runs = {sla: subprocess.run([str(builds["release"]), "run", "--tuples", "30000", "--batches", "2",
                                     "--sla-ms", sla, "--socket", str(d.path)], capture_output=True, text=True,
                                    timeout=60) for sla in ("1", "1000")}
    finally:
        d.stop()
    for sla, proc in runs.items():
        assert proc.returncode == 0, proc.stderr
        m = re.search(rf"# cod: deployment derived by the SKB \(Listing 3\) for an SLA of {sla} ms: (\d+) cores",
                      proc.stdout)
        assert m, proc.stdout
        # Section 4.4 with the paper's constants, Listing 3's rounding (batches of 2048 + 512).
        assert int(m.group(1)) == max(1, math.ceil(30000 * (0.85 * 2560 + 106.37) / (3750000 * int(sla))))
        assert ("the SLA will be missed" in proc.stdout) == (sla == "1")
    assert f"cores {cpulist(ALLOWED)}" in runs["1"].stdout


@two_cpus
def test_max_cores_caps_what_it_asks_for(tmp_path, builds):
    """--max-cores 1 on a machine of more: registered with max_cores 1, given one core, and the
    1 ms SLA (19 cores by the paper's constants) said to be missed."""
    d = start_daemon(tmp_path, "--no-enforce")
    try:
        engine = LiveEngine([str(builds["release"]), "run", "--tuples", "30000", "--seconds", "60", "--sla-ms", "1",
                             "--max-cores", "1", "--think-ms", "10", "--socket", str(d.path), "--name", NAME])
        try:
            engine.wait_for(lambda lines: batch_lines(lines) >= 1, 60)
            with Client(str(d.path), app="observer") as c:
                [task] = [t for t in c.list_tasks() if t["task"] == NAME]
        finally:
            engine.stop()
    finally:
        d.stop()
    out = "".join(engine.lines)
    assert task["properties"]["max_cores"] == 1 and len(task["cores"]) == 1, task
    assert "the SLA will be missed" in out, out


def test_a_refused_registration_is_an_error_with_the_daemons_words(tmp_path, builds):
    d = start_daemon(tmp_path, "--no-enforce")
    try:
        proc = subprocess.run([str(builds["release"]), "run", "--tuples", "2001", "--batches", "1", "--sla-ms",
                               "100", "--cost-fn", str(tmp_path / "missing.pl"), "--socket", str(d.path)],
                              capture_output=True, text=True, timeout=60)
        bad = tmp_path / "bad.pl"
        bad.write_text("db_cost_fn(X, Y, Z, N) :- N is X +.\n")
        syntax = subprocess.run([str(builds["release"]), "run", "--tuples", "2001", "--batches", "1", "--sla-ms",
                                 "100", "--cost-fn", str(bad), "--socket", str(d.path)],
                                capture_output=True, text=True, timeout=60)
    finally:
        d.stop()
    assert proc.returncode == 1 and "missing.pl" in proc.stderr
    assert syntax.returncode == 1 and "COD: registering the task" in syntax.stderr, syntax.stderr


@two_cpus
def test_make_demo_runs_the_whole_story(tmp_path):
    """clients/cscs/demo.py, shortened: every step is printed and everything is cleaned up."""
    proc = subprocess.run([sys.executable, str(REPO / "clients" / "cscs" / "demo.py"), "--tuples", "600k",
                           "--phase-seconds", "3"], capture_output=True, text=True, timeout=240)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    for step in ["the RM is up", "cod: registered as task cscs", "a CPU stressor starts",
                 "the RM detects it as an unregistered busy process", "the RM keeps CPU",
                 "CSCS receives the allocation upcall", "asks the SKB for the tuple redistribution",
                 "CSCS moves", "CSCS acks the epoch", "the stressor stops", "back to CSCS",
                 "== batch response times", "== cleaned up"]:
        assert step in out, f"{step!r} missing:\n{out}"
    assert re.search(r"cgroup parent cod_demo_\d+ removed", out), out
    assert re.search(r"upcall_to_ack_ms [\d.]+", out), out
    # Nothing it started is left: its temporary directory and its cgroup parent are gone.
    tmp = re.search(r"(\S+cod-demo-\S+) removed", out).group(1)
    parent = re.search(r"cgroup parent (cod_demo_\d+) removed", out).group(1)
    assert not Path(tmp).exists()
    assert not any((Path(root) / parent).exists() for root in ("/sys/fs/cgroup/cpuset", "/sys/fs/cgroup"))

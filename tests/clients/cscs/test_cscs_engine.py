"""The CSCS engine end to end (clients/cscs): every answer of every batch
against a plain reference scan in Python, across changes of cores with
redistribution, and its command line's handling of bad input.

The changes of cores come from the engine's test hook (--cores-schedule,
--control); under COD they come from upcalls through the same runtime API.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from cod.facts import discover
from cod.facts.cpulist import format_cpulist
from cod.skb import SKB
from helpers import cscs_ref

ALLOWED = sorted(os.sched_getaffinity(0))
two_cpus = pytest.mark.skipif(len(ALLOWED) < 2, reason="needs two CPUs to change cores")


@pytest.fixture(scope="module")
def cscs() -> Path:
    return cscs_ref.build("cscs")


@pytest.fixture(scope="module")
def cscs_asan() -> Path:
    return cscs_ref.build("build/cscs_asan")


def run(binary: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), "run", *args], capture_output=True, text=True, timeout=timeout)


def cpulist(cpus: list[int]) -> str:
    """As the engine prints CPU lists: ascending, runs as ranges."""
    return format_cpulist(cpus)


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def check_run(tmp_path: Path, binary: Path, tuples: int, seed: int, *args: str) -> list[cscs_ref.Batch]:
    results, table_csv = tmp_path / "results.txt", tmp_path / "batches.csv"
    proc = run(binary, "--tuples", str(tuples), "--seed", str(seed), "--results", str(results),
               "--csv", str(table_csv), *args)
    assert proc.returncode == 0, proc.stderr
    batches = cscs_ref.parse_results(results)
    checked = cscs_ref.check_answers(cscs_ref.generate_table(seed, tuples), batches)
    assert checked == sum(len(b.queries) for b in batches) > 0
    # Queries found something: the check is not vacuous.
    assert sum(len(q.answer) for b in batches for q in b.queries) > checked // 2
    assert len(read_csv(table_csv)) == len(batches)
    return batches


@two_cpus
@pytest.mark.parametrize("flavour", ["release", "asan"])
def test_answers_match_reference_across_core_changes(tmp_path: Path, flavour: str, request) -> None:
    binary = request.getfixturevalue("cscs" if flavour == "release" else "cscs_asan")
    a, b = ALLOWED[0], ALLOWED[1]
    both = cpulist([a, b])
    schedule = f"#3={b};#5={both};#7={a};#9=plan {b}:1500 moves {a}>{b}:1500;#11={both}"
    batches = check_run(tmp_path, binary, 1500, 7, "--batches", "12", "--batch-queries", "64",
                        "--batch-updates", "16", "--cores", both, "--cores-schedule", schedule)
    assert [x.cpus for x in batches] == [both, both, str(b), str(b), both, both, str(a), str(a),
                                         str(b), str(b), both, both]


def test_answers_match_reference_on_one_core_with_many_updates(tmp_path: Path, cscs: Path) -> None:
    check_run(tmp_path, cscs, 997, 3, "--batches", "6", "--batch-queries", "40", "--batch-updates",
              "200", "--cores", str(ALLOWED[0]))


def test_naive_runs_one_scan_thread_on_every_core(tmp_path: Path, cscs: Path) -> None:
    out = tmp_path / "naive.csv"
    proc = run(cscs, "--tuples", "2000", "--batches", "3", "--naive", "--csv", str(out),
               "--batch-queries", "8", "--batch-updates", "2")
    assert proc.returncode == 0, proc.stderr
    assert "naive" in proc.stdout
    assert {int(r["cores"]) for r in read_csv(out)} == {len(ALLOWED)}


def pinned_threads(pid: int) -> list[int]:
    """The CPU of every thread of `pid` that is pinned to exactly one."""
    cpus = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                allowed = line.split()[1]
                if allowed.isdigit():
                    cpus.append(int(allowed))
    return cpus


def machine_skb() -> SKB:
    skb = SKB()
    skb.load_machine(discover.from_args())
    skb.add_facts("cscs", ["db_tsize(315)"])
    return skb


def plan_line(answer: dict) -> str:
    """The engine's text form of a cscs_redistribute/5 answer."""
    parts = ",".join(f"{p['args'][0]}:{p['args'][1]}" for p in answer["P"])
    moves = ",".join(f"{m['args'][0]}>{m['args'][1]}:{m['args'][2]}" for m in answer["M"])
    return f"plan {parts}" + (f" moves {moves}" if moves else "")


class LiveEngine:
    """`cscs run` in the background; its stdout read as it comes."""

    def __init__(self, args: list[str]):
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._cv = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._cv:
                self.lines.append(line)
                self._cv.notify_all()

    def wait_for(self, pred, timeout: float = 30) -> None:
        """Until pred(lines) holds (or fail after timeout)."""
        with self._cv:
            assert self._cv.wait_for(lambda: pred(self.lines) or self.proc.poll() is not None, timeout), \
                "".join(self.lines)
        assert pred(self.lines), "".join(self.lines)

    def batches_after(self, marker: str) -> int:
        """Batch lines printed after the last line containing marker."""
        idx = max((i for i, l in enumerate(self.lines) if marker in l), default=None)
        if idx is None:
            return 0
        return sum(1 for l in self.lines[idx + 1:] if l.split() and l.split()[0].isdigit())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def wait_pinned(pid: int, cpus: list[int], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while sorted(pinned_threads(pid)) != cpus:
        assert time.monotonic() < deadline, (pinned_threads(pid), cpus)
        time.sleep(0.05)


@two_cpus
def test_redistribution_planned_by_the_stored_procedure(tmp_path: Path, cscs: Path) -> None:
    """The plan comes from the SKB's cscs_redistribute/5 on this machine's
    facts, reaches the engine through its control FIFO while it runs, and
    every answer before and after still matches the reference."""
    a, b = ALLOWED[0], ALLOWED[1]
    tuples, seed = 2001, 11
    fifo = tmp_path / "control"
    os.mkfifo(fifo)
    results = tmp_path / "results.txt"
    engine = LiveEngine(
        [str(cscs), "run", "--tuples", str(tuples), "--seed", str(seed), "--seconds", "120",
         "--batch-queries", "64", "--batch-updates", "16", "--cores", cpulist([a, b]),
         "--control", str(fifo), "--results", str(results)])
    try:
        with machine_skb() as skb, open(fifo, "w") as ctl:
            # The engine split the table evenly: 1001 on a, 1000 on b.
            [lose_a] = skb.execute_query("cscs", f"cscs_redistribute([{a}-1001, {b}-1000], [{b}], S, P, M)")
            [back] = skb.execute_query("cscs", f"cscs_redistribute([{b}-2001], [{a}, {b}], S, P, M)")
            assert lose_a["S"] == 0 and back["S"] == 0
            assert lose_a["M"] == [{"functor": "move", "args": [a, b, 1001]}]
            # One scan thread pinned to each of its cores, then to b alone.
            wait_pinned(engine.proc.pid, [a, b])
            for k, (line, cores) in enumerate(((plan_line(lose_a), [b]), (plan_line(back), [a, b]))):
                # a few batches on the current cores first
                marker = "# reconfigure" if k else "tput_req/s"
                engine.wait_for(lambda lines: engine.batches_after(marker) >= 3)
                ctl.write(line + "\n")
                ctl.flush()
                engine.wait_for(lambda lines: sum("# reconfigure" in l for l in lines) == k + 1)
                wait_pinned(engine.proc.pid, cores)
            engine.wait_for(lambda lines: engine.batches_after("# reconfigure") >= 3)
            ctl.write("stop\n")
            ctl.flush()
        assert engine.proc.wait(60) == 0, engine.proc.stderr.read()
    finally:
        engine.stop()
    out = "".join(engine.lines)
    assert out.count("# reconfigure") == 2 and "refused" not in out, out
    batches = cscs_ref.parse_results(results)
    cscs_ref.check_answers(cscs_ref.generate_table(seed, tuples), batches)
    seen = [x.cpus for x in batches]
    assert str(b) in seen and seen[-1] == cpulist([a, b]), seen


def test_refused_plan_changes_nothing(tmp_path: Path, cscs: Path) -> None:
    proc = run(cscs, "--tuples", "1000", "--batches", "3", "--batch-queries", "8", "--batch-updates", "2",
               "--cores", str(ALLOWED[0]), "--cores-schedule", f"#2=plan {ALLOWED[0]}:999",
               "--results", str(tmp_path / "r.txt"))
    assert proc.returncode == 0, proc.stderr
    assert "refused" in proc.stdout and "999" in proc.stdout
    batches = cscs_ref.parse_results(tmp_path / "r.txt")
    cscs_ref.check_answers(cscs_ref.generate_table(1, 1000), batches)
    assert {x.cpus for x in batches} == {str(ALLOWED[0])}


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "needs --tuples"),
        (["--tuples", "0", "--batches", "1"], "--tuples '0'"),
        (["--tuples", "10x", "--batches", "1"], "--tuples '10x'"),
        (["--tuples", "100"], "--seconds S or --batches B"),
        (["--tuples", "100", "--seconds", "-1"], "--seconds '-1'"),
        (["--tuples", "100", "--batches", "1", "--cores", "1-0"], "bad CPU list"),
        (["--tuples", "100", "--batches", "1", "--naive", "--cores", "0"], "--naive"),
        (["--tuples", "100", "--batches", "1", "--cores-schedule", "#0=0"], "schedule item"),
        (["--tuples", "100", "--batches", "1", "--batch-queries", "0", "--batch-updates", "0"], "at least one"),
        (["--tuples", "100", "--batches", "1", "--cost-fn", "x.pl"], "needs --socket"),
        (["--tuples", "100", "--batches", "1", "--name", "x"], "needs --socket"),
        (["--tuples", "100", "--batches", "1", "--socket", "s", "--cores", "0"], "the cores come from COD"),
        (["--tuples", "100", "--batches", "1", "--frobnicate"], "unrecognized option"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(cscs: Path, args: list[str], message: str) -> None:
    proc = run(cscs, *args)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert proc.stdout == ""


def test_cores_not_allowed_are_refused(cscs: Path) -> None:
    proc = run(cscs, "--tuples", "100", "--batches", "1", "--cores", "4000")
    assert proc.returncode == 1 and "CPU 4000 is not one this process may run on" in proc.stderr


def test_without_libcod_socket_is_refused_clearly() -> None:
    stub = cscs_ref.build("build/cscs_stub")
    proc = run(stub, "--tuples", "100", "--batches", "1", "--socket", "/nonexistent/cod.sock")
    assert proc.returncode == 1 and "built without libcod" in proc.stderr


def test_an_rm_that_is_not_there_is_reported_clearly(cscs: Path) -> None:
    proc = run(cscs, "--tuples", "100", "--batches", "1", "--socket", "/nonexistent/cod.sock")
    assert proc.returncode == 1 and "cannot connect to the RM at /nonexistent/cod.sock" in proc.stderr, proc.stderr


def test_control_path_must_be_a_fifo(tmp_path: Path, cscs: Path) -> None:
    (tmp_path / "plain").write_text("")
    proc = run(cscs, "--tuples", "100", "--batches", "1", "--control", str(tmp_path / "plain"))
    assert proc.returncode == 1 and "not a FIFO" in proc.stderr


def test_calibrate_writes_a_cost_function_the_skb_uses(tmp_path: Path, cscs: Path) -> None:
    out = tmp_path / "cost.pl"
    proc = subprocess.run(
        [str(cscs), "calibrate", "--cores", "1", "--tuples-per-core", "20k,80k", "--requests", "40,640",
         "--batches", "3", "--out", str(out)],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    fit = json.loads(proc.stdout.strip().splitlines()[-1])
    assert fit["points"] == 4 and fit["a"] >= 0 and fit["b"] >= 0 and fit["rms_rel_err"] >= 0
    assert "Fit error" in out.read_text()
    with machine_skb() as skb:
        skb.add_facts("cscs", ["db_ntuple(1000000)", "db_nquery(2048)", "db_nupdate(512)", "db_rtime(1000)"])
        skb.add_procedure("cscs", out.read_text())
        [consts] = skb.execute_query("cscs", "db_cost_constants(A, B, C)")
        assert consts["A"] == pytest.approx(fit["a"]) and consts["C"] == 3750000
        [answer] = skb.execute_query("cscs", "dbos_cost_function(S, N, P)")
        assert answer["N"] >= 1


def test_calibrate_refuses_more_cores_than_allowed(cscs: Path) -> None:
    proc = subprocess.run([str(cscs), "calibrate", "--cores", str(len(ALLOWED) + 1)],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "may use 1 to" in proc.stderr

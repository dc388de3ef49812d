#!/usr/bin/env python3
"""`make demo`: the whole COD story on this machine, with CSCS.

1. CSCS is built (with libcod) and calibrated on this machine (its cost function).
2. The Resource Manager starts, with its own socket, state and cgroup parent in a temporary
   directory, watching only the processes this demo starts.
3. CSCS registers (the paper's Listing 1: system and application facts, its cost function,
   requirements derived by the SKB from the deployment procedure of Listing 3) and runs its
   closed loop of batches under an SLA.
4. A CPU stressor that nobody registered starts.  The RM detects it, keeps a CPU for it and
   takes that CPU from CSCS: CSCS gets the allocation upcall, asks the SKB for the tuple
   redistribution (cscs_redistribute/5), moves its tuples, stops a scan thread, and acks.
5. The stressor stops; CSCS gets its CPU back the same way.
6. Each step is printed with its time, then the batch response times before, with and after
   the stressor, and everything the demo started is stopped and removed.

    .venv/bin/python clients/cscs/demo.py [--tuples 6M] [--sla-ms 300] [--phase-seconds 6]
"""

from __future__ import annotations

import argparse
import os
import queue
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CSCS = HERE / "cscs"
NAME = "cscs"
STRESSOR = ("import ctypes\n"
            "ctypes.CDLL(None).prctl(15, b'cpu-stressor', 0, 0, 0)\n"
            "while True:\n    pass\n")


def say(t0: float, text: str, at: float | None = None) -> None:
    print(f"[{(at if at is not None else time.time()) - t0:7.3f} s] {text}", flush=True)


@dataclass
class Batch:
    seq: int
    wall: float  # when its line was read (the batch's answer is merged just before)
    cores: int
    rt_ms: float


@dataclass
class CscsOutput:
    """What `cscs run` prints, each line with the time it was read."""
    lines: "queue.Queue[tuple[float, str]]" = field(default_factory=queue.Queue)
    batches: list[Batch] = field(default_factory=list)
    notes: list[tuple[float, str]] = field(default_factory=list)
    all: list[str] = field(default_factory=list)

    def read(self, stream) -> None:
        for line in stream:
            now = time.time()
            line = line.rstrip("\n")
            self.all.append(line)
            parts = line.split()
            if len(parts) == 7 and parts[0].isdigit():
                self.batches.append(Batch(int(parts[0]), now, int(parts[2]), float(parts[3])))
            elif line.startswith("#"):
                self.notes.append((now, line))
                self.lines.put((now, line))
        self.lines.put((time.time(), ""))  # end of output


def wall_of(line: str) -> float | None:
    m = re.search(r"at wall (\d+\.\d+)", line)
    return float(m.group(1)) if m else None


def start_rm(tmp: Path, parent: str) -> tuple[subprocess.Popen, Path]:
    sock = tmp / "rm.sock"
    log = open(tmp / "rm.log", "wb")
    rm = subprocess.Popen([sys.executable, "-m", "cod.cli.main", "rm", "--socket", str(sock),
                           "--state-dir", str(tmp / "state"), "--cgroup-parent", parent,
                           "--revoke-deadline", "0.5", "--busy-scope", f"descendants:{os.getpid()}"],
                          stdout=log, stderr=log)
    log.close()
    deadline = time.monotonic() + 30
    while True:
        if rm.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"demo: the RM did not start:\n{(tmp / 'rm.log').read_text()}")
        try:
            with socket.socket(socket.AF_UNIX) as probe:
                probe.connect(str(sock))
            return rm, sock
        except OSError:
            time.sleep(0.05)


def summary(name: str, batches: list[Batch], sla_ms: float) -> str:
    if not batches:
        return f"  {name:<33} no batch"
    rts = sorted(b.rt_ms for b in batches)
    p95 = rts[min(len(rts) - 1, int(0.95 * len(rts)))]
    cores = sorted({b.cores for b in batches})
    met = sum(1 for r in rts if r <= sla_ms)
    return (f"  {name:<33} {len(rts):4d} batches on {'/'.join(map(str, cores))} cores: mean {statistics.mean(rts):7.1f} ms,"
            f" p50 {statistics.median(rts):7.1f}, p95 {p95:7.1f}, max {rts[-1]:7.1f};"
            f" SLA {sla_ms:.0f} ms met by {met}/{len(rts)}")


def wait_note(out: CscsOutput, pattern: str, timeout: float) -> tuple[float, str] | None:
    """The next '#' line of cscs matching pattern (earlier ones are consumed)."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            now, line = out.lines.get(timeout=left)
        except queue.Empty:
            return None
        if line == "":
            return None
        if re.search(pattern, line):
            return now, line
    return None


def react(t0: float, out: CscsOutput, what: str, started: float,
          extra: list[tuple[float, str]] | None = None) -> dict[str, float]:
    """Follow CSCS through one upcall: upcall, redistribution, move, ack, printed in the order they
    happened with `extra` steps.  Returns the timings."""
    got: dict[str, float] = {}
    steps: list[tuple[float, str]] = list(extra or [])

    def say(_t0: float, text: str, at: float | None = None) -> None:  # noqa: F811 (collected, printed sorted)
        steps.append((at if at is not None else time.time(), text))

    up = wait_note(out, r"^# cod: upcall epoch", 20)
    if not up:
        for at, text in sorted(steps, key=lambda x: x[0]):
            print(f"[{at - t0:7.3f} s] {text}", flush=True)
        print(f"no upcall reached CSCS after {what}", flush=True)
        return got
    t_up = wall_of(up[1]) or up[0]
    got["upcall_s"] = t_up - started
    say(t0, f"CSCS receives the allocation upcall ({t_up - started:.3f} s after {what}): "
            f"{up[1].split(': ', 1)[1]}", t_up)
    # The engine acks as soon as the plan is applied, then reports the reconfiguration.
    notes: dict[str, tuple[float, str]] = {}
    patterns = {"red": r"^# cod: redistribution", "ack": r"^# cod: (acked|ack of) epoch|not acknowledged",
                "move": r"^# reconfigure before batch"}
    deadline = time.monotonic() + 20
    while len(notes) < len(patterns) and (left := deadline - time.monotonic()) > 0:
        note = wait_note(out, "|".join(f"(?:{p})" for p in patterns.values()), left)
        if not note:
            break
        for key, pattern in patterns.items():
            if re.search(pattern, note[1]):
                notes[key] = note
    if "red" in notes:
        m = re.search(r"in ([\d.]+) ms \(([\d.]+) ms after the upcall\): parts (\S+), (\d+) moves", notes["red"][1])
        if m:
            got["redistribute_ms"] = float(m.group(1))
            say(t0, f"before its next scan phase CSCS asks the SKB for the tuple redistribution "
                    f"(cscs_redistribute/5): {m.group(1)} ms, {m.group(2)} ms after the upcall (the scan "
                    f"phase in progress finished first); new partitions {m.group(3)} (CPU:tuples), "
                    f"{m.group(4)} moves", notes["red"][0])
    if "move" in notes:
        m = re.search(r"cores (\S+) -> (\S+): (\d+) tuples moved \((\d+) chunks handed over whole\), "
                      r"(\d+) scan threads started, (\d+) stopped, ([\d.]+) ms", notes["move"][1])
        if m:
            got["move_ms"] = float(m.group(7))
            say(t0, f"CSCS moves {int(m.group(3)):,} tuples ({m.group(4)} chunks handed over whole), "
                    f"starts {m.group(5)} and stops {m.group(6)} scan threads: cores {m.group(1)} -> {m.group(2)} "
                    f"in {m.group(7)} ms", notes["move"][0])
        else:
            say(t0, notes["move"][1].lstrip("# "), notes["move"][0])
    if "ack" in notes:
        line = notes["ack"][1]
        m = re.search(r"([\d.]+) ms after the upcall(?:, ([\d.-]+) ms before the RM's deadline)?", line)
        if m:
            got["upcall_to_ack_ms"] = float(m.group(1))
            margin = f"; {m.group(2)} ms before the RM's deadline" if m.group(2) else " (nothing was taken away: no deadline)"
            if m.group(2):
                got["deadline_margin_ms"] = float(m.group(2))
            say(t0, f"CSCS acks the epoch: {m.group(1)} ms from upcall to ack{margin}", wall_of(line) or notes["ack"][0])
        else:
            say(t0, line.lstrip("# "), notes["ack"][0])
    if "move" in notes:
        got["reconfigured_at"] = notes["move"][0]
    for at, text in sorted(steps, key=lambda x: x[0]):
        print(f"[{at - t0:7.3f} s] {text}", flush=True)
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tuples", default="6M", help="table size (default 6M: 1.9 GB)")
    ap.add_argument("--sla-ms", type=float, default=300.0, help="CSCS's response-time SLA (default 300)")
    ap.add_argument("--phase-seconds", type=float, default=6.0,
                    help="length of each phase: before, with and after the stressor (default 6)")
    args = ap.parse_args()
    t0 = time.time()
    print("== COD demo: CSCS under the Resource Manager, and a CPU stressor nobody registered", flush=True)
    subprocess.run(["make", "-s", "-C", str(HERE), "cscs"], check=True)
    help_text = subprocess.run([str(CSCS), "run", "--tuples", "1", "--batches", "1", "--socket",
                                "/nonexistent"], capture_output=True, text=True).stderr
    if "built without libcod" in help_text:
        print("demo: cscs was built without libcod (install libjansson-dev: make setup)", file=sys.stderr)
        return 1
    ncpus = len(os.sched_getaffinity(0))
    say(t0, f"cscs built; this machine: {ncpus} CPUs, load average "
            f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if ncpus < 2:
        print("demo: needs at least 2 CPUs (one for the stressor, one for CSCS)", file=sys.stderr)
        return 1
    demo = Demo(t0, args)
    rc = 1
    try:
        rc = demo.run()
    finally:
        if demo.clean_up():
            rc = 1
    return rc


class Demo:
    """Steps 1-6 of the story, and what they started (stopped by `clean_up`, and nothing else)."""

    def __init__(self, t0: float, args: argparse.Namespace) -> None:
        self.t0 = t0
        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="cod-demo-"))
        self.parent = f"cod_demo_{os.getpid()}"
        self.rm: subprocess.Popen | None = None
        self.cscs: subprocess.Popen | None = None
        self.stressor: subprocess.Popen | None = None
        self.observer: Any = None  # cod.client.Client, imported once the RM is up
        self.events: "queue.Queue[tuple[float, str, dict]]" = queue.Queue()
        self.out = CscsOutput()
        self.timings: dict[str, dict[str, float]] = {}

    def run(self) -> int:
        cost_fn = self.calibrate()
        if cost_fn is None:
            return 1
        sock = self.start_rm()
        if not self.start_cscs(cost_fn, sock):
            return 1
        t_stress = self.stressor_arrives()
        t_gone = self.stressor_stops(t_stress)
        return self.report(t_stress, t_gone)

    def calibrate(self) -> Path | None:
        """1. Calibration: the cost function of Section 4.4 with this machine's constants."""
        cost_fn = self.tmp / "cost_fn.pl"
        cal = subprocess.run([str(CSCS), "calibrate", "--tuples-per-core", "250k,1M", "--requests", "640,2560",
                              "--batches", "3", "--out", str(cost_fn)], capture_output=True, text=True)
        if cal.returncode != 0:
            print(cal.stderr, file=sys.stderr)
            return None
        fit = cal.stdout.strip().splitlines()[-1]
        say(self.t0, f"calibrated CSCS on this machine: {fit}")
        return cost_fn

    def start_rm(self) -> Path:
        """2. The RM, and an observer client following the stressor's facts and CSCS's allocation."""
        t_rm = time.time()
        self.rm, sock = start_rm(self.tmp, self.parent)
        from cod.client import Client

        events = self.events
        self.observer = Client(str(sock), app="demo-observer")
        info = self.observer.server_info
        say(self.t0, f"the RM is up in {time.time() - t_rm:.2f} s: machine {info.get('machine')}, "
                     f"enforcement {info.get('enforce_mode')}, socket {sock}")
        self.observer.subscribe("facts_changed", {"predicate": "other_task"},
                                lambda e: events.put((time.time(), "facts", e)))
        self.observer.subscribe("allocation_changed", {"task": NAME},
                                lambda e: events.put((time.time(), "alloc", e)))
        return sock

    def start_cscs(self, cost_fn: Path, sock: Path) -> bool:
        """3. CSCS registers and runs its closed loop of batches for a phase."""
        args, out = self.args, self.out
        total = 3 * args.phase_seconds + 120  # a bound: the demo stops it with SIGTERM
        self.cscs = subprocess.Popen([str(CSCS), "run", "--tuples", args.tuples, "--seconds", f"{total:g}",
                                      "--sla-ms", f"{args.sla_ms:g}", "--cost-fn", str(cost_fn), "--socket",
                                      str(sock), "--name", NAME],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        self.reader = threading.Thread(target=out.read, args=(self.cscs.stdout,), daemon=True)
        self.reader.start()
        t_reg = time.time()
        for pattern in (r"^# cod: deployment derived", r"^# cod: registered", r"^# table generated"):
            got = wait_note(out, pattern, 60)
            if not got:
                print("\n".join(out.all), file=sys.stderr)
                print("demo: CSCS did not start under COD", file=sys.stderr)
                return False
            say(self.t0, got[1].lstrip("# "), got[0])
        deadline = time.monotonic() + 30
        while not out.batches and time.monotonic() < deadline:
            time.sleep(0.01)
        t_first = out.batches[0].wall if out.batches else time.time()
        say(self.t0, f"CSCS runs its closed loop of batches ({time.time() - t_reg:.2f} s after it started)", t_first)
        time.sleep(args.phase_seconds)
        return True

    def stressor_arrives(self) -> float:
        """4. The stressor arrives: the RM detects it, confines it and takes its CPU from CSCS."""
        events, t0 = self.events, self.t0
        while not events.empty():
            events.get()
        t_stress = time.time()
        self.stressor = subprocess.Popen([sys.executable, "-c", STRESSOR])
        say(t0, f"a CPU stressor starts (pid {self.stressor.pid}, unregistered, 1 core of work)", t_stress)
        confined: list[tuple[float, str]] = []
        watcher = threading.Thread(target=watch_affinity, args=(self.stressor, confined), daemon=True)
        watcher.start()
        steps: list[tuple[float, str]] = []
        got = wait_event(events, "facts", lambda e: e.get("op") == "add", 15)
        if got:
            self.timings["arrival"] = {"detected_s": got[0] - t_stress}
            steps.append((got[0], f"the RM detects it as an unregistered busy process ({got[0] - t_stress:.3f} s "
                                  f"after it started: busy over its sampling window)"))
        up = wait_event(events, "alloc", lambda e: bool(e.get("removed")), 15)
        if up:
            steps.append((up[0], f"the RM keeps CPU {','.join(map(str, up[1]['removed']))} for it and takes it "
                                 f"from CSCS (epoch {up[1]['epoch']}, deadline {up[1].get('deadline_s')} s): "
                                 f"{up[1].get('reason')}"))
        watcher.join(5)
        self.timings.setdefault("arrival", {}).update(
            react(t0, self.out, "the stressor started", t_stress, steps + confined))
        time.sleep(max(0.0, t_stress + self.args.phase_seconds - time.time()))
        return t_stress

    def stressor_stops(self, t_stress: float) -> float:
        """5. The stressor stops: CSCS gets its CPU back the same way."""
        assert self.stressor is not None
        while not self.events.empty():
            self.events.get()
        t_gone = time.time()
        self.stressor.send_signal(signal.SIGKILL)
        self.stressor.wait()
        say(self.t0, "the stressor stops", t_gone)
        up = wait_event(self.events, "alloc", lambda e: bool(e.get("added")), 15)
        steps = []
        if up:
            steps.append((up[0], f"the RM gives CPU {','.join(map(str, up[1]['added']))} back to CSCS "
                                 f"(epoch {up[1]['epoch']}, {up[0] - t_gone:.3f} s after the stressor stopped): "
                                 f"{up[1].get('reason')}"))
        self.timings["departure"] = react(self.t0, self.out, "the stressor stopped", t_gone, steps)
        return t_gone

    def report(self, t_stress: float, t_gone: float) -> int:
        """6. The rest of the run, then the figures; 0 when CSCS ended well and acked its upcall."""
        args, out, timings, cscs = self.args, self.out, self.timings, self.cscs
        assert cscs is not None
        time.sleep(max(0.0, t_gone + args.phase_seconds - time.time()))
        cscs.send_signal(signal.SIGTERM)  # ends after the batch in progress, deregisters, prints its summary
        try:
            cscs.wait(timeout=60)
        except subprocess.TimeoutExpired:
            cscs.kill()
        self.reader.join(5)
        t_end = time.time()
        say(self.t0, f"CSCS finished ({cscs.returncode == 0 and 'exit 0' or f'exit {cscs.returncode}'})")
        moved = timings.get("arrival", {}).pop("reconfigured_at", t_gone)
        back = timings.get("departure", {}).pop("reconfigured_at", t_gone)
        print("== batch response times (batches of 2048 queries + 512 updates; "
              f"SLA {args.sla_ms:.0f} ms)", flush=True)
        print(summary("before", [b for b in out.batches if b.wall < t_stress], args.sla_ms))
        print(summary("stressor, before CSCS moved", [b for b in out.batches if t_stress <= b.wall < moved], args.sla_ms))
        print(summary("stressor, CSCS moved", [b for b in out.batches if moved <= b.wall < t_gone], args.sla_ms))
        print(summary("stressor gone, before CSCS moved", [b for b in out.batches if t_gone <= b.wall < back],
                      args.sla_ms))
        print(summary("after", [b for b in out.batches if b.wall >= max(back, t_gone)], args.sla_ms))
        for line in out.all:
            if line.startswith("summary:"):
                print(f"  cscs {line}")
        print("== timings", flush=True)
        for phase, t in timings.items():
            print(f"  {phase}: " + ", ".join(f"{k} {v:.3f}" if k.endswith("_s") else f"{k} {v:.1f}"
                                              for k, v in t.items()))
        print("== what the RM logged", flush=True)
        for line in (self.tmp / "rm.log").read_text().splitlines():
            if re.search(r"epoch \d+ \(|busy process|confined|released|left", line):
                print("  " + line.split(" ", 2)[2] if line[:2] == "20" else "  " + line)
        missed = sum(1 for b in out.batches if b.rt_ms > args.sla_ms)
        print(f"  demo took {t_end - self.t0:.1f} s; load average now {' '.join(f'{x:.2f}' for x in os.getloadavg())};"
              f" {missed} batches missed the SLA", flush=True)
        return 0 if cscs.returncode == 0 and "upcall_to_ack_ms" in timings.get("arrival", {}) else 1

    def clean_up(self) -> bool:
        """Everything this demo started, and nothing else; True when a cgroup was left behind."""
        stressor, cscs, rm, tmp, parent = self.stressor, self.cscs, self.rm, self.tmp, self.parent
        if stressor is not None and stressor.poll() is None:
            stressor.kill()
            stressor.wait()
        if cscs is not None and cscs.poll() is None:
            cscs.kill()
            cscs.wait()
        if self.observer is not None:
            self.observer.close()
        if rm is not None and rm.poll() is None:
            rm.send_signal(signal.SIGTERM)
            try:
                rm.wait(15)
            except subprocess.TimeoutExpired:
                rm.kill()
                rm.wait()
        left = [p for p in (Path("/sys/fs/cgroup/cpuset") / parent, Path("/sys/fs/cgroup") / parent) if p.exists()]
        shutil.rmtree(tmp, ignore_errors=True)
        print(f"== cleaned up: stressor, CSCS and the RM stopped (RM exit {rm.returncode if rm else '-'}), "
              f"{tmp} removed, cgroup parent {parent} {'LEFT: ' + ', '.join(map(str, left)) if left else 'removed'}",
              flush=True)
        return bool(left)


def watch_affinity(proc: subprocess.Popen, out: list[tuple[float, str]], timeout: float = 20.0) -> None:
    """Notes the moment the RM confines `proc` (its affinity narrows)."""
    everywhere = set(os.sched_getaffinity(0))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            mask = os.sched_getaffinity(proc.pid)
        except OSError:
            return
        if set(mask) != everywhere:
            out.append((time.time(), f"the RM confines the stressor to CPU {','.join(map(str, sorted(mask)))}"))
            return
        time.sleep(0.005)


def wait_event(events: "queue.Queue[tuple[float, str, dict]]", kind: str, pred, timeout: float):
    """The next observer event of `kind` for which pred holds: (time, params)."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            when, k, e = events.get(timeout=left)
        except queue.Empty:
            return None
        if k == kind and pred(e):
            return when, e
    return None


if __name__ == "__main__":
    sys.exit(main())

"""Costs of the enforcement mechanisms, side by side in one run; prints JSON.

    python bench/enforce_bench.py [--procs 300] [--repeat 50]

* pin: applying a 4-thread process to a CPU with each backend (affinity, cpuset);
* events: proc connector delay from the kernel's timestamp to our read, per kind;
* exit_reaction: kill a pinned task -> its exit event -> release it and re-pin the
  survivor to all CPUs;
* sample: one pass over every process, /proc/PID/stat (ours) vs psutil, with
  --procs extra sleeping processes started for the run;
* livestate: one LiveStateSampler refresh with 10 registered tasks, and what it
  costs at a 1 s interval as a share of one core.
Root is needed for the cpuset and connector rows (they are reported as skipped otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

from cod.facts import procfs
from cod.rm.enforce import AffinityEnforcer, detect
from cod.rm.enforce.busy import BusyDetector
from cod.rm.enforce.livestate import LiveStateSampler
from cod.rm.enforce.procevents import ConnectorSource

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from helpers.procs import spinner_command, start_spinner  # noqa: E402


def stats_us(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {"median_us": round(statistics.median(s) * 1e6, 1),
            "p90_us": round(s[int(len(s) * 0.9) - 1] * 1e6, 1), "n": len(s)}


def bench_pin(cmd: list[str], repeat: int) -> dict:
    """first: a process COD has not seen (record + state file + pin); move: re-pin to another CPU."""
    out = {}
    cpus = sorted(os.sched_getaffinity(0))
    task = start_spinner(cmd, 4, "sleep")
    try:
        for kind in ("affinity", "cpuset"):
            if kind == "cpuset" and os.geteuid() != 0:
                out[kind] = "skipped: not root"
                continue
            with tempfile.TemporaryDirectory() as d:
                enf = AffinityEnforcer(d) if kind == "affinity" else detect("cpuset", d, cgroup_parent=f"cod-bench-{os.getpid()}")
                first, move = [], []
                try:
                    for i in range(repeat):
                        t = time.perf_counter()
                        enf.apply("db", [task.pid], [cpus[0]], [0])
                        first.append(time.perf_counter() - t)
                        t = time.perf_counter()
                        enf.apply("db", [task.pid], [cpus[-1]], [0])
                        move.append(time.perf_counter() - t)
                        enf.release("db")
                finally:
                    enf.close()
            out[kind] = {"first": stats_us(first), "move": stats_us(move)}
    finally:
        task.stop()
    return out


SPAWNER = "for i in $(seq {n}); do /bin/true; sleep 0.02; done"


def bench_events(repeat: int) -> dict:
    """Kernel timestamp -> our read, for processes a shell starts (so we are idle in select)."""
    if os.geteuid() != 0:
        return {"skipped": "not root"}
    src = ConnectorSource()
    delays: dict[str, list[float]] = {"fork": [], "exec": [], "exit": []}
    try:
        shell = subprocess.Popen(["sh", "-c", SPAWNER.format(n=repeat)])
        children: set[int] = set()
        while shell.poll() is None:
            if not select.select([src.fileno()], [], [], 0.5)[0]:
                continue
            now = time.monotonic_ns()
            for ev in src.read_events():
                if ev.kind == "fork" and ev.parent_tgid == shell.pid:
                    children.add(ev.tgid)
                if ev.tgid in children and ev.kind in delays:
                    delays[ev.kind].append((now - ev.timestamp_ns) / 1e9)
    finally:
        src.close()
    return {k: stats_us(v) for k, v in delays.items() if v}


def bench_reaction(cmd: list[str], repeat: int) -> dict:
    """A task dies: kill -> exit event -> release it, give the survivor both CPUs (the
    mechanism under the issue's 100 ms requirement; the RM's policy step comes on top)."""
    cpus = sorted(os.sched_getaffinity(0))
    if os.geteuid() != 0 or len(cpus) < 2:
        return {"skipped": "needs root and two CPUs"}
    src = ConnectorSource()
    total, to_event, work_cpu = [], [], []
    try:
        with tempfile.TemporaryDirectory() as d, AffinityEnforcer(d) as enf:
            for _ in range(repeat):
                a, b = start_spinner(cmd, 2, "spin"), start_spinner(cmd, 2, "sleep")
                enf.apply("a", [a.pid], [cpus[0]], [0])
                enf.apply("b", [b.pid], [cpus[1]], [0])
                src.read_events()
                t0, t0_ns = time.monotonic(), time.monotonic_ns()
                a.proc.kill()
                done = False
                while not done:
                    select.select([src.fileno()], [], [], 1)
                    for ev in src.read_events():
                        if ev.kind == "exit" and ev.pid == a.pid and not done:
                            to_event.append((ev.timestamp_ns - t0_ns) / 1e9)
                            c0 = time.process_time()
                            enf.forget_pid("a", a.pid)
                            enf.release("a")
                            enf.apply("b", [b.pid], cpus, [0])
                            work_cpu.append(time.process_time() - c0)
                            done = True
                total.append(time.monotonic() - t0)
                a.stop()
                b.stop()
                enf.release("b")
    finally:
        src.close()
    return {"kill_to_cores_given": stats_us(total), "kill_to_exit_event": stats_us(to_event),
            "reaction_cpu": stats_us(work_cpu), "max_us": round(max(total) * 1e6, 1)}


def bench_sample(nprocs: int, repeat: int) -> dict:
    """One sample over every process: the gated detector on a quiet box, a full /proc scan, psutil."""
    sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(nprocs)]
    try:
        total = len(procfs.pids())
        rows = {}
        # gate_only: what a quiet machine costs (the threshold is never reached, nothing is scanned)
        for name, det in (("gate_only", BusyDetector(threshold=1e6)), ("proc_stat_scan", BusyDetector(always_scan=True))):
            det.sample()
            times = []
            scans = det.scans
            for _ in range(repeat):
                time.sleep(0.1)
                t = time.perf_counter()
                det.sample()
                times.append(time.perf_counter() - t)
            rows[name] = {**stats_us(times), "full_scans": det.scans - scans}
        theirs = []
        for _ in range(repeat):
            time.sleep(0.1)
            t = time.perf_counter()
            for p in psutil.process_iter(["cpu_times", "create_time"]):
                p.info  # noqa: B018 (the attributes are read by process_iter)
            theirs.append(time.perf_counter() - t)
        rows["psutil_scan"] = stats_us(theirs)
    finally:
        for s in sleepers:
            s.kill()
        for s in sleepers:
            s.wait()
    rows["processes"] = total
    rows["psutil_over_proc_stat"] = round(rows["psutil_scan"]["median_us"] / rows["proc_stat_scan"]["median_us"], 2)
    return rows


def bench_livestate(cmd: list[str], repeat: int) -> dict:
    tasks = [start_spinner(cmd, 2, "sleep") for _ in range(10)]
    try:
        sampler = LiveStateSampler()
        reg = {f"t{i}": [t.pid] for i, t in enumerate(tasks)}
        cpu, cpu_nopages = [], []
        for _ in range(repeat):
            t = time.process_time()
            sampler.sample(reg)
            cpu.append(time.process_time() - t)
            t = time.process_time()
            sampler.sample(reg, pages=False)
            cpu_nopages.append(time.process_time() - t)
    finally:
        for t in tasks:
            t.stop()
    per = statistics.mean(cpu)
    return {"tasks": 10, "refresh_cpu": stats_us(cpu), "refresh_cpu_without_numa_maps": stats_us(cpu_nopages),
            "share_of_one_core_at_1s_percent": round(per / 1.0 * 100, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--procs", type=int, default=300, help="extra sleeping processes for the sampling row")
    ap.add_argument("--repeat", type=int, default=50)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        cmd = spinner_command(d)
        result = {
            "pin_4_threads": bench_pin(cmd, args.repeat),
            "event_delay": bench_events(args.repeat),
            "exit_reaction": bench_reaction(cmd, min(args.repeat, 30)),
            "sample_all_processes": bench_sample(args.procs, max(10, args.repeat // 2)),
            "livestate_refresh": bench_livestate(cmd, args.repeat),
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

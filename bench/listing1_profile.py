#!/usr/bin/env python3
"""Where Listing 1's connect -> first upcall spends CPU, on each side: the client, the daemon, the SKB.

CPU time, not wall time: a loaded machine stretches the wall clock of every step, not the CPU a
step costs.  For N registrations like bench/rm_bench.py's Listing 1 (connect, one register_task
with Listing 1's facts and cost function, wait for the allocation upcall, close), prints per
registration:

* the client's calling thread (connect; register_task until its reply) and the client process
  as a whole (its reader and handler threads too);
* the daemon process and the SKB engine process (/proc/PID/task/*/schedstat: CPU of every thread
  alive at the end, in ns; and utime+stime of /proc/PID/stat, which also counts threads gone);
  the engine's CPU also by thread (the request reader `swipl`, the writer, the output thread,
  the garbage collector, the watchdog, query workers);
* with --queries N, also N single-fact queries through the daemon (the direct channel off) from one
  client: the median wall time per call, and the client's CPU per call (its calling thread, and
  the process with its reader thread) and the daemon's;
* with --cprofile, the daemon's own functions by CPU time of its event-loop thread (cProfile with
  time.thread_time_ns as its clock), the top entries by cumulative and by own time.

    python bench/listing1_profile.py [--n 300] [--queries 3000] [--cprofile]
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rm_bench import COST_FN, LISTING1_FACTS, listening  # noqa: E402

from cod.client import Client  # noqa: E402
from cod.facts import procfs  # noqa: E402

# The daemon under cProfile, timed by the CPU time of the thread that runs the event loop.
PROFILED = """
import cProfile, sys, time
from cod.cli.main import main
prof = cProfile.Profile(time.thread_time_ns, 1e-9)
sys.argv = ["cod"] + sys.argv[2:]
prof.enable()
try:
    main(sys.argv[1:])
finally:
    prof.disable()
    prof.dump_stats({out!r})
"""


def start_daemon(tmp: Path, profile_out: Path | None) -> subprocess.Popen:
    sock = tmp / "rm.sock"
    args = ["rm", "--socket", str(sock), "--no-enforce", "--log-level", "warning"]
    if profile_out is None:
        cmd = [sys.executable, "-m", "cod.cli.main", *args]
    else:
        cmd = [sys.executable, "-c", PROFILED.format(out=str(profile_out)), "-", *args]
    proc = subprocess.Popen(cmd, stderr=open(tmp / "rm.log", "wb"))
    return listening(proc, sock, tmp / "rm.log")


def cpu_ns(pid: int) -> tuple[int, int]:
    """(sum of schedstat run time over live threads, utime+stime of the process) in ns."""
    run = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            run += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError):
            pass
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    return run, ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def thread_cpu_ns(pid: int) -> dict[str, int]:
    """Run time of each live thread of pid by thread name (threads of one name summed), ns."""
    out: dict[str, int] = {}
    for tid, name in procfs.thread_names(pid).items():
        run = procfs.thread_schedstat(pid, tid)
        if run is not None:
            out[name] = out.get(name, 0) + run[0]
    return out


def engine_pid(daemon: int) -> int:
    for task in Path(f"/proc/{daemon}/task").iterdir():
        for child in (task / "children").read_text().split():
            if "swipl" in Path(f"/proc/{child}/comm").read_text():
                return int(child)
    raise SystemExit("no SKB engine under the daemon")


def registrations(sock: str, n: int, first: int) -> dict[str, float]:
    """N Listing 1 registrations; the calling thread's CPU per step, in us per registration."""
    connect = register = 0.0
    for i in range(first, first + n):
        got = threading.Event()
        t0 = time.thread_time()
        c = Client.connect(sock, app=f"cscs{i}")
        t1 = time.thread_time()
        c.register_task(f"cscs{i}", max_cores=2, bound="cpu", sensitive=["cache", "numa"],
                        facts=LISTING1_FACTS, procedures=[COST_FN], on_allocation=lambda e: got.set())
        t2 = time.thread_time()
        connect += t1 - t0
        register += t2 - t1
        got.wait(5)
        c.close()
        time.sleep(0.01)  # as rm_bench: the daemon forgets the task before the next round
    return {"connect": connect / n * 1e6, "register_task": register / n * 1e6}


def queries_through_daemon(sock: str, n: int, daemon: int) -> dict[str, float]:
    """N single-fact queries through the daemon from one client: wall median and CPU per call (us)."""
    with Client.connect(sock, app="profiled") as c:
        c.direct_queries = False
        c.add_facts(["n(1)"])
        for _ in range(200):
            c.execute_query("n(X)")
        walls = []
        d0, p0, t0 = cpu_ns(daemon), time.process_time(), time.thread_time()
        for _ in range(n):
            w0 = time.perf_counter()
            c.execute_query("n(X)")
            walls.append(time.perf_counter() - w0)
        d1, p1, t1 = cpu_ns(daemon), time.process_time(), time.thread_time()
    walls.sort()
    return {"wall_median": round(walls[n // 2] * 1e6, 1), "client_calling_thread": round((t1 - t0) / n * 1e6, 1),
            "client_process": round((p1 - p0) / n * 1e6, 1), "daemon": round((d1[0] - d0[0]) / n / 1e3, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--cprofile", action="store_true", help="run the daemon under cProfile (CPU clock)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--save-profile", type=Path, help="with --cprofile, also keep the daemon's profile here")
    ap.add_argument("--queries", type=int, default=0, help="also time this many queries through the daemon")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cod-l1-profile-") as tmpd:
        tmp = Path(tmpd)
        prof = tmp / "daemon.prof" if args.cprofile else None
        proc = start_daemon(tmp, prof)
        out: dict[str, object] = {"loadavg_before": os.getloadavg()[0], "n": args.n}
        try:
            sock = str(tmp / "rm.sock")
            registrations(sock, 20, 0)  # warm up: the engine's first application, imports
            skb = engine_pid(proc.pid)
            d0, s0, t0, c0 = cpu_ns(proc.pid), cpu_ns(skb), thread_cpu_ns(skb), time.process_time()
            calling = registrations(sock, args.n, 20)
            d1, s1, t1, c1 = cpu_ns(proc.pid), cpu_ns(skb), thread_cpu_ns(skb), time.process_time()
            per = 1e3 * args.n
            out["client_calling_thread_us"] = {k: round(v, 1) for k, v in calling.items()}
            out["client_process_us"] = round((c1 - c0) * 1e6 / args.n, 1)
            out["daemon_us"] = {"schedstat": round((d1[0] - d0[0]) / per, 1), "stat": round((d1[1] - d0[1]) / per, 1)}
            out["skb_us"] = {"schedstat": round((s1[0] - s0[0]) / per, 1), "stat": round((s1[1] - s0[1]) / per, 1)}
            out["skb_threads_us"] = {name: round((ns - t0.get(name, 0)) / per, 1) for name, ns in sorted(t1.items())
                                     if ns > t0.get(name, 0)}
            if args.queries:
                out["query_through_daemon_us"] = queries_through_daemon(sock, args.queries, proc.pid)
        finally:
            proc.terminate()
            proc.wait(30)
        out["loadavg_after"] = os.getloadavg()[0]
        print(json.dumps(out, indent=1))
        if prof is not None and prof.exists():
            if args.save_profile is not None:
                args.save_profile.write_bytes(prof.read_bytes())
            stats = pstats.Stats(str(prof))
            stats.sort_stats("cumulative").print_stats(args.top)
            stats.sort_stats("tottime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())

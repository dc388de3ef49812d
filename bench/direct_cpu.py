#!/usr/bin/env python3
"""Where a direct query's time goes, by process: the engine's CPU per query against the round trip.

Starts a daemon (as bench/cclient_bench.py does), runs N single-fact queries from libcod's
`cod_bench query` on the direct channel, and prints JSON: the median round trip, libcod's own CPU
per call, the engine process's CPU per query (utime+stime, which counts the connection's thread
after it has ended), each live engine thread's and the daemon's. With --strace, also the system
calls the engine made (strace -f -c), per query. CPU time, not wall time: it holds on a loaded
machine, where the ratios of bench/cclient_bench.py do not.

    python bench/direct_cpu.py [--n 20000] [--strace]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cclient_bench import BUILD, CDIR, start_daemon  # noqa: E402
from listing1_profile import cpu_ns, engine_pid, thread_cpu_ns  # noqa: E402


def strace_counts(path: Path, n: int) -> dict[str, float]:
    """Calls per query of each system call in an `strace -c` table (columns: % time, seconds,
    usecs/call, calls, [errors,] syscall), those made at least once in 1,000 queries."""
    calls: dict[str, float] = {}
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) in (5, 6) and parts[3].isdigit() and parts[-1] != "total":
            per_query = int(parts[3]) / n
            if per_query >= 0.001:
                calls[parts[-1]] = round(per_query, 3)
    return calls


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--strace", action="store_true", help="also count the engine's system calls")
    args = ap.parse_args()
    if subprocess.run(["make", "-s", "-C", str(CDIR), "all", "check-progs"]).returncode:
        raise SystemExit("building libcod's bench programs failed (see above)")
    out: dict[str, object] = {"loadavg_before": os.getloadavg(), "n": args.n}
    with tempfile.TemporaryDirectory(prefix="cod-direct-cpu-") as tmpd:
        tmp = Path(tmpd)
        proc = start_daemon(tmp, "magnycours")
        sock = str(tmp / "rm.sock")
        tracer = None
        try:
            subprocess.run([str(BUILD / "cod_bench"), "query", sock, "2000"], capture_output=True, check=True)
            skb = engine_pid(proc.pid)
            if args.strace:
                if shutil.which("strace") is None:
                    raise SystemExit("--strace needs strace (apt-get install strace)")
                tracer = subprocess.Popen(["strace", "-f", "-c", "-o", str(tmp / "strace.txt"), "-p", str(skb)],
                                          stderr=subprocess.DEVNULL)
                time.sleep(1.0)
            threads0, daemon0, engine0 = thread_cpu_ns(skb), cpu_ns(proc.pid)[1], cpu_ns(skb)[1]
            r = subprocess.run([str(BUILD / "cod_bench"), "query", sock, str(args.n)],
                               capture_output=True, text=True, check=True)
            threads1, daemon1, engine1 = thread_cpu_ns(skb), cpu_ns(proc.pid)[1], cpu_ns(skb)[1]
            if tracer is not None:
                tracer.terminate()
                tracer.wait()
                out["engine_syscalls_per_query"] = strace_counts(tmp / "strace.txt", args.n)
            client = json.loads(r.stdout.strip().splitlines()[-1])
            per = 1e3 * args.n
            out["round_trip_median_us"] = client["median_us"]
            out["libcod_cpu_us_per_call"] = client.get("client_cpu_us_per_call")
            out["engine_cpu_us_per_query"] = round((engine1 - engine0) / per, 1)
            out["engine_live_threads_us_per_query"] = {
                name: round((ns - threads0.get(name, 0)) / per, 2) for name, ns in sorted(threads1.items())
                if ns > threads0.get(name, 0)}
            out["daemon_cpu_us_per_query"] = round((daemon1 - daemon0) / per, 2)
        finally:
            proc.terminate()
            proc.wait(30)
    out["loadavg_after"] = os.getloadavg()
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Does a cpuset cgroup by itself slow PostgreSQL down?  Prints JSON.

    flock /tmp/cod-bench.lock .venv/bin/python bench/pg_cpuset_ab.py

pgbench select-only (4 clients, 6 s) against a private PostgreSQL, its processes in the
root cpuset (``root``) or in a cgroup v1 cpuset of their own that starts on one CPU and
grows to every CPU half a second into the run, as an elastic group does (``cpuset``);
rounds A B, B A, A B; no daemon.  Written to look for the full-load loss reported in
docs/elastic.md ("Re-run on a quiet machine").  Needs root and the v1 cpuset hierarchy;
touches only its own server and its own cgroup.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from cod.rm.enforce.cgroupfs import find_cpuset_mount, move_into, remove_cgroup

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from helpers.postgres import Postgres  # noqa: E402


def run_pgbench(pg: Postgres, during: Callable[[], None] | None = None) -> float:
    """Transactions per second of one 6 s select-only run; ``during`` runs 0.5 s in."""
    proc = subprocess.Popen([pg.tool("pgbench"), *pg.conn_args(), "-S", "-c", "4", "-T", "6", "-n", "postgres"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if during is not None:
        time.sleep(0.5)
        during()
    out, err = proc.communicate()
    found = re.search(r"tps = ([\d.]+)", out)
    if found is None:
        raise RuntimeError(f"pgbench failed: {err.strip()}")
    return float(found.group(1))


def move(pg: Postgres, cgroup: str) -> None:
    for pid in pg.server_pids():  # single-threaded processes: the pid is the one thread
        move_into(cgroup, pid)  # False for a backend that just exited


def write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def main() -> None:
    mount = find_cpuset_mount()
    if mount is None or mount.version != 1:
        sys.exit("pg_cpuset_ab: needs the cgroup v1 cpuset hierarchy (and root)")
    root = mount.path
    cpus = sorted(os.sched_getaffinity(0))
    cgroup = os.path.join(root, f"cod_ab_{os.getpid()}")
    result: dict = {"loadavg_before": os.getloadavg(), "cpus": cpus, "root": [], "cpuset": []}
    pg = Postgres()
    pg.start()
    try:
        pg.pgbench(["-i", "-s", "10", "-q"])
        os.mkdir(cgroup)
        with open(os.path.join(root, "cpuset.mems")) as f:
            write(os.path.join(cgroup, "cpuset.mems"), f.read().strip())

        def grow() -> None:
            move(pg, cgroup)  # the backends pgbench's connections forked
            write(os.path.join(cgroup, "cpuset.cpus"), ",".join(map(str, cpus)))

        for order in (("root", "cpuset"), ("cpuset", "root"), ("root", "cpuset")):
            for config in order:
                if config == "cpuset":
                    write(os.path.join(cgroup, "cpuset.cpus"), str(cpus[0]))
                    move(pg, cgroup)
                    result[config].append(run_pgbench(pg, grow))
                else:
                    move(pg, root)
                    result[config].append(run_pgbench(pg))
    finally:
        move(pg, root)
        pg.stop()
        remove_cgroup(cgroup, evict_to=root)
    result["ratio_cpuset_to_root_median"] = round(statistics.median(result["cpuset"])
                                                  / statistics.median(result["root"]), 3)
    result["loadavg_after"] = os.getloadavg()
    print(json.dumps(result))


if __name__ == "__main__":
    main()

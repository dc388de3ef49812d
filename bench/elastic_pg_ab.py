"""Does an elastic group cost PostgreSQL throughput at full load?  A/B against all CPUs (issue 30).

    flock /tmp/cod-bench.lock .venv/bin/python bench/elastic_pg_ab.py [--rounds 5] [--duration 20]
          [--configs all,elastic,elastic-nobusy,elastic-min-all,elastic-min-all-slow,elastic-min-all-fewer-writes]

pgbench select-only (``-S``) and TPC-B-like against a private PostgreSQL, in interleaved rounds
(the configurations in order, then reversed, alternately), each run against the same server:

* ``all``: no daemon, every CPU (the baseline);
* ``elastic``: a fresh ``cod rm`` with busy detection over this bench's own processes (so
  pgbench itself, an unregistered busy process, may be kept and confined, as with the default
  scope, without touching other users' work), the postmaster and its children registered as an
  elastic group (``--min 1``, the default period);
* ``elastic-nobusy``: the same with ``--no-busy-detect`` (suspect: the busy detector confining
  pgbench on or off the group's CPUs and keeping a CPU from the group for it);
* ``elastic-min-all``: the group's floor is every CPU (suspect: the lead-in on one CPU and the
  grants; the periods, member following and SKB writes still run);
* ``elastic-min-all-slow``: the same with 5 s periods (suspect: the daemon's periods and the SKB
  writes they cause, ten times fewer);
* ``elastic-min-all-fewer-writes``: every CPU, the default period, but the group's facts written
  only when its cores, state or transitions change, not as its load moves (suspect: the SKB
  writes alone).

Each run prints one JSON line (config, workload, round, tps, latency, the daemon's CPU seconds,
the group's cores at the end, the confinements the daemon logged, the load average before and
after); the last line is the summary: the median of ``tps(config) / tps(all)`` over the rounds in
which both ran, per workload.  On a loaded machine the ratios mean nothing (docs/elastic.md,
*How to run*): look at the load averages first.  Needs PostgreSQL (``make setup``); as root the
daemon uses cpuset cgroups under a parent of its own; touches only its own server, daemon and
state directory.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from helpers.postgres import Postgres  # noqa: E402

CONFIGS = ("all", "elastic", "elastic-nobusy", "elastic-min-all", "elastic-min-all-slow", "elastic-min-all-fewer-writes")
WORKLOADS = {"select-only": ["-S"], "tpcb-like": []}
CPUS = sorted(os.sched_getaffinity(0))


def daemon_flags(config: str) -> list[str]:
    if config == "elastic-nobusy":
        return ["--no-busy-detect"]
    if config == "elastic-min-all-fewer-writes":  # the group's facts only when its cores, state or transitions change
        return ["--busy-scope", f"descendants:{os.getpid()}", "--set", "elastic_facts_refresh_s=3600",
                "--set", "elastic_facts_load_step=1000"]
    # Busy detection over this bench's own processes only (the server and pgbench are its
    # children): on a shared machine the default scope, every process, confines other users' work.
    return ["--busy-scope", f"descendants:{os.getpid()}"]


def group_settings(config: str) -> dict:
    settings: dict = {"mode": "dense", "metric": "cpu_demand"}
    if config.startswith("elastic-min-all"):
        settings["min_cores"] = len(CPUS)
    if config == "elastic-min-all-slow":
        settings["period_s"] = 5.0
    return settings


class Daemon:
    """A fresh ``cod rm`` for one run: its own socket, state directory and cgroup parent."""

    def __init__(self, flags: list[str]) -> None:
        self.dir = tempfile.mkdtemp(prefix="cod-pg-ab-")
        self.sock = os.path.join(self.dir, "rm.sock")
        self.log_path = os.path.join(self.dir, "rm.log")
        self.log = open(self.log_path, "wb")
        cmd = [sys.executable, "-m", "cod.cli.main", "rm", "--socket", self.sock,
               "--state-dir", os.path.join(self.dir, "state"), "--cgroup-parent", f"cod_pg_ab_{os.getpid()}",
               "--log-level", "info", *flags]
        self.proc = subprocess.Popen(cmd, stderr=self.log)
        deadline = time.monotonic() + 60
        while not os.path.exists(self.sock):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the daemon did not start: {self.log_text()[-2000:]}")
            time.sleep(0.05)
        from cod.client import Client

        self.client = Client(self.sock, app="pg-ab", reconnect=False)

    def cpu_seconds(self) -> float:
        from cod.facts.procfs import cpu_seconds

        used = cpu_seconds(self.proc.pid)
        if used is None:
            raise RuntimeError(f"the daemon (pid {self.proc.pid}) is gone")
        return used

    def log_text(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def close(self) -> None:
        self.client.close()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def pgbench(pg: Postgres, workload: str, duration: int, clients: int) -> dict:
    res = pg.pgbench([*WORKLOADS[workload], "-c", str(clients), "-j", str(min(clients, len(CPUS))),
                      "-T", str(duration), "-n"], timeout=duration + 120)
    if res.returncode != 0:
        raise RuntimeError(f"pgbench failed: {res.stderr[-1000:]}")
    tps = float(re.search(r"tps = ([\d.]+)", res.stdout).group(1))
    lat = re.search(r"latency average = ([\d.]+) ms", res.stdout)
    return {"tps": tps, "latency_ms": float(lat.group(1)) if lat else None}


def run_one(pg: Postgres, config: str, workload: str, rnd: int, args) -> dict:
    row: dict = {"config": config, "workload": workload, "round": rnd, "loadavg_before": os.getloadavg()}
    if config == "all":
        row.update(pgbench(pg, workload, args.duration, args.clients))
    else:
        d = Daemon(daemon_flags(config))
        try:
            cpu0 = d.cpu_seconds()
            d.client.register_unmanaged(pid=pg.pid, name="pg", **group_settings(config))
            row.update(pgbench(pg, workload, args.duration, args.clients))
            listing = d.client.call("list_tasks")
            [group] = listing["elastic_groups"]
            row.update(rm_cpu_s=round(d.cpu_seconds() - cpu0, 3), cores_at_end=group["cores"],
                       facts_writes=group["facts_writes"], step_ms_median=group["step_ms_median"],
                       busy_at_end=listing["other_tasks"],
                       confinements=re.findall(r"confined busy process (\d+ \(\S+\) to CPUs \S+)", d.log_text()))
            d.client.call("deregister_unmanaged", {"name": "pg"})
        finally:
            d.close()
    row["loadavg_after"] = os.getloadavg()
    return row


def summary(rows: list[dict]) -> dict:
    out: dict = {}
    for workload in WORKLOADS:
        base = {r["round"]: r["tps"] for r in rows if r["workload"] == workload and r["config"] == "all"}
        for config in sorted({r["config"] for r in rows} - {"all"}):
            ratios = [r["tps"] / base[r["round"]] for r in rows
                      if r["workload"] == workload and r["config"] == config and base.get(r["round"])]
            if ratios:
                out[f"{workload}/{config}"] = {"median_ratio": round(statistics.median(ratios), 3),
                                               "ratios": [round(x, 3) for x in ratios]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--duration", type=int, default=20, help="seconds of pgbench per run")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"comma separated, from {', '.join(CONFIGS)}")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    args = ap.parse_args()
    configs = [c for c in args.configs.split(",") if c]
    workloads = [w for w in args.workloads.split(",") if w]
    unknown = sorted(set(configs) - set(CONFIGS)) + sorted(set(workloads) - set(WORKLOADS))
    if unknown or "all" not in configs:
        sys.exit(f"elastic_pg_ab: unknown {unknown} (and 'all', the baseline, must be run)" if unknown
                 else "elastic_pg_ab: the configurations must include 'all', the baseline")
    # a killed bench (SIGTERM) still stops its server and daemon: the with blocks unwind
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows: list[dict] = []
    with Postgres() as pg:
        pg.pgbench(["-i", "-s", str(args.scale), "-q"])
        for rnd in range(args.rounds):
            order = configs if rnd % 2 == 0 else configs[::-1]  # reversed order every other round
            for workload in workloads:
                for config in order:
                    row = run_one(pg, config, workload, rnd, args)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    print(json.dumps({"summary": summary(rows), "cpus": CPUS, "loadavg_end": os.getloadavg()}), flush=True)


if __name__ == "__main__":
    main()

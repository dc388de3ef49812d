"""Elastic cores on real engines nobody here wrote, side by side in one run; prints JSON.

    flock /tmp/cod-bench.lock .venv/bin/python bench/elastic_bench.py [--quick] [--out DIR]

* net: one evaluation of the Petri net and the controller's decision (target <= 1 ms),
  on the paper's 4-node machine and on a 384-CPU hwloc machine;
* postgres: Debian's PostgreSQL on a private data directory and socket, in a cgroup
  of its own (or as postmaster + children without cgroups); workloads pgbench
  select-only, TPC-B-like, select-only at a fixed rate, and a TPC-H Q6-like scan with
  parallel workers over a generated lineitem-shaped table (pgbench -f);
* duckdb: the Python package in a child process, a Q6-like mix over data it generates.

Every workload runs with all CPUs (no elastic group) and as an elastic group of a running
``cod rm`` daemon (registered with ``register_unmanaged``, what ``cod elastic`` does, and
removed with ``deregister_unmanaged`` after the run) in each mode (dense, sparse, adaptive;
default settings: th 10/70 %, 0.5 s periods).  The daemon runs for the whole bench with
its default enforcement (cpuset cgroups as root) and without busy detection (the load
generators, pgbench and this script, would otherwise be kept CPUs of their own).
Each run writes a CSV of the periods (cores, load, transitions, the daemon's time per
period), a CSV of throughput per second, and a PNG; the JSON has throughput, latency,
CPU time, core-seconds held, the daemon's own CPU time, and the ratios to all-CPUs,
with the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

from cod.facts import from_args, hwloc_xml, machines
from cod.rm.elastic import controller
from cod.rm.elastic.controller import Limits, Observation
from cod.rm.elastic.group import CgroupGroup, PidTreeGroup
from cod.rm.elastic.measure import GroupMeter
from cod.rm.elastic.modes import Layout
from cod.rm.elastic.petrinet import Bounds, Thresholds, evaluate, initial_marking
from cod.rm.elastic.runner import open_events
from cod.rm.elastic.settings import ElasticSettings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
from helpers.cgroups import cgroup_root, temp_cgroup  # noqa: E402
from helpers.data import HWLOC_DIR  # noqa: E402
from helpers.postgres import Postgres  # noqa: E402

CPUS = sorted(os.sched_getaffinity(0))
# all CPUs (no runner); each mode with the CPU-load metric; dense with the delay-accounting metric.
CONFIGS = ("all", "dense", "sparse", "adaptive", "dense-demand")


def config_settings(config: str, period: float) -> ElasticSettings:
    mode, _, metric = config.partition("-")
    return ElasticSettings(mode=mode, period_s=period, metric="cpu_demand" if metric == "demand" else "cpu_load")


def schedule(rounds: int) -> list[tuple[int, str]]:
    """(round, config): configs interleaved, every other round in reverse (no position bias)."""
    out = []
    for r in range(rounds):
        order = CONFIGS if r % 2 == 0 else tuple(reversed(CONFIGS))
        out += [(r, c) for c in order]
    return out

Q6 = """SELECT sum(l_extendedprice * l_discount) AS revenue FROM lineitem
WHERE l_shipdate >= date '1994-01-01' AND l_shipdate < date '1994-01-01' + interval '1' year
  AND l_discount BETWEEN 0.06 - 0.01 AND 0.06 + 0.01 AND l_quantity < 24;
"""

LINEITEM_PG = """
DROP TABLE IF EXISTS lineitem;
CREATE UNLOGGED TABLE lineitem AS
SELECT i / 4 + 1 AS l_orderkey, (random() * 200000)::int AS l_partkey, (random() * 10000)::int AS l_suppkey,
       i % 4 + 1 AS l_linenumber, (random() * 49)::int + 1 AS l_quantity,
       round((random() * 100000)::numeric, 2)::numeric(12, 2) AS l_extendedprice,
       (floor(random() * 11) / 100)::numeric(4, 2) AS l_discount,
       (floor(random() * 9) / 100)::numeric(4, 2) AS l_tax,
       (array['A', 'N', 'R'])[1 + i % 3] AS l_returnflag, (array['F', 'O'])[1 + i % 2] AS l_linestatus,
       date '1992-01-02' + (random() * 2525)::int AS l_shipdate,
       date '1992-01-31' + (random() * 2525)::int AS l_commitdate,
       date '1992-01-03' + (random() * 2525)::int AS l_receiptdate,
       'DELIVER IN PERSON'::text AS l_shipinstruct, 'TRUCK'::text AS l_shipmode,
       md5(i::text) AS l_comment
FROM generate_series(1, {rows}) AS i;
ALTER TABLE lineitem SET (parallel_workers = {workers});
ANALYZE lineitem;
"""

DUCKDB_WORKER = r"""
import sys, time, duckdb
rows, duration = int(sys.argv[1]), float(sys.argv[2])
con = duckdb.connect()
con.execute(f'''CREATE TABLE lineitem AS SELECT
    (random() * 49)::INT + 1 AS l_quantity,
    round(random() * 100000, 2)::DECIMAL(12, 2) AS l_extendedprice,
    (floor(random() * 11) / 100)::DECIMAL(4, 2) AS l_discount,
    (floor(random() * 9) / 100)::DECIMAL(4, 2) AS l_tax,
    ['A', 'N', 'R'][1 + range % 3] AS l_returnflag, ['F', 'O'][1 + range % 2] AS l_linestatus,
    DATE '1992-01-02' + (random() * 2525)::INT AS l_shipdate
  FROM range({rows})''')
mix = {
  "q6": "SELECT sum(l_extendedprice * l_discount) FROM lineitem WHERE l_shipdate >= DATE '1994-01-01' "
        "AND l_shipdate < DATE '1995-01-01' AND l_discount BETWEEN 0.05 AND 0.07 AND l_quantity < 24",
  "q6_wide": "SELECT sum(l_extendedprice * l_discount) FROM lineitem WHERE l_shipdate >= DATE '1993-01-01' "
             "AND l_shipdate < DATE '1996-01-01' AND l_discount BETWEEN 0.02 AND 0.09 AND l_quantity < 40",
  "q1_like": "SELECT l_returnflag, l_linestatus, sum(l_quantity), sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)), "
             "avg(l_discount), count(*) FROM lineitem WHERE l_shipdate <= DATE '1998-09-02' GROUP BY ALL ORDER BY ALL",
}
print("ready", con.execute("SELECT current_setting('threads')").fetchone()[0], flush=True)
sys.stdin.readline()
start = time.monotonic()
end = start + duration
while time.monotonic() < end:
    for name, q in mix.items():
        t0 = time.monotonic()
        con.execute(q).fetchall()
        print(f"{t0 - start:.4f} {name} {(time.monotonic() - t0) * 1000:.3f}", flush=True)
print("done", flush=True)
sys.stdin.readline()  # stay (idle) until the bench's tail is measured
"""


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    s = sorted(values)
    return {"median": round(statistics.median(s), 3), "p95": round(s[min(len(s) - 1, int(len(s) * 0.95))], 3),
            "mean": round(statistics.fmean(s), 3), "n": len(s)}


# ---- the net's own cost ---------------------------------------------------------------------------

def bench_net(repeat: int) -> dict:
    """One evaluation of the net, and one full controller step (net + mode's choice)."""
    out = {}
    for label, machine in (("paper 4x4 (shanghai)", machines.load("shanghai")),
                           ("192em64t-24n8c2t (384 CPUs)", hwloc_xml.load(HWLOC_DIR / "192em64t-24n8c2t.xml"))):
        layout = Layout.from_machine(machine)
        n_total = len(layout.cpus)
        th, bounds = Thresholds(10, 70), Bounds(1, n_total)
        net = []
        for i in range(repeat):
            m = initial_marking(1 + i % (n_total - 1))
            u = (7, 40, 99)[i % 3]
            t = time.perf_counter()
            evaluate(m, u, th, bounds)
            net.append(time.perf_counter() - t)
        row = {"net_evaluate_us": stats([x * 1e6 for x in net])}
        pages = {n: (n * 7919) % 1000 for n in layout.nodes}
        for mode in ("dense", "sparse", "adaptive"):
            settings = ElasticSettings(mode=mode)
            state, _ = controller.start(layout, settings)
            costs = []
            for i in range(repeat):
                u = (99, 99, 40, 8)[i % 4] if state.n < n_total // 2 else 8
                obs = Observation(at=float(i), load=u, pages=pages)
                t = time.perf_counter()
                state, _ = controller.step(state, obs, Limits(), layout, settings)
                costs.append(time.perf_counter() - t)
            row[f"step_{mode}_us"] = stats([x * 1e6 for x in costs])
        worst = max(v["p95"] for k, v in row.items())
        row["target_1ms_met"] = worst <= 1000
        out[label] = row
    return out


# ---- runs -----------------------------------------------------------------------------------------

@dataclass
class Run:
    engine: str
    workload: str
    config: str
    round: int
    periods: list[dict] = field(default_factory=list)  # t, cores, load, action, fired
    throughput: list[tuple[float, float, float]] = field(default_factory=list)  # (t, per second, latency ms)
    summary: dict = field(default_factory=dict)


class RM:
    """One ``cod rm`` daemon for the whole bench, and its CPU time (its SKB engine's apart)."""

    def __init__(self, out_dir: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="cod-elastic-rm-")
        self.sock = os.path.join(self.dir, "rm.sock")
        self.log = open(os.path.join(out_dir, "rm.log"), "wb")
        cmd = [sys.executable, "-m", "cod.cli.main", "rm", "--socket", self.sock,
               "--state-dir", os.path.join(self.dir, "state"), "--cgroup-parent", f"cod_elastic_bench_{os.getpid()}",
               "--no-busy-detect", "--log-level", "info"]
        self.proc = subprocess.Popen(cmd, stderr=self.log)
        for _ in range(400):
            if self.proc.poll() is not None:
                raise RuntimeError(f"the daemon exited: see {self.log.name}")
            if os.path.exists(self.sock):
                break
            time.sleep(0.05)
        from cod.client import Client

        self.client = Client(self.sock, app="elastic-bench", reconnect=False)
        self.info = self.client.server_info

    def cpu_seconds(self) -> float:
        from cod.facts.procfs import cpu_seconds

        used = cpu_seconds(self.proc.pid)
        if used is None:
            raise RuntimeError(f"the daemon (pid {self.proc.pid}) is gone")
        return used

    def close(self) -> None:
        import shutil
        import signal

        self.client.close()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Watch:
    """Registers the group with the daemon (config = a mode) or only measures it (config = all)."""

    def __init__(self, group, source: dict, config: str, rm: RM, period: float) -> None:
        self.config = config
        self.group = group
        self.source = source
        self.rm = rm
        self.name = f"bench-{config}"
        self.stop_event = threading.Event()
        self.t0 = time.monotonic()
        self.t0_wall = time.time()
        self.managed = config != "all"
        self.meter = GroupMeter(group)  # the measure-only loop's
        self.whole = GroupMeter(group)  # CPU time of the group over the whole run
        self.period = period
        self._rows: list[dict] = []
        self.cpu_s = 0.0
        self.rm_cpu_s = 0.0
        self.events = open_events(group)
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> None:
        self.start_n = len(CPUS)
        self.rm_cpu0 = self.rm.cpu_seconds()
        if self.managed:
            settings = config_settings(self.config, self.period)
            reply = self.rm.client.register_unmanaged(**self.source, name=self.name, mode=settings.mode,
                                                      metric=settings.metric, period_s=settings.period_s)
            self.start_n = len(reply["cores"])
            self.note = reply["notes"]
        self.meter.sample()
        self.whole.sample()
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop_event.wait(self.period):
            if self.events is not None:
                self.group.on_events(self.events.read_events())
            if self.managed:
                continue  # the daemon measures and records the periods
            s = self.meter.sample()
            self._rows.append({"t": round(time.monotonic() - self.t0, 3), "cores": len(CPUS),
                               "load": round(100 * s.cpu_s / max(1e-9, s.interval_s * len(CPUS)), 1),
                               "action": "", "fired": ""})

    def stop(self) -> list[dict]:
        self.stop_event.set()
        self.thread.join()
        if self.events is not None:
            self.group.on_events(self.events.read_events())
        self.cpu_s = self.whole.sample().cpu_s
        if self.events is not None:
            self.events.close()
        if not self.managed:
            self.rm_cpu_s = self.rm.cpu_seconds() - self.rm_cpu0
            return self._rows
        out = self.rm.client.deregister_unmanaged(name=self.name)
        self.rm_cpu_s = self.rm.cpu_seconds() - self.rm_cpu0
        first = {"t": 0.0, "cores": self.start_n, "load": 0.0, "action": "start", "fired": ""}
        return [first] + [{"t": round(p["at"] - self.t0_wall, 3), "cores": p["n_after"], "load": round(p["load"], 1),
                           "action": p["action"], "fired": " ".join(p["fired"]),
                           "step_us": round(p["step_s"] * 1e6, 1), "step_cpu_us": round(p["step_cpu_s"] * 1e6, 1)}
                          for p in out["periods"]]


def summarize(run: Run, wall: float, cpu_s: float, rm_cpu_s: float, extra: dict) -> None:
    held = [p for p in run.periods if "cores" in p]
    core_s = 0.0
    last_t, last_n = 0.0, (held[0]["cores"] if held else len(CPUS))
    for p in held:
        core_s += last_n * (p["t"] - last_t)
        last_t, last_n = p["t"], p["cores"]
    core_s += last_n * max(0.0, wall - last_t)
    steps = [p["step_us"] for p in held if "step_us" in p]
    cpu_steps = [p["step_cpu_us"] for p in held if "step_cpu_us" in p]
    run.summary = {
        **extra,
        "cpu_seconds": round(cpu_s, 2),
        "core_seconds_held": round(core_s, 1) if run.config != "all" else round(len(CPUS) * wall, 1),
        "mean_cores": round(core_s / wall, 2) if run.config != "all" else len(CPUS),
        "allocations": sum(1 for p in held if p["action"] == "allocate"),
        "releases": sum(1 for p in held if p["action"] == "release"),
        "rm_step_us": stats(steps) if steps else None,
        "rm_step_cpu_us": stats(cpu_steps) if cpu_steps else None,
        "rm_step_cpu_share_of_a_core": round(sum(cpu_steps) / 1e6 / wall, 5) if cpu_steps else None,
        # The whole daemon (event loop, allocator runs, SKB writes, pinning) over the run.
        "rm_cpu_share_of_a_core": round(rm_cpu_s / wall, 5),
    }


PROGRESS = re.compile(r"progress: ([\d.]+) s, ([\d.]+) tps, lat ([\d.]+) ms")


def pgbench_run(pg: Postgres, args: list[str], duration: int) -> tuple[dict, list[tuple[float, float, float]]]:
    res = pg.pgbench([*args, "-T", str(duration), "-P", "1"], timeout=duration + 120)
    if res.returncode != 0:
        raise RuntimeError(f"pgbench failed: {res.stderr[-1000:]}")
    series = [(float(m.group(1)), float(m.group(2)), float(m.group(3))) for m in PROGRESS.finditer(res.stderr)]
    tps = float(re.search(r"tps = ([\d.]+)", res.stdout).group(1))
    lat = float(re.search(r"latency average = ([\d.]+) ms", res.stdout).group(1))
    std = re.search(r"latency stddev = ([\d.]+) ms", res.stdout)
    return {"throughput_per_s": tps, "latency_ms_avg": lat,
            "latency_ms_stddev": float(std.group(1)) if std else None}, series


def run_one(engine: str, workload: str, config: str, rnd: int, group, source: dict, body, rm: RM, lead: float,
            tail: float, period: float) -> Run:
    """Watch the group (or register it with the daemon), run the workload body, then tail."""
    run = Run(engine, workload, config, rnd)
    watch = Watch(group, source, config, rm, period)
    watch.start()
    time.sleep(lead)
    t_work = time.monotonic() - watch.t0
    started = time.monotonic()
    extra, series = body()
    work_wall = time.monotonic() - started
    time.sleep(tail)
    run.periods = watch.stop()
    run.throughput = [(round(t + t_work, 3), v, lat) for t, v, lat in series]
    summarize(run, lead + work_wall + tail, watch.cpu_s, watch.rm_cpu_s,
              {**extra, "workload_seconds": round(work_wall, 1)})
    return run


# ---- engines --------------------------------------------------------------------------------------

def bench_postgres(args, out_dir: str, rm: RM) -> tuple[dict, list[Run]]:
    runs: list[Run] = []
    info: dict = {}
    cg_cm = temp_cgroup("bench-pg", skip=False) if os.geteuid() == 0 and cgroup_root() else None
    path = cg_cm.__enter__() if cg_cm else None
    pg = Postgres(cgroup=path, settings={"max_parallel_workers_per_gather": "2", "max_worker_processes": "8",
                                         "shared_buffers": "256MB", "work_mem": "32MB"})
    try:
        t = time.monotonic()
        pg.start()
        pg.pgbench(["-i", "-s", str(args.pg_scale), "-q"], timeout=600).check_returncode()
        pg.psql(LINEITEM_PG.format(rows=args.lineitem_rows, workers=2))
        info["setup_seconds"] = round(time.monotonic() - t, 1)
        plan = pg.psql("EXPLAIN " + Q6)
        info["q6_plan_workers"] = int(m.group(1)) if (m := re.search(r"Workers Planned: (\d+)", plan)) else 0
        info["lineitem_rows"] = args.lineitem_rows
        info["pgbench_scale"] = args.pg_scale
        info["group"] = f"cgroup {path}" if path else f"postmaster {pg.pid} and its children"
        q6_file = os.path.join(out_dir, "q6.sql")
        with open(q6_file, "w") as f:
            f.write(Q6)
        os.chmod(q6_file, 0o644)
        workloads = {
            "pgbench_select_only": ["-S", "-c", "4", "-j", "2"],
            "pgbench_tpcb_like": ["-c", "4", "-j", "2"],
            "pgbench_select_only_rate": ["-S", "-c", "2", "-j", "1", "-R", str(args.rate)],
            "q6_parallel": ["-n", "-f", q6_file, "-c", "1", "-j", "1"],
        }
        for name, wargs in workloads.items():
            for rnd, config in schedule(args.rounds):
                group = CgroupGroup(path) if path else PidTreeGroup([pg.pid])
                source = {"cgroup": path} if path else {"pid": pg.pid}
                run = run_one("postgres", name, config, rnd, group, source,
                              lambda: pgbench_run(pg, wargs, args.duration), rm, args.lead, args.tail, args.period)
                runs.append(run)
                print(f"postgres {name} {config} round {rnd}: {run.summary['throughput_per_s']:.1f}/s "
                      f"mean cores {run.summary['mean_cores']} load {loadavg()[0]}", file=sys.stderr)
    finally:
        pg.stop()
        if cg_cm:
            cg_cm.__exit__(None, None, None)
    return info, runs


def bench_duckdb(args, out_dir: str, rm: RM) -> tuple[dict, list[Run]]:
    try:
        import duckdb  # noqa: F401
    except ImportError:
        return {"skipped": "duckdb is not installed (pip install '.[bench]')"}, []
    import duckdb as ddb
    runs: list[Run] = []
    info: dict = {"version": ddb.__version__, "rows": args.duckdb_rows}
    for rnd, config in schedule(args.rounds):
        worker = subprocess.Popen([sys.executable, "-c", DUCKDB_WORKER, str(args.duckdb_rows), str(args.duration)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            ready = worker.stdout.readline().split()
            if not ready or ready[0] != "ready":
                raise RuntimeError(f"duckdb worker did not start: {ready}")
            info["threads"] = int(ready[1])

            def body():
                worker.stdin.write("go\n")
                worker.stdin.flush()
                lat: dict[str, list[float]] = {}
                points: list[tuple[float, float]] = []
                for line in worker.stdout:
                    parts = line.split()
                    if parts == ["done"]:
                        break
                    t, name, ms = float(parts[0]), parts[1], float(parts[2])
                    lat.setdefault(name, []).append(ms)
                    points.append((t, ms))
                n = sum(len(v) for v in lat.values())
                wall = max(t + ms / 1000 for t, ms in points) if points else 1.0
                series = []
                for sec in range(int(wall) + 1):
                    inside = [ms for t, ms in points if sec <= t < sec + 1]
                    series.append((float(sec + 1), float(len(inside)), statistics.fmean(inside) if inside else 0.0))
                return ({"throughput_per_s": round(n / wall, 2),
                         "latency_ms_avg": round(statistics.fmean(ms for _, ms in points), 2),
                         "latency_ms": {k: stats(v) for k, v in lat.items()}}, series)

            group = PidTreeGroup([worker.pid])
            run = run_one("duckdb", "q6_mix", config, rnd, group, {"pid": worker.pid}, body, rm, args.lead,
                          args.tail, args.period)
            runs.append(run)
            worker.stdin.write("exit\n")
            worker.stdin.flush()
            print(f"duckdb q6_mix {config} round {rnd}: {run.summary['throughput_per_s']:.1f}/s "
                  f"mean cores {run.summary['mean_cores']} load {loadavg()[0]}", file=sys.stderr)
        finally:
            worker.kill()
            worker.wait()
    return info, runs


# ---- output ---------------------------------------------------------------------------------------

def write_run(run: Run, out_dir: str) -> dict:
    stem = os.path.join(out_dir, f"{run.engine}_{run.workload}_{run.config}_r{run.round}")
    with open(stem + "_periods.csv", "w") as f:
        keys = ["t", "cores", "load", "action", "fired", "step_us", "step_cpu_us"]
        f.write(",".join(keys) + "\n")
        for p in run.periods:
            f.write(",".join(str(p.get(k, "")) for k in keys) + "\n")
    with open(stem + "_throughput.csv", "w") as f:
        f.write("t,per_second,latency_ms\n")
        for t, v, lat in run.throughput:
            f.write(f"{t},{v},{lat}\n")
    files = {"periods_csv": stem + "_periods.csv", "throughput_csv": stem + "_throughput.csv"}
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return files
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5), sharex=True)
    if run.throughput:
        ts = [t for t, _, _ in run.throughput]
        top.plot(ts, [v for _, v, _ in run.throughput], color="tab:blue", label="throughput")
        top.set_ylabel("per second", color="tab:blue")
        top.set_ylim(bottom=0)
        lat_ax = top.twinx()
        lat_ax.plot(ts, [lat for _, _, lat in run.throughput], color="tab:red", alpha=0.6, label="latency")
        lat_ax.set_ylabel("latency (ms)", color="tab:red")
        lat_ax.set_ylim(bottom=0)
    top.set_title(f"{run.engine} {run.workload}: {run.config} (round {run.round})"
                  f" ({run.summary.get('throughput_per_s', 0):.1f}/s, mean cores {run.summary.get('mean_cores')})")
    if run.periods:
        ts = [p["t"] for p in run.periods]
        bottom.step(ts, [p["cores"] for p in run.periods], where="post", color="black", label="cores")
        bottom.set_ylabel("cores held")
        bottom.set_ylim(0, len(CPUS) + 0.5)
        load_ax = bottom.twinx()
        load_ax.plot(ts, [p["load"] for p in run.periods], color="tab:green", alpha=0.6)
        load_ax.axhline(10, color="tab:green", linestyle=":", linewidth=0.8)
        load_ax.axhline(70, color="tab:green", linestyle=":", linewidth=0.8)
        load_ax.set_ylabel("load (% of held)", color="tab:green")
        load_ax.set_ylim(0, 105)
        for p in run.periods:
            if p["action"] in ("allocate", "release"):
                bottom.annotate(p["fired"].replace(" ", "-"), (p["t"], p["cores"]), fontsize=6,
                                textcoords="offset points", xytext=(0, 4))
    bottom.set_xlabel("seconds")
    fig.tight_layout()
    fig.savefig(stem + ".png", dpi=90)
    plt.close(fig)
    files["png"] = stem + ".png"
    return files


def compare(runs: list[Run]) -> dict:
    """Per workload and elastic config: ratios to all CPUs taken within each round (the same
    load state, minutes apart at most), and their median over the rounds."""
    keys = ("throughput_per_s", "latency_ms_avg", "cpu_seconds", "core_seconds_held")
    by = {(r.engine, r.workload, r.config, r.round): r.summary for r in runs}
    out: dict = {}
    for (engine, workload, config, rnd), s in sorted(by.items()):
        base = by.get((engine, workload, "all", rnd))
        if base is None or config == "all":
            continue
        row = out.setdefault(f"{engine}/{workload}", {}).setdefault(config, {k: [] for k in keys})
        for k in keys:
            row[k].append(round(s[k] / base[k], 3) if base.get(k) else None)
    for workload in out.values():
        for config, row in workload.items():
            workload[config] = {f"{k.replace('_per_s', '').replace('_avg', '')}_ratio":
                                {"median": statistics.median([x for x in v if x is not None]), "per_round": v}
                                for k, v in row.items() if any(x is not None for x in v)}
    return out


def medians(runs: list[Run]) -> dict:
    """Per workload and config: the median over rounds of throughput, latency, CPU and cores."""
    groups: dict = {}
    for r in runs:
        groups.setdefault(f"{r.engine}/{r.workload}", {}).setdefault(r.config, []).append(r.summary)
    return {w: {c: {k: statistics.median([s[k] for s in ss]) for k in
                    ("throughput_per_s", "latency_ms_avg", "cpu_seconds", "mean_cores", "allocations", "releases",
                     "rm_cpu_share_of_a_core")}
                for c, ss in cs.items()} for w, cs in groups.items()}


def rm_cost(runs: list[Run]) -> dict:
    """The daemon's cost of managing a group: one period's work (measure, decide, enforce) and the
    whole daemon's CPU share during elastic runs, beside its share during all-CPU runs (no group)."""
    managed = [r for r in runs if r.config != "all"]
    steps = [float(p["step_cpu_us"]) for r in managed for p in r.periods if "step_cpu_us" in p]
    walls = [float(p["step_us"]) for r in managed for p in r.periods if "step_us" in p]
    share = [r.summary["rm_cpu_share_of_a_core"] for r in managed]
    base = [r.summary["rm_cpu_share_of_a_core"] for r in runs if r.config == "all"]
    return {"period_cpu_us": stats(steps), "period_wall_us": stats(walls),
            "period_cpu_max_us": round(max(steps), 1) if steps else None,
            "target_1ms_met_at_p95": bool(steps) and stats(steps)["p95"] <= 1000,
            "rm_cpu_share_elastic_median": statistics.median(share) if share else None,
            "rm_cpu_share_all_cpus_median": statistics.median(base) if base else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="short runs and small data (a smoke run)")
    ap.add_argument("--out", default=None, help="directory for CSV and PNG files (default: a new temp dir)")
    ap.add_argument("--engines", default="postgres,duckdb")
    ap.add_argument("--duration", type=int, default=6, help="seconds of workload per run")
    ap.add_argument("--rounds", type=int, default=2, help="every config this many times, interleaved")
    ap.add_argument("--lead", type=float, default=1.0, help="idle seconds before the workload")
    ap.add_argument("--tail", type=float, default=2.0, help="idle seconds after it")
    ap.add_argument("--period", type=float, default=ElasticSettings().period_s)
    ap.add_argument("--pg-scale", type=int, default=10)
    ap.add_argument("--lineitem-rows", type=int, default=1_000_000)
    ap.add_argument("--rate", type=int, default=2000, help="transactions/s of the fixed-rate run")
    ap.add_argument("--duckdb-rows", type=int, default=4_000_000)
    ap.add_argument("--net-repeat", type=int, default=20000)
    args = ap.parse_args()
    if args.quick:
        args.duration, args.lead, args.tail, args.rounds = 3, 1.0, 1.5, 1
        args.pg_scale, args.lineitem_rows, args.duckdb_rows, args.net_repeat = 2, 200_000, 1_000_000, 3000
    out_dir = args.out or tempfile.mkdtemp(prefix="cod-elastic-bench-")
    os.makedirs(out_dir, exist_ok=True)
    os.chmod(out_dir, 0o755)
    began = time.monotonic()
    result: dict = {"machine": {"cpus": CPUS, "numa_nodes": len(from_args().numa_nodes)},
                    "loadavg_before": loadavg(), "settings": {**ElasticSettings().__dict__, "period_s": args.period},
                    "out_dir": out_dir}
    result["net"] = bench_net(args.net_repeat)
    runs: list[Run] = []
    engines = args.engines.split(",")
    rm = RM(out_dir)
    result["rm"] = {"enforce_mode": rm.info.get("enforce_mode"), "busy_detect": False, "log": rm.log.name}
    try:
        if "postgres" in engines:
            result["postgres"], pg_runs = bench_postgres(args, out_dir, rm)
            runs += pg_runs
        if "duckdb" in engines:
            result["duckdb"], dd_runs = bench_duckdb(args, out_dir, rm)
            runs += dd_runs
    finally:
        rm.close()
    result["runs"] = [{"engine": r.engine, "workload": r.workload, "config": r.config, **r.summary,
                       "files": write_run(r, out_dir)} for r in runs]
    result["medians"] = medians(runs)
    result["rm_cost"] = rm_cost(runs)
    result["vs_all_cpus"] = compare(runs)
    result["loadavg_after"] = loadavg()
    result["wall_seconds"] = round(time.monotonic() - began, 1)
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Experiment 5, shared-cache interference (MCC-DB, the seed 003; issue 28).

A hash-join-like probe (cachebench.c ``probe``: dependent lookups into a hash table)
runs on one CPU; an index-join-like random reader (``random``) or a scan (``stream``)
runs on another CPU of the *same* L3 domain.  Rows, per hash table size:

  * alone:         the probe by itself;
  * co-run random / co-run stream: the polluter on the other CPU of its L3 domain;
  * SLS:           the polluter on a CPU of *another* L3 domain (what SLS places);
                   skipped when the allowed CPUs share one L3 domain;
  * MLS:           co-run, the polluter in a resctrl group capped at 1/8 of the ways
                   (cod.rm.enforce.resctrl); skipped without a resctrl mount (and root).

The probe's slowdown is its ns per probe co-run over alone (the seed: +56 % for a
hash join co-run with an index join on a 4 MB shared L2).  Hash table sizes are the
seed's (0.78, 2.26, 4.10, 8.92 MB on its 4 MB cache) scaled to this machine's
*effective* cache: the largest table whose probe, measured alone, costs at most half
of the largest table's (the L3 share this VM's CPUs actually get; sysfs's L3 size is
printed beside it).  Times are the worker's own CPU time (a busy shared machine's
descheduling is not counted); each point is the median of --rounds runs.  Miss counters
are read with ``perf stat`` where the PMU has them, and said to be absent otherwise.

Writes results/exp5_cache.json and prints it.
    flock /tmp/cod-bench.lock .venv/bin/python bench/experiments/exp5_cache.py
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import common as c

SEED_CACHE_MB = 4.0
SEED_TABLES_MB = (0.78, 2.26, 4.10, 8.92)
SEED_SLOWDOWN_PCT = 56
MIB = 1 << 20
CALIBRATION_MB = (1, 2, 4, 8, 16, 32, 64, 128)


def build(tmp: Path) -> Path:
    exe = tmp / "cachebench"
    subprocess.run(["cc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(exe),
                    str(Path(__file__).with_name("cachebench.c"))], check=True)
    return exe


def l3_domains(cpus: list[int]) -> dict[int, list[int]]:
    """Allowed CPUs by L3 id (sysfs); one domain of all of them when sysfs says nothing."""
    out: dict[int, list[int]] = {}
    for cpu in cpus:
        try:
            dom = int(Path(f"/sys/devices/system/cpu/cpu{cpu}/cache/index3/id").read_text())
        except (OSError, ValueError):
            dom = 0
        out.setdefault(dom, []).append(cpu)
    return out


def sysfs_l3_bytes(cpu: int) -> int | None:
    try:
        text = Path(f"/sys/devices/system/cpu/cpu{cpu}/cache/index3/size").read_text().strip()
    except OSError:
        return None
    return int(text[:-1]) * 1024 if text.endswith("K") else int(text)


def probe(exe: Path, cpu: int, nbytes: int, seconds: float) -> float:
    out = subprocess.run(["taskset", "-c", str(cpu), str(exe), "probe", str(nbytes), str(seconds)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["ns_per_op"]


class CoRunner:
    """A polluter on ``cpu`` until stopped; started in ``group`` (a resctrl GroupPlan applier) if given."""

    def __init__(self, exe: Path, mode: str, cpu: int, nbytes: int) -> None:
        self.proc = subprocess.Popen(["taskset", "-c", str(cpu), str(exe), mode, str(nbytes), "0"],
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"cachebench {mode} did not start")

    def stop(self) -> float:
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=30)
        return json.loads(out)["ns_per_op"]


def pmu_available() -> bool:
    if not shutil.which("perf"):
        return False
    res = subprocess.run(["perf", "stat", "-x,", "-e", "LLC-load-misses", "true"], capture_output=True, text=True)
    return res.returncode == 0 and "<not supported>" not in res.stderr and "<not counted>" not in res.stderr


def effective_cache(exe: Path, cpu: int, seconds: float) -> tuple[int, dict[int, float]]:
    curve = {mb: probe(exe, cpu, mb * MIB, seconds) for mb in CALIBRATION_MB}
    far = curve[CALIBRATION_MB[-1]]
    fits = [mb for mb, ns in curve.items() if ns <= far / 2]
    return (max(fits) if fits else CALIBRATION_MB[0]) * MIB, curve


def median_probe(exe: Path, cpu: int, nbytes: int, seconds: float, rounds: int,
                 polluter: tuple[str, int, int] | None, mls: object = None) -> dict:
    times, co = [], []
    for _ in range(rounds):
        runner = None
        if polluter is not None:
            mode, pcpu, pbytes = polluter
            runner = CoRunner(exe, mode, pcpu, pbytes)
            if mls is not None:
                mls(runner.proc.pid)  # type: ignore[operator]
        try:
            times.append(probe(exe, cpu, nbytes, seconds))
        finally:
            if runner is not None:
                co.append(runner.stop())
    return {"ns_per_probe": statistics.median(times), "runs": times,
            **({"polluter_ns_per_op": statistics.median(co)} if co else {})}


def mls_applier(cpu: int, state: str):
    """Where resctrl is mounted (and we are root): a weak group of 1/8 of the ways on the probe's
    L3 domain, the rest to the default group; returns (apply(pid), close()) or a reason it is skipped."""
    from cod.rm.allocator.cachepart import Geometry, weak_ways
    from cod.rm.enforce.resctrl import DEFAULT_ROOT, GroupPlan, open_resctrl

    if not os.path.isdir(os.path.join(DEFAULT_ROOT, "info")):
        return f"no resctrl mount at {DEFAULT_ROOT} (no RDT CAT on this machine, or not mounted)"
    if os.geteuid() != 0:
        return "resctrl needs root"
    enf = open_resctrl(DEFAULT_ROOT, state)
    if enf is None or enf.info.l3 is None:
        return "resctrl has no L3 allocation"
    res = enf.info.l3
    geo = Geometry(res.cbm_len, res.min_cbm_bits, enf.info.num_closids, res.domains)
    mask = (1 << weak_ways(geo)) - 1

    def apply(pid: int) -> None:
        enf.apply([GroupPlan("exp5_weak", {d: mask for d in res.domains}, (pid,))])

    return apply, enf.close


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=1.0, help="CPU seconds of each probe run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cache-bytes", type=int, help="the cache the seed's sizes scale to (default: measured)")
    args = ap.parse_args()
    cpus = c.allowed_cpus()
    doms = l3_domains(cpus)
    home = max(doms.values(), key=len)
    if len(home) < 2:
        raise SystemExit("the experiment needs two CPUs sharing an L3 domain")
    a, b = home[0], home[1]
    other = next((cs[0] for d, cs in doms.items() if a not in cs), None)
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(Path(tmp))
        cache, curve = (args.cache_bytes, {}) if args.cache_bytes else effective_cache(exe, a, args.seconds / 2)
        tables = [int(mb / SEED_CACHE_MB * cache) for mb in SEED_TABLES_MB]
        pbytes = max(256 * MIB, 16 * cache)
        skipped = {}
        if other is None:
            skipped["SLS"] = (f"the allowed CPUs {cpus} share one L3 domain: SLS can only co-locate "
                              "here (the allocator says so in cache_policy)")
        mls = mls_applier(a, os.path.join(tmp, "state"))
        if isinstance(mls, str):
            skipped["MLS"] = mls
        pmu = pmu_available()
        if not pmu:
            skipped["miss counters"] = "perf reports LLC-load-misses <not supported> (no PMU in this VM)"
        rows = []
        for size in tables:
            row = {"table_bytes": size, "table_mb": round(size / MIB, 2),
                   "alone": median_probe(exe, a, size, args.seconds, args.rounds, None)}
            for mode in ("random", "stream"):
                row[f"co-run {mode}"] = median_probe(exe, a, size, args.seconds, args.rounds, (mode, b, pbytes))
            if other is not None:
                row["SLS random"] = median_probe(exe, a, size, args.seconds, args.rounds, ("random", other, pbytes))
            if not isinstance(mls, str):
                row["MLS random"] = median_probe(exe, a, size, args.seconds, args.rounds, ("random", b, pbytes),
                                                 mls=mls[0])
            base = row["alone"]["ns_per_probe"]
            row["slowdown_pct"] = {k: round(100 * (v["ns_per_probe"] / base - 1), 1)
                                   for k, v in row.items() if isinstance(v, dict) and k != "alone"}
            rows.append(row)
        if not isinstance(mls, str):
            mls[1]()
    result = {"machine": {"cpus": cpus, "probe_cpu": a, "co_runner_cpu": b, "other_domain_cpu": other,
                          "sysfs_l3_bytes": sysfs_l3_bytes(a), "effective_cache_bytes": cache,
                          "calibration_ns_per_probe": {f"{k} MB": v for k, v in curve.items()}},
              "seed": {"cache_mb": SEED_CACHE_MB, "tables_mb": SEED_TABLES_MB,
                       "hash_join_slowdown_with_index_join_pct": SEED_SLOWDOWN_PCT},
              "polluter_bytes": pbytes, "seconds": args.seconds, "rounds": args.rounds,
              "rows": rows, "skipped": skipped}
    c.print_json(result, "exp5_cache")
    return 0


if __name__ == "__main__":
    sys.exit(main())

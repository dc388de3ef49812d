#!/usr/bin/env python3
"""Experiment 3, adaptability (COD paper, Section 7.4 and Figure 6).

CSCS runs with an SLA; every --every seconds another CPU-bound process
starts.  Response time over time, with each arrival marked, for:
  * naive:    naive CSCS on every core; every newcomer pinned on core 0 (as
              in the paper's naive run);
  * reacting: CSCS that gives a core up to each newcomer while it keeps
              enough cores for its SLA (MinCores from the calibrated cost
              function): newcomer k on core k-1, and the engine is told
              through its control FIFO, so it redistributes its tuples
              (plan_even) and stops the scan thread there.  This is the
              engine's reaction path with the decision made by this script,
              not by COD;
  * COD:      CSCS registers with the RM (its own, under a temporary
              directory) with its SLA and the calibrated cost function; the
              newcomers start unpinned, the RM finds them and places them,
              and CSCS reacts to its upcalls with the redistribution
              procedure of the SKB.

Writes results/exp3_adaptability.csv and results/exp3_adaptability.png;
prints JSON.
    flock /tmp/cod-bench.lock .venv/bin/python bench/experiments/exp3_adaptability.py
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import common as c


def cod_variant(args_common: list[str], arrivals: list[float], cost_fn: Path) -> tuple[c.Run, list[str]]:
    """CSCS under COD; the newcomers start unpinned at `arrivals` and the RM places them.
    Returns the run and the RM's log lines of what it did."""
    with c.cod_rm() as rm, c.stressors() as start:
        live = c.LiveRun(args_common + ["--socket", str(rm.sock), "--cost-fn", str(cost_fn)],
                         c.RESULTS / "exp3_COD.csv")
        try:
            live.wait_started()
            for t in arrivals:
                live.sleep_until(t)
                start(None)
            run = live.finish()
        finally:
            live.kill()
        return run, rm.events()


def naive(args_common: list[str], arrivals: list[float], cpus: list[int]) -> c.Run:
    live = c.LiveRun(args_common + ["--naive"], c.RESULTS / "exp3_naive.csv")
    with c.stressors() as start:
        try:
            live.wait_started()
            for t in arrivals:
                live.sleep_until(t)
                start(cpus[0])
            return live.finish()
        finally:
            live.kill()


def reacting(args_common: list[str], arrivals: list[float], cpus: list[int], min_cores: int) -> c.Run:
    with tempfile.TemporaryDirectory() as d:
        fifo = Path(d) / "control"
        os.mkfifo(fifo)
        live = c.LiveRun(args_common + ["--cores", c.format_cpus(cpus), "--control", str(fifo)],
                         c.RESULTS / "exp3_reacting.csv")
        with c.stressors() as start, open(fifo, "w") as ctl:
            try:
                live.wait_started()
                mine = list(cpus)
                for k, t in enumerate(arrivals):
                    live.sleep_until(t)
                    if len(mine) > min_cores:
                        lost = mine.pop(0)
                        start(lost)
                        ctl.write(f"cores {c.format_cpus(mine)}\n")
                        ctl.flush()
                    else:  # no core to give: the newcomer shares the last one given
                        start(cpus[max(0, len(cpus) - len(mine) - 1)])
                return live.finish()
            finally:
                live.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=80.0, help="run length (default 80)")
    ap.add_argument("--every", type=float, default=20.0, help="seconds between arrivals (default 20)")
    ap.add_argument("--tuples-per-core", type=int, default=c.PAPER_TUPLES_PER_CORE)
    ap.add_argument("--cost-fn", type=Path, default=c.RESULTS / "cost_fn_this_machine.pl",
                    help="calibrated cost function (exp1_deployment.py writes it)")
    ap.add_argument("--sla-factor", type=float, default=2.5,
                    help="SLA as a multiple of the predicted response time on every core (default 2.5)")
    args = ap.parse_args()
    if not args.cost_fn.exists():
        raise SystemExit(f"{args.cost_fn}: no calibrated cost function; run exp1_deployment.py first "
                         "or give --cost-fn")
    c.build()
    c.RESULTS.mkdir(exist_ok=True)
    cpus = c.allowed_cpus()
    tuples = args.tuples_per_core * len(cpus)
    requests = c.PAPER_QUERIES + c.PAPER_UPDATES
    a, b, d = c.read_cost_constants(args.cost_fn)
    sla_ms = round(args.sla_factor * c.model_rt_ms(a, b, tuples, len(cpus), requests, d))
    # MinCores as Listing 3 derives it: the fewest cores the model says meet the SLA.
    min_cores = next(k for k in range(1, len(cpus) + 1)
                     if c.model_rt_ms(a, b, tuples, k, requests, d) <= sla_ms)
    arrivals = [args.every * k for k in range(1, int(args.seconds / args.every)) ]
    common = ["--tuples", str(tuples), "--seconds", str(args.seconds), "--sla-ms", str(sla_ms),
              "--batch-queries", str(c.PAPER_QUERIES), "--batch-updates", str(c.PAPER_UPDATES)]
    before = c.machine_state()
    runs = {"naive": naive(common, arrivals, cpus), "reacting": reacting(common, arrivals, cpus, min_cores)}
    cod_log: list[str] = []
    if len(cpus) > 1:
        runs["COD"], cod_log = cod_variant(common, arrivals, args.cost_fn)
    rows = []
    for name, run in runs.items():
        for r in run.rows:
            rows.append({"variant": name, "time_s": r["time_s"], "cores": r["cores"], "rt_ms": r["rt_ms"],
                         "reconfig_ms": r["reconfig_ms"], "sla_met": r["sla_met"]})
    c.write_csv(c.RESULTS / "exp3_adaptability.csv", rows)
    for name in runs:
        (c.RESULTS / f"exp3_{name}.csv").unlink(missing_ok=True)
    summary = {}
    for name, run in runs.items():
        phases = []
        bounds = [0.0] + arrivals + [float("inf")]
        for lo, hi in zip(bounds, bounds[1:]):
            rts = [float(r["rt_ms"]) for r in run.rows if lo <= float(r["time_s"]) < hi]
            if rts:
                phases.append({"from_s": lo, "newcomers": bounds.index(lo), "batches": len(rts),
                               "mean_rt_ms": round(sum(rts) / len(rts), 1), "max_rt_ms": round(max(rts), 1)})
        summary[name] = {"sla_met": f"{sum(int(r['sla_met']) for r in run.rows)}/{len(run.rows)}",
                         "phases": phases}
        if name == "COD":
            summary[name]["cod_lines"] = [line for line in run.stdout.splitlines() if line.startswith("# ")]
            summary[name]["rm_log"] = cod_log
    plot(runs, arrivals, sla_ms, len(cpus), c.RESULTS / "exp3_adaptability.png")
    c.print_json({"experiment": "adaptability (Figure 6)", "cpus": len(cpus), "tuples": tuples,
                  "sla_ms": sla_ms, "min_cores": min_cores, "arrivals_s": arrivals, "summary": summary,
                  "machine_state_before": before, "machine_state_after": c.machine_state()}, "exp3_adaptability")


def plot(runs: dict, arrivals: list[float], sla_ms: float, ncpus: int, path) -> None:
    plt = c.pyplot()
    fig, ax = plt.subplots(figsize=(10, 4.5))
    for name, run in runs.items():
        ax.plot([float(r["time_s"]) for r in run.rows], [float(r["rt_ms"]) for r in run.rows],
                label=name, lw=1.2)
    ax.axhline(sla_ms, color="red", ls="--", lw=1, label=f"SLA {sla_ms} ms")
    for i, t in enumerate(arrivals):
        ax.axvline(t, color="grey", ls=":", lw=1)
        ax.text(t, ax.get_ylim()[1] * 0.97, f" +{i + 1}", va="top", fontsize=8, color="grey")
    ax.set_xlabel("time (s); dotted: a CPU-bound process arrives")
    ax.set_ylabel("batch response time (ms)")
    ax.set_title(f"CSCS adapting to newcomers, {ncpus} CPUs (Figure 6)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()

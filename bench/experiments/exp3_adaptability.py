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

The COD variant can run once per enforcement mode (``--enforce cpuset,sched_ext``: the
RM's --enforce, scx_cod loaded for sched_ext by enforcement.py), with the newcomers as
percpu programs (``--percpu``) whose run time on the CPUs the RM keeps for CSCS is measured;
``--calibrate`` fits the cost function here, at the run's own size, and ``--cscs-cpus N``
leaves CSCS N CPUs so that the others are nobody's.  tests/vm/fig6_scx.py runs it so in the
sched_ext guest (docs/experiments.md, section 3).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import common as c
import enforcement as e


@dataclass(frozen=True)
class Setup:
    """How the variants run: CSCS's CPUs and the command it runs under (taskset when it is
    left fewer than every CPU; under COD it asks for that many cores instead, --max-cores, as
    sched_ext enforcement leaves a taskset mask in place), and the COD variant's RM options
    and newcomers."""

    cpus: list[int]
    prefix: tuple[str, ...] = ()
    rm_args: tuple[str, ...] = ()
    rm_start_timeout: float = 30.0
    percpu: bool = False


def cod_variant(args_common: list[str], arrivals: list[float], cost_fn: Path, setup: Setup,
                enforce: str | None, seconds: float) -> tuple[c.Run, dict]:
    """CSCS under COD, the RM enforcing by ``enforce`` (None: its default); the newcomers start
    unpinned at `arrivals` and the RM places them.  Returns the run and what else was seen: the
    RM's log lines of what it did, the enforcement in force, and (--percpu) where each newcomer ran."""
    slug = f"COD_{enforce}" if enforce else "COD"
    extra = (*setup.rm_args, *(("--enforce", enforce) if enforce else ()))
    newcomer = e.percpu_newcomer() if setup.percpu else nullcontext(None)
    with e.scheduler(enforce) as sched, newcomer as command, c.cod_rm(extra, setup.rm_start_timeout) as rm, \
            c.stressors() as start:
        cap = ["--max-cores", str(len(setup.cpus))] if setup.prefix else []
        live = c.LiveRun(args_common + cap + ["--socket", str(rm.sock), "--cost-fn", str(cost_fn)],
                         c.RESULTS / f"exp3_{slug}.csv")
        poller, started = None, []
        try:
            live.wait_started()
            poller = e.AllocationPoller(rm.sock, "cscs")
            for t in arrivals:
                live.sleep_until(t)
                started.append((t, start(None, None if command is None else command(seconds - live.elapsed()))))
            run = live.finish()
            newcomers = [e.newcomer_figures(json.loads(p.communicate(timeout=600)[0]), poller.samples,
                                            int(live.t0 * 1e9), t) for t, p in started if command is not None]
        finally:
            if poller is not None:
                poller.stop()
            live.kill()
        seen = {"scheduler": sched, "enforcement": poller.enforcement, "rm_log": rm.events(),
                "allocation_samples": len(poller.samples), "poller_error": poller.error}
        if command is not None:
            seen["newcomers"] = [figures for figures, _rows in newcomers]
            seen["newcomers_ms_on_cscs_cpus"] = round(sum(n["ms_on_task_cpus"] for n in seen["newcomers"]), 3)
            seen["slices"] = [row for _figures, rows in newcomers for row in rows]  # a CSV of its own
        return run, seen


def naive(args_common: list[str], arrivals: list[float], setup: Setup) -> c.Run:
    cpus = setup.cpus
    live = c.LiveRun(args_common + ["--naive"], c.RESULTS / "exp3_naive.csv", setup.prefix)
    with c.stressors() as start:
        try:
            live.wait_started()
            for t in arrivals:
                live.sleep_until(t)
                start(cpus[0])
            return live.finish()
        finally:
            live.kill()


def reacting(args_common: list[str], arrivals: list[float], setup: Setup, min_cores: int) -> c.Run:
    cpus = setup.cpus
    with tempfile.TemporaryDirectory() as d:
        fifo = Path(d) / "control"
        os.mkfifo(fifo)
        live = c.LiveRun(args_common + ["--cores", c.format_cpus(cpus), "--control", str(fifo)],
                         c.RESULTS / "exp3_reacting.csv", setup.prefix)
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


VARIANTS = ("naive", "reacting", "COD")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=80.0, help="run length (default 80)")
    ap.add_argument("--every", type=float, default=20.0, help="seconds between arrivals (default 20)")
    ap.add_argument("--tuples-per-core", type=int, default=c.PAPER_TUPLES_PER_CORE)
    ap.add_argument("--batch-queries", type=int, default=c.PAPER_QUERIES)
    ap.add_argument("--batch-updates", type=int, default=c.PAPER_UPDATES)
    ap.add_argument("--cost-fn", type=Path, default=c.RESULTS / "cost_fn_this_machine.pl",
                    help="calibrated cost function (exp1_deployment.py writes it)")
    ap.add_argument("--calibrate", action="store_true",
                    help="calibrate the cost function here first, at this run's tuples per core and batch size, "
                         "on wall-clock time (exp1's calibration; for a guest under emulation)")
    ap.add_argument("--sla-factor", type=float, default=2.5,
                    help="SLA as a multiple of the predicted response time on every core (default 2.5)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"which to run (default {','.join(VARIANTS)})")
    ap.add_argument("--enforce", default="",
                    help="COD's enforcement modes, one run each (e.g. cpuset,sched_ext; default: the RM's own)")
    ap.add_argument("--cscs-cpus", type=int, default=0,
                    help="CSCS may use this many CPUs (the last ones; default every CPU): the rest are nobody's")
    ap.add_argument("--percpu", action="store_true",
                    help="COD's newcomers record where they ran (tests/vm/percpu.c); their time on CSCS's CPUs "
                         "is reported")
    ap.add_argument("--rm-args", default="", help="more options for the RM (one string, shell words)")
    ap.add_argument("--rm-start-timeout", type=float, default=30.0, help="seconds the RM may take to start")
    ap.add_argument("--out", default="exp3_adaptability", help="results' name (default exp3_adaptability)")
    args = ap.parse_args()
    args.variants = [v for v in args.variants.split(",") if v]
    args.enforce = [m for m in args.enforce.split(",") if m]
    if unknown := set(args.variants) - set(VARIANTS):
        ap.error(f"--variants: unknown {sorted(unknown)} (known: {', '.join(VARIANTS)})")
    if unknown := set(args.enforce) - {"affinity", "cpuset", "sched_ext"}:
        ap.error(f"--enforce: unknown {sorted(unknown)} (affinity, cpuset, sched_ext)")
    return args


def setup_of(args: argparse.Namespace) -> Setup:
    cpus = c.allowed_cpus()
    if args.cscs_cpus:
        if not 0 < args.cscs_cpus <= len(cpus):
            raise SystemExit(f"--cscs-cpus {args.cscs_cpus}: this machine allows CPUs {c.format_cpus(cpus)}")
        cpus = cpus[-args.cscs_cpus:]
    prefix = ("taskset", "-c", c.format_cpus(cpus)) if cpus != c.allowed_cpus() else ()
    return Setup(cpus, prefix, tuple(shlex.split(args.rm_args)), args.rm_start_timeout, args.percpu)


def cost_function(args: argparse.Namespace, setup: Setup) -> tuple[Path, dict | None]:
    """The calibrated cost function to use, and the calibration's fit when it was made here."""
    if not args.calibrate:
        if not args.cost_fn.exists():
            raise SystemExit(f"{args.cost_fn}: no calibrated cost function; run exp1_deployment.py first, "
                             "give --cost-fn or --calibrate")
        return args.cost_fn, None
    from exp1_deployment import calibrate

    r = args.batch_queries + args.batch_updates
    out = c.RESULTS / f"{args.out}_cost_fn.pl"
    points = ("--tuples-per-core", str(args.tuples_per_core), "--requests", f"{r // 2},{r},{2 * r}",
              "--batches", "5", "--wall")
    return out, calibrate(out, c.RESULTS / f"{args.out}_calibration.csv", "paper", points, setup.prefix)


def run_variants(args, setup: Setup, common: list[str], arrivals: list[float], cost_fn: Path,
                 min_cores: int) -> tuple[dict, dict]:
    runs, seen = {}, {}
    if "naive" in args.variants:
        runs["naive"] = naive(common, arrivals, setup)
    if "reacting" in args.variants:
        runs["reacting"] = reacting(common, arrivals, setup, min_cores)
    if "COD" in args.variants and len(c.allowed_cpus()) > 1:
        for mode in args.enforce or [None]:
            name = f"COD {mode}" if mode else "COD"
            runs[name], seen[name] = cod_variant(common, arrivals, cost_fn, setup, mode, args.seconds)
    return runs, seen


def phases_of(run: c.Run, arrivals: list[float], sla_ms: float) -> list[dict]:
    """Per stretch between arrivals: batches, response times, and those over the SLA (the last
    one's end in s after the stretch began)."""
    phases = []
    bounds = [0.0] + arrivals + [float("inf")]
    for k, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        rows = [r for r in run.rows if lo <= float(r["time_s"]) < hi]
        rts = [float(r["rt_ms"]) for r in rows]
        over = [float(r["time_s"]) - lo for r in rows if float(r["rt_ms"]) > sla_ms]
        if rts:
            phases.append({"from_s": lo, "newcomers": k, "batches": len(rts),
                           "mean_rt_ms": round(sum(rts) / len(rts), 1), "max_rt_ms": round(max(rts), 1),
                           "over_sla": len(over), "last_over_sla_after_s": round(max(over), 2) if over else None})
    return phases


def main() -> None:
    args = parse_args()
    c.build()
    c.RESULTS.mkdir(exist_ok=True)
    setup = setup_of(args)
    before = c.machine_state()
    cost_fn, fit = cost_function(args, setup)
    cpus = setup.cpus
    tuples = args.tuples_per_core * len(cpus)
    requests = args.batch_queries + args.batch_updates
    a, b, d = c.read_cost_constants(cost_fn)
    sla_ms = round(args.sla_factor * c.model_rt_ms(a, b, tuples, len(cpus), requests, d))
    # MinCores as Listing 3 derives it: the fewest cores the model says meet the SLA.
    min_cores = next(k for k in range(1, len(cpus) + 1)
                     if c.model_rt_ms(a, b, tuples, k, requests, d) <= sla_ms)
    arrivals = [args.every * k for k in range(1, int(args.seconds / args.every)) ]
    common = ["--tuples", str(tuples), "--seconds", str(args.seconds), "--sla-ms", str(sla_ms),
              "--batch-queries", str(args.batch_queries), "--batch-updates", str(args.batch_updates)]
    runs, seen = run_variants(args, setup, common, arrivals, cost_fn, min_cores)
    rows = []
    for name, run in runs.items():
        for r in run.rows:
            rows.append({"variant": name, "time_s": r["time_s"], "cores": r["cores"], "rt_ms": r["rt_ms"],
                         "reconfig_ms": r["reconfig_ms"], "sla_met": r["sla_met"]})
    c.write_csv(c.RESULTS / f"{args.out}.csv", rows)
    for name in runs:
        (c.RESULTS / f"exp3_{name.replace(' ', '_')}.csv").unlink(missing_ok=True)
    summary, slices = {}, []
    for name, run in runs.items():
        summary[name] = {"sla_met": f"{sum(int(r['sla_met']) for r in run.rows)}/{len(run.rows)}",
                         "phases": phases_of(run, arrivals, sla_ms)}
        if name in seen:
            summary[name]["cod_lines"] = [line for line in run.stdout.splitlines() if line.startswith("# ")]
            summary[name].update(seen[name])
            slices += [{"variant": name, **row} for row in summary[name].pop("slices", [])]
    if slices:  # the newcomers' slices on CPUs CSCS held at some time (enforcement.newcomer_figures)
        c.write_csv(c.RESULTS / f"{args.out}_slices.csv", slices)
    plot(runs, arrivals, sla_ms, len(cpus), c.RESULTS / f"{args.out}.png")
    c.print_json({"experiment": "adaptability (Figure 6)", "cpus": len(c.allowed_cpus()), "cscs_cpus": cpus,
                  "tuples": tuples, "batch_requests": requests, "sla_ms": sla_ms, "min_cores": min_cores,
                  "cost_fn": {"a": a, "b": b, "d": d, "calibrated_here": fit}, "arrivals_s": arrivals,
                  "summary": summary, "machine_state_before": before, "machine_state_after": c.machine_state()},
                 args.out)


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
    ax.set_title(f"CSCS adapting to newcomers, {ncpus} CPUs for CSCS (Figure 6)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()

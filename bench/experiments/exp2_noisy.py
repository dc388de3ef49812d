#!/usr/bin/env python3
"""Experiment 2, a noisy system (COD paper, Section 7.3 and Figure 5).

A CPU-bound stressor is pinned on core 0 before CSCS starts.  Throughput
(queries/s) over batch sizes from 512 queries + 128 updates to 4096 + 1024,
for:
  * alone:          naive CSCS on every core, no stressor (the baseline);
  * naive:          naive CSCS on every core, stressor on core 0;
  * stressor's core left out: CSCS started on every core but core 0 (static;
                    the allocation COD computes for this case, given by hand);
  * COD:            CSCS under COD: the RM (its own, under a temporary
                    directory) finds the stressor, keeps a CPU for it, and
                    CSCS registers and scans on the CPUs it is given.
The dataset is the paper's 3.75 M tuples per core (180 M on 48 cores).
Each point is the median of --rounds runs per variant, the variants taking
turns so that the rest of the machine's load drifts over all of them.

Writes results/exp2_noisy.csv and results/exp2_noisy.png; prints JSON.
    flock /tmp/cod-bench.lock .venv/bin/python bench/experiments/exp2_noisy.py
"""

from __future__ import annotations

import argparse
import statistics

import common as c

BATCHES = [(512, 128), (1024, 256), (2048, 512), (4096, 1024)]  # Section 7.3


def cod_variant(common: list[str], cpus: list[int], csv_path) -> c.Run:
    """CSCS under COD with the stressor pinned on core 0 before it starts: the RM records the
    stressor first (as the paper's setup has it), then CSCS registers and gets its cores."""
    with c.cod_rm() as rm, c.stressors() as start:
        hog = start(cpus[0])
        rm.wait_other(hog.pid)
        return c.run_cscs(common + ["--socket", str(rm.sock)], csv_path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="run length per point and round (default 8)")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each variant per batch size (default 3)")
    ap.add_argument("--tuples-per-core", type=int, default=c.PAPER_TUPLES_PER_CORE)
    args = ap.parse_args()
    c.build()
    c.RESULTS.mkdir(exist_ok=True)
    cpus = c.allowed_cpus()
    tuples = args.tuples_per_core * len(cpus)
    before = c.machine_state()
    rows = []
    variants = ["alone", "naive"] + (["left_out", "cod"] if len(cpus) > 1 else [])
    for q, u in BATCHES:
        common = ["--tuples", str(tuples), "--seconds", str(args.seconds),
                  "--batch-queries", str(q), "--batch-updates", str(u)]
        samples: dict[str, list[float]] = {v: [] for v in variants}
        cod_cores: list[str] = []
        # Rounds of every variant in turn, so that the load of the rest of
        # the machine drifts over all of them alike; the median of each.
        for _ in range(args.rounds):
            for v in variants:
                if v == "alone":
                    run = c.run_cscs(common + ["--naive"], c.RESULTS / "exp2_run.csv")
                elif v == "cod":
                    run = cod_variant(common, cpus, c.RESULTS / "exp2_run.csv")
                    cod_cores.append(run.rows[-1]["cpus"])
                else:
                    with c.stressors() as start:
                        start(cpus[0])
                        extra = ["--naive"] if v == "naive" else ["--cores", c.format_cpus(cpus[1:])]
                        run = c.run_cscs(common + extra, c.RESULTS / "exp2_run.csv")
                samples[v].append(run.throughput_qps())
        point = {"queries": q, "updates": u}
        for v in variants:
            point[f"{v}_qps"] = round(statistics.median(samples[v]))
            point[f"{v}_qps_min"] = round(min(samples[v]))
            point[f"{v}_qps_max"] = round(max(samples[v]))
        if cod_cores:
            point["cod_cpus"] = " ".join(sorted(set(cod_cores)))
        for v in variants[1:]:
            point[f"{v}_loss_pct"] = round(100 * (1 - point[f"{v}_qps"] / point["alone_qps"]), 1)
        point["loadavg"] = " ".join(f"{x:.1f}" for x in c.machine_state()["loadavg"])
        print(point, flush=True)
        rows.append(point)
    (c.RESULTS / "exp2_run.csv").unlink(missing_ok=True)
    c.write_csv(c.RESULTS / "exp2_noisy.csv", rows)
    plot(rows, len(cpus), c.RESULTS / "exp2_noisy.png")
    c.print_json({"experiment": "noisy system (Figure 5)", "cpus": len(cpus), "tuples": tuples, "rows": rows,
                  "machine_state_before": before, "machine_state_after": c.machine_state()}, "exp2_noisy")


def plot(rows: list[dict], ncpus: int, path) -> None:
    plt = c.pyplot()
    series = [("alone_qps", "alone (no stressor)"), ("naive_qps", "naive, stressor on core 0"),
              ("left_out_qps", "stressor's core left out (static)"), ("cod_qps", "COD")]
    series = [(k, label) for k, label in series if any(r.get(k) not in ("", None) for r in rows)]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(series)
    for i, (key, label) in enumerate(series):
        xs = [x - 0.4 + width * (i + 0.5) for x in range(len(rows))]
        ax.bar(xs, [r[key] or 0 for r in rows], width, label=label)
        if f"{key}_min" in rows[0]:
            ax.errorbar(xs, [r[key] for r in rows],
                        yerr=[[r[key] - r[f"{key}_min"] for r in rows], [r[f"{key}_max"] - r[key] for r in rows]],
                        fmt="none", ecolor="black", capsize=2, lw=0.8)
    ax.set_xticks(range(len(rows)), [f"{r['queries']} q + {r['updates']} u" for r in rows])
    ax.set_ylabel("throughput (queries/s), median and range of runs")
    ax.set_title(f"CSCS in a noisy system, {ncpus} CPUs (Figure 5)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()

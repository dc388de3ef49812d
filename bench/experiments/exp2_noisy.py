#!/usr/bin/env python3
"""Experiment 2, a noisy system (COD paper, Section 7.3 and Figure 5).

A CPU-bound stressor is pinned on core 0 before CSCS starts.  Throughput
(queries/s) over batch sizes from 512 queries + 128 updates to 4096 + 1024,
for:
  * alone:          naive CSCS on every core, no stressor (the baseline);
  * naive:          naive CSCS on every core, stressor on core 0;
  * stressor's core left out: CSCS started on every core but core 0 (static;
                    the allocation COD computes for this case, given by hand);
  * COD:            CSCS under COD (phase 2: needs libcod; see cod_variant).
The dataset is the paper's 3.75 M tuples per core (180 M on 48 cores).

Writes results/exp2_noisy.csv and results/exp2_noisy.png; prints JSON.
    flock /tmp/cod-bench.lock .venv/bin/python bench/experiments/exp2_noisy.py
"""

from __future__ import annotations

import argparse

import common as c

BATCHES = [(512, 128), (1024, 256), (2048, 512), (4096, 1024)]  # Section 7.3


def cod_variant(tuples: int, queries: int, updates: int, seconds: float) -> c.Run | None:
    """CSCS under COD: phase 2 starts the RM, runs `cscs run --socket ...`
    with the stressor registered or detected, and returns the run.  Until
    libcod exists the engine refuses --socket, so there is no COD series."""
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=15.0, help="run length per point (default 15)")
    ap.add_argument("--tuples-per-core", type=int, default=c.PAPER_TUPLES_PER_CORE)
    args = ap.parse_args()
    c.build()
    c.RESULTS.mkdir(exist_ok=True)
    cpus = c.allowed_cpus()
    tuples = args.tuples_per_core * len(cpus)
    before = c.machine_state()
    rows = []
    for q, u in BATCHES:
        common = ["--tuples", str(tuples), "--seconds", str(args.seconds),
                  "--batch-queries", str(q), "--batch-updates", str(u)]
        point = {"queries": q, "updates": u}
        run = c.run_cscs(common + ["--naive"], c.RESULTS / "exp2_run.csv")
        point["alone_qps"] = round(run.throughput_qps())
        with c.stressors() as start:
            start(cpus[0])
            run = c.run_cscs(common + ["--naive"], c.RESULTS / "exp2_run.csv")
            point["naive_qps"] = round(run.throughput_qps())
            if len(cpus) > 1:
                run = c.run_cscs(common + ["--cores", c.format_cpus(cpus[1:])], c.RESULTS / "exp2_run.csv")
                point["left_out_qps"] = round(run.throughput_qps())
            cod = cod_variant(tuples, q, u, args.seconds)
            point["cod_qps"] = round(cod.throughput_qps()) if cod else ""
        point["naive_loss_pct"] = round(100 * (1 - point["naive_qps"] / point["alone_qps"]), 1)
        if "left_out_qps" in point:
            point["left_out_loss_pct"] = round(100 * (1 - point["left_out_qps"] / point["alone_qps"]), 1)
        print(point, flush=True)
        rows.append(point)
    (c.RESULTS / "exp2_run.csv").unlink(missing_ok=True)
    c.write_csv(c.RESULTS / "exp2_noisy.csv", rows)
    plot(rows, len(cpus), c.RESULTS / "exp2_noisy.png")
    c.print_json({"experiment": "noisy system (Figure 5)", "cpus": len(cpus), "tuples": tuples, "rows": rows,
                  "machine_state_before": before, "machine_state_after": c.machine_state()})


def plot(rows: list[dict], ncpus: int, path) -> None:
    plt = c.pyplot()
    series = [("alone_qps", "alone (no stressor)"), ("naive_qps", "naive, stressor on core 0"),
              ("left_out_qps", "stressor's core left out (static)"), ("cod_qps", "COD")]
    series = [(k, label) for k, label in series if any(r.get(k) not in ("", None) for r in rows)]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(series)
    for i, (key, label) in enumerate(series):
        ax.bar([x - 0.4 + width * (i + 0.5) for x in range(len(rows))], [r[key] or 0 for r in rows], width,
               label=label)
    ax.set_xticks(range(len(rows)), [f"{r['queries']} q + {r['updates']} u" for r in rows])
    ax.set_ylabel("throughput (queries/s)")
    ax.set_title(f"CSCS in a noisy system, {ncpus} CPUs (Figure 5)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Experiment 1, deployment (COD paper, Section 7.2 and Table 3).

1. The deployment the SKB derives (Listing 3, stored_procedures/cscs.pl) for
   SLAs of 2, 4 and 8 s and the dataset of Section 7.2 on the four
   reference machines, printed beside the paper's Table 3.
2. On this machine: calibrate the cost function (`cscs calibrate`), size the
   dataset to this machine's memory, derive the deployment for the paper's
   SLAs and for SLAs scaled to this machine, run CSCS on the derived number
   of cores, and compare the predicted with the measured response time.

Writes results/exp1_table3.csv, results/exp1_this_machine.csv,
results/exp1_calibration.csv, results/cost_fn_this_machine.pl and
results/exp1_deployment.png; prints JSON.  Run under the benchmark lock:
    flock /tmp/cod-bench.lock .venv/bin/python bench/experiments/exp1_deployment.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from pathlib import Path

import common as c
from cod.facts import discover, machines
from cod.skb import SKB

# Table 3 of the paper: machine -> SLA s -> (cores by cost function, cores by
# NUMA node size, total cores, partition GB, measured mean response time s).
PAPER_TABLE3 = {
    "nehalem-ex": {2: (8, 1, 8, 1.0, 1.66), 4: (4, 1, 4, 2.0, 3.27), 8: (2, 1, 2, 4.0, 6.54)},
    "barcelona": {2: (8, 5, 8, 1.0, 2.18), 4: (4, 5, 5, 1.6, 3.55), 8: (2, 5, 5, 1.6, 3.55)},
    "shanghai": {2: (8, 3, 8, 1.0, 1.68), 4: (4, 3, 4, 2.0, 3.25), 8: (2, 3, 3, 2.67, 4.33)},
    "magnycours": {2: (8, 1, 8, 1.0, 1.87), 4: (4, 1, 4, 2.0, 3.71), 8: (2, 1, 2, 4.0, 7.37)},
}
PAPER_SLAS_S = (2, 4, 8)
# The Table 3 core counts follow from 2048 requests per batch in all (see
# docs/design.md, "Listing 3 and Table 3").
TABLE3_QUERIES, TABLE3_UPDATES = 2048, 0
# On this machine, besides the paper's SLAs: SLAs at these fractions of the
# predicted one-core response time, so that the derived core count varies
# (the last one usually asks for more cores than the machine has).
SCALED_SLA_FACTORS = (1.3, 0.7, 0.35)

DERIVE = (
    "db_ntuple(T), db_tsize(B), db_nquery(Q), db_nupdate(U), db_rtime(R), Req is Q + U, "
    "db_cost_fn(T, Req, R, CostCores0), CostCores is max(1, ceiling(CostCores0)), "
    "get_list_numa_sizes(Ns), min_list(Ns, M), NumaCores is max(1, ceiling(T * B / M)), "
    "dbos_cost_function(S, N, P)"
)


def derive(skb: SKB, sla_ms: int) -> dict:
    skb.remove_facts("cscs", "db_rtime(_)")
    skb.add_facts("cscs", [f"db_rtime({sla_ms})"])
    [a] = skb.execute_query("cscs", DERIVE)
    return {"status": a["S"], "cost_cores": a["CostCores"], "numa_cores": a["NumaCores"],
            "cores": a["N"], "part_bytes": a["P"]}


def cscs_skb(machine, tuples: int, queries: int, updates: int, cost_fn: str) -> SKB:
    skb = SKB()
    skb.load_machine(machine)
    skb.add_facts("cscs", [f"db_ntuple({tuples})", f"db_tsize({c.TUPLE_BYTES})",
                           f"db_nquery({queries})", f"db_nupdate({updates})"])
    skb.add_procedure("cscs", cost_fn)
    return skb


def reference_machines() -> list[dict]:
    rows = []
    cost_fn = c.PAPER_COST_FN.read_text()
    for name, paper in PAPER_TABLE3.items():
        with cscs_skb(machines.load(name), c.PAPER_TUPLES, TABLE3_QUERIES, TABLE3_UPDATES, cost_fn) as skb:
            for sla_s in PAPER_SLAS_S:
                d = derive(skb, sla_s * 1000)
                p = paper[sla_s]
                rows.append({
                    "machine": name, "sla_s": sla_s,
                    "paper_cost_cores": p[0], "paper_numa_cores": p[1], "paper_cores": p[2],
                    "paper_part_gb": p[3], "paper_measured_s": p[4],
                    "skb_status": d["status"], "skb_cost_cores": d["cost_cores"],
                    "skb_numa_cores": d["numa_cores"], "skb_cores": d["cores"],
                    "skb_part_gb": round(d["part_bytes"] / 2**30, 2),
                    "model_rt_s": round(c.model_rt_ms(c.PAPER_A, c.PAPER_B, c.PAPER_TUPLES, d["cores"],
                                                      TABLE3_QUERIES + TABLE3_UPDATES) / 1000, 2),
                    "same_cores": d["cores"] == p[2],
                })
    return rows


def print_table3(rows: list[dict]) -> None:
    print(f"{'machine':<11} {'SLA':>4} | {'cost fn':>7} {'NUMA':>4} {'cores':>5} {'part GB':>7} {'RT s':>5} "
          f"| paper: {'cost fn':>7} {'NUMA':>4} {'cores':>5} {'part GB':>7} {'RT s':>5}")
    for r in rows:
        print(f"{r['machine']:<11} {r['sla_s']:>3}s | {r['skb_cost_cores']:>7} {r['skb_numa_cores']:>4} "
              f"{r['skb_cores']:>5} {r['skb_part_gb']:>7} {r['model_rt_s']:>5} "
              f"|        {r['paper_cost_cores']:>7} {r['paper_numa_cores']:>4} {r['paper_cores']:>5} "
              f"{r['paper_part_gb']:>7} {r['paper_measured_s']:>5}")
    print("(RT s: ours is the Section 4.4 model's prediction for the derived cores; "
          "the paper's is its measured mean)")


# The points exp1 calibrates at (the paper's dataset is 30 M tuples, 2560 requests a batch).
CALIBRATION_POINTS = ("--tuples-per-core", "1M,4M,16M", "--requests", "640,2560,5120")


def calibrate(out: Path, csv_path: Path, model: str, points: tuple[str, ...] = CALIBRATION_POINTS,
              prefix: tuple[str, ...] = ()) -> dict:
    """`cscs calibrate` at ``points`` (its options), run under ``prefix`` (e.g. taskset); the fit's JSON."""
    cmd = [*prefix, str(c.CSCS), "calibrate", *points, "--model", model, "--out", str(out), "--csv", str(csv_path)]
    print("$", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    print(proc.stdout, end="")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def this_machine(cost_fn_path: Path, seconds: float) -> tuple[list[dict], dict]:
    a, b, d_req = c.read_cost_constants(cost_fn_path)
    cpus = c.allowed_cpus()
    # The paper's dataset if it fits in half of the memory available now,
    # else as much as does.
    tuples = min(c.PAPER_TUPLES, c.mem_available_bytes() // 2 // c.TUPLE_BYTES)
    requests = c.PAPER_QUERIES + c.PAPER_UPDATES
    rt1 = c.model_rt_ms(a, b, tuples, 1, requests, d_req)
    slas = [(s * 1000, "paper") for s in PAPER_SLAS_S]
    slas += [(int(round(rt1 * f, -1)), f"{f} x one-core RT") for f in SCALED_SLA_FACTORS]
    derived = []
    with cscs_skb(discover.from_args(), tuples, c.PAPER_QUERIES, c.PAPER_UPDATES,
                  cost_fn_path.read_text()) as skb:
        for sla_ms, why in slas:
            derived.append((sla_ms, why, derive(skb, sla_ms)))
    runs: dict[int, c.Run] = {}
    for n in sorted({d["cores"] for _, _, d in derived if d["status"] == 0}):
        runs[n] = c.run_cscs(
            ["--tuples", str(tuples), "--seconds", str(seconds), "--cores", c.format_cpus(cpus[:n]),
             "--batch-queries", str(c.PAPER_QUERIES), "--batch-updates", str(c.PAPER_UPDATES)],
            c.RESULTS / f"exp1_run_{n}cores.csv")
    rows = []
    for sla_ms, why, d in derived:
        row = {"sla_ms": sla_ms, "sla_from": why, "status": d["status"], "cost_cores": d["cost_cores"],
               "numa_cores": d["numa_cores"], "cores": d["cores"],
               "part_gb": round(d["part_bytes"] / 2**30, 2),
               "predicted_ms": round(c.model_rt_ms(a, b, tuples, d["cores"], requests, d_req), 1)}
        run = runs.get(d["cores"]) if d["status"] == 0 else None
        if run:
            rts, own = run.rt_ms[1:], run.own_cores_rt_ms[1:]
            row.update({"batches": len(rts), "measured_mean_ms": round(statistics.mean(rts), 1),
                        "own_cores_mean_ms": round(statistics.mean(own), 1),
                        "measured_p95_ms": round(sorted(rts)[int(0.95 * (len(rts) - 1))], 1),
                        "measured_max_ms": round(max(rts), 1),
                        "sla_met_batches": sum(rt <= sla_ms for rt in rts),
                        "error_pct": round(100 * (row["predicted_ms"] - statistics.mean(rts))
                                           / statistics.mean(rts), 1)})
        else:
            row.update({"batches": 0, "measured_mean_ms": "", "own_cores_mean_ms": "", "measured_p95_ms": "",
                        "measured_max_ms": "",
                        "sla_met_batches": "", "error_pct": ""})
        rows.append(row)
    info = {"tuples": tuples, "dataset_gb": round(tuples * c.TUPLE_BYTES / 1e9, 2), "a": a, "b": b, "d": d_req,
            "requests_per_batch": requests, "one_core_predicted_ms": round(rt1, 1), "cpus": len(cpus)}
    return rows, info


def print_this_machine(rows: list[dict], info: dict) -> None:
    print(f"\nthis machine: {info['tuples']} tuples ({info['dataset_gb']} GB), {info['requests_per_batch']} "
          f"requests per batch, a = {info['a']:.4g}, b = {info['b']:.4g}")
    print(f"{'SLA ms':>7} {'from':<20} {'status':>6} {'cores':>5} {'pred ms':>8} {'mean ms':>8} "
          f"{'own ms':>7} {'p95 ms':>7} {'max ms':>7} {'met':>7}")
    for r in rows:
        met = f"{r['sla_met_batches']}/{r['batches']}" if r["batches"] else "-"
        print(f"{r['sla_ms']:>7} {r['sla_from']:<20} {r['status']:>6} {r['cores']:>5} {r['predicted_ms']:>8} "
              f"{r['measured_mean_ms']:>8} {r['own_cores_mean_ms']:>7} {r['measured_p95_ms']:>7} "
              f"{r['measured_max_ms']:>7} {met:>7}")
    print("(status 1: the SLA needs more cores than this machine has; not run.  mean/p95/max: wall-clock;\n"
          " own: the same batches with the scan threads' CPU time, as on cores of their own)")


def plot(ref: list[dict], mine: list[dict], info: dict, path: Path) -> None:
    plt = c.pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    labels = [f"{r['machine']}\n{r['sla_s']} s" for r in ref]
    x = range(len(ref))
    ax1.bar([i - 0.2 for i in x], [r["paper_cores"] for r in ref], 0.4, label="paper, Table 3")
    ax1.bar([i + 0.2 for i in x], [r["skb_cores"] for r in ref], 0.4, label="derived by our SKB")
    ax1.set_xticks(list(x), labels, fontsize=7, rotation=60, ha="right")
    ax1.set_ylabel("scan threads (cores)")
    ax1.set_title("Derived deployment, reference machines (30 M tuples)")
    ax1.legend(loc="upper center")
    ran = [r for r in mine if r["batches"]]
    x2 = range(len(ran))
    ax2.bar([i - 0.27 for i in x2], [r["predicted_ms"] for r in ran], 0.27, label="predicted (calibrated model)")
    ax2.bar(list(x2), [r["measured_mean_ms"] for r in ran], 0.27, label="measured mean (wall clock)")
    ax2.bar([i + 0.27 for i in x2], [r["own_cores_mean_ms"] for r in ran], 0.27,
            label="measured mean, scan CPU time")
    ax2.scatter(list(x2), [r["sla_ms"] for r in ran], marker="_", s=900, color="red", label="SLA", zorder=3)
    ax2.errorbar([i for i in x2], [r["measured_mean_ms"] for r in ran],
                 yerr=[[0] * len(ran), [r["measured_p95_ms"] - r["measured_mean_ms"] for r in ran]],
                 fmt="none", ecolor="black", capsize=3, label="to p95 (wall clock)")
    ax2.set_yscale("log")
    ax2.set_xticks(list(x2), [f"SLA {r['sla_ms']} ms\n{r['cores']} core(s)" for r in ran], fontsize=7)
    ax2.set_ylabel("batch response time (ms)")
    ax2.set_ylim(top=max(r["sla_ms"] for r in ran) * 4)
    ax2.set_title(f"This machine: {info['dataset_gb']} GB, {info['cpus']} CPUs")
    ax2.legend(fontsize=7, loc="upper right", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cost-fn", type=Path, help="use this calibrated cost function instead of calibrating")
    ap.add_argument("--seconds", type=float, default=30.0, help="run length per core count (default 30)")
    ap.add_argument("--model", choices=("paper", "extended"), default="paper",
                    help="cost model to calibrate (default: the paper's Section 4.4 model)")
    ap.add_argument("--replot", action="store_true", help="only redraw the figure from the CSVs")
    args = ap.parse_args()
    if args.replot:
        mine = c.read_rows(c.RESULTS / "exp1_this_machine.csv")
        info = json.loads((c.RESULTS / "exp1_info.json").read_text())
        plot(c.read_rows(c.RESULTS / "exp1_table3.csv"), mine, info, c.RESULTS / "exp1_deployment.png")
        return
    c.build()
    c.RESULTS.mkdir(exist_ok=True)
    before = c.machine_state()
    ref = reference_machines()
    print_table3(ref)
    c.write_csv(c.RESULTS / "exp1_table3.csv", ref)
    cost_fn = args.cost_fn
    fit = None
    if cost_fn is None:
        cost_fn = c.RESULTS / "cost_fn_this_machine.pl"
        fit = calibrate(cost_fn, c.RESULTS / "exp1_calibration.csv", args.model)
    mine, info = this_machine(cost_fn, args.seconds)
    print_this_machine(mine, info)
    c.write_csv(c.RESULTS / "exp1_this_machine.csv", mine)
    (c.RESULTS / "exp1_info.json").write_text(json.dumps(info, indent=1) + "\n")
    plot(ref, mine, info, c.RESULTS / "exp1_deployment.png")
    c.print_json({
        "experiment": "deployment (Table 3)",
        "reference_machines_matching_paper": f"{sum(r['same_cores'] for r in ref)}/{len(ref)}",
        "calibration": fit, "this_machine": info, "rows": mine,
        "machine_state_before": before, "machine_state_after": c.machine_state(),
    }, "exp1_deployment")


if __name__ == "__main__":
    main()

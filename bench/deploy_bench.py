"""Plan deployment benchmark (issue 17): prints one JSON document, draws one PNG.

1. tpcw: the TPC-W-shaped 44-operator plan (tests/data/plans) on the MagnyCours
   and Nehalem-EX facts: operators after phase 1, cores after phase 2 (FFD and
   the CP-SAT optimum), NUMA nodes, beside the paper's 44 -> 32 -> 6 (AMD) and
   5 (Intel); and what each phase costs.
2. scale: the planner on random plans of 100 and 400 operators worth half the
   machine's cores, on MagnyCours and on the 24-node hwloc machine (phase 4 by
   CP-SAT there).
3. real: eight named operator threads of known duty cycles (tests/helpers/
   opthreads.c) on this machine: profiled (RAV error against the known duty),
   deployed by the planner, then run alternately (A/B, --rounds times) with the
   OS scheduling them over every CPU and compressed onto the plan's cores,
   bound (as the RM would) to the CPUs other work left most idle over the
   second before, and pinned with sched_setaffinity by this script.  Per-operator throughput and
   latency, compressed over OS, and the savings factor of the paper's Eq. 5
   with the OS run as the baseline (all CPUs).

Run it under the shared lock:  flock /tmp/cod-bench.lock .venv/bin/python bench/deploy_bench.py
Usage: deploy_bench.py [--rounds N] [--seconds S] [--plot FILE] [--no-real]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from cod.facts import hwloc_xml, machines, sysfs
from cod.rm.deploy import Options, bind, deploy, parse_graph
from cod.rm.deploy.measure.profile import measure, to_graph

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from helpers import opthreads  # noqa: E402

PLANS = ROOT / "tests" / "data" / "plans"
HWLOC = ROOT / "tests" / "data" / "topologies" / "hwloc"
PAPER = {"magnycours": {"operators": 44, "after_phase1": 32, "cores": 6},
         "nehalem-ex": {"operators": 44, "after_phase1": 32, "cores": 5}}
DUTIES = {"scan_item": 0.25, "join_ol": 0.10, "sort_bestsel": 0.08, "kv_cart": 0.07,
          "groupby_rel": 0.06, "topn_new": 0.06, "scan_author": 0.05, "union_res": 0.05}


def tpcw() -> dict:
    out = {}
    for name in PAPER:
        graph = parse_graph(json.loads((PLANS / f"tpcw_{name}.json").read_text()))
        plan = deploy(graph, machines.load(name))
        out[name] = {
            "ours": {"operators": plan.operators, "after_phase1": len(plan.compounds), "cores": plan.cores,
                     "cores_optimal": plan.cores_optimal, "numa_nodes": list(plan.numa.nodes),
                     "busiest_core_ffd": round(plan.balance.max_before / 1e6, 3),
                     "busiest_core_balanced": round(plan.balance.max_after / 1e6, 3)},
            "paper": PAPER[name],
            "ms": {k: round(v, 2) for k, v in plan.timings_ms.items()},
            "_plan": plan,
        }
    return out


def random_plan(n: int, rng: random.Random, total_util: float) -> dict:
    """n operators, three in four light, summing to ``total_util`` cores."""
    utils = [rng.uniform(0.005, 0.05) if rng.random() < 0.75 else rng.uniform(0.05, 0.9) for _ in range(n)]
    scale = total_util / sum(utils)
    ops, edges = [], []
    for i in range(n):
        op = {"id": f"op{i}", "cpu_util": round(min(1.0, utils[i] * scale), 4),
              "mem_bw": rng.uniform(1e7, 1e9), "blocking": rng.random() < 0.4}
        if rng.random() < 0.1:
            op["siblings"] = f"par{i % 7}"
        ops.append(op)
        if i:
            edges.append([f"op{rng.randrange(i)}", f"op{i}"])
    return {"operators": ops, "edges": edges}


def scale() -> list[dict]:
    rng = random.Random(17)
    rows = []
    big = hwloc_xml.load(HWLOC / "192em64t-24n8c2t.xml")
    for machine in (machines.load("magnycours"), big):
        for n in (100, 400):
            # Half the machine's cores' worth of work, whatever the operator count.
            g = parse_graph(random_plan(n, rng, 0.5 * len(machine.cores)))
            if machine is big:
                # Bandwidth caps that force several nodes, so phase 4 has a choice to make.
                opts = Options(time_limit_s=2.0, node_bandwidth={nd.id: 4_000_000_000 for nd in big.numa_nodes})
            else:
                opts = Options(time_limit_s=2.0)
            t0 = time.perf_counter()
            try:
                plan = deploy(g, machine, opts)
            except Exception as err:  # noqa: BLE001 - report, do not stop the bench
                rows.append({"machine": machine.name, "operators": n, "error": str(err)})
                continue
            rows.append({"machine": machine.name, "operators": n, "compounds": len(plan.compounds),
                         "cores": plan.cores, "cores_optimal": plan.cores_optimal,
                         "cores_lower_bound": plan.cores_lower_bound, "numa_nodes": len(plan.numa.nodes),
                         "phase4": plan.numa.choice.method, "phase4_proven": plan.numa.choice.optimal,
                         "total_ms": round((time.perf_counter() - t0) * 1e3, 1),
                         "ms": {k: round(v, 1) for k, v in plan.timings_ms.items()}})
    return rows


def cpu_busy(seconds: float = 1.0) -> dict[int, float]:
    """Share of each CPU busy over ``seconds`` (from /proc/stat)."""
    def read() -> dict[int, tuple[int, int]]:
        out = {}
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("cpu") and line[3].isdigit():
                name, *vals = line.split()
                v = [int(x) for x in vals]
                idle = v[3] + v[4]
                out[int(name[3:])] = (sum(v[:8]) - idle, sum(v[:8]))
        return out
    a = read()
    time.sleep(seconds)
    b = read()
    return {c: (b[c][0] - a[c][0]) / max(1, b[c][1] - a[c][1]) for c in a if c in b}


def run_once(exe: str, rate: float, seconds: float, pin: dict[str, int] | None) -> dict:
    ops = opthreads.start(exe, DUTIES, seconds=seconds, units_per_ms=rate)
    try:
        if pin:
            for name, cpu in pin.items():
                os.sched_setaffinity(ops.tids[name], {cpu})
        ops.go()
        return ops.results(timeout_s=seconds + 60)
    finally:
        ops.stop()


def real(rounds: int, seconds: float) -> dict:
    tmp = tempfile.mkdtemp(prefix="deploy_bench_")
    exe = opthreads.build(tmp)
    machine = sysfs.discover("/")
    cpus = machine.cpu_ids()
    load_before = os.getloadavg()

    # Profile a run the OS schedules (calibrating the work rate once for every later run).
    ops = opthreads.start(exe, DUTIES, seconds=seconds)
    rate = ops.units_per_ms
    try:
        ops.go()
        time.sleep(0.5)
        window = measure(ops.pid, min(3.0, seconds - 1.0))
        ops.results(timeout_s=seconds + 60)
    finally:
        ops.stop()
    graph = to_graph(window, threads="^(" + "|".join(DUTIES) + ")$")
    rav = {o["id"]: o["cpu_util"] for o in graph["operators"]}
    errors_pp = {k: round(100 * (rav[k] - d), 2) for k, d in DUTIES.items()}
    plan = deploy(parse_graph(graph), machine)

    runs = {"os": [], "compressed": []}
    chosen = []
    for _ in range(rounds):  # A/B alternation cancels drift in the machine's other load
        runs["os"].append(run_once(exe, rate, seconds, None))
        # As the RM would: the plan's cores where other work leaves the most room.
        busy = cpu_busy()
        free = sorted(cpus, key=lambda c: (busy.get(c, 1.0), c))[: plan.min_cores]
        placed = bind(plan, machine, free)
        chosen.append({"cpus": free, "busy_before": {c: round(busy.get(c, 0), 3) for c in cpus}})
        runs["compressed"].append(run_once(exe, rate, seconds, placed.placement))
    load_after = os.getloadavg()

    def agg(kind: str, name: str, key: str) -> float:
        return statistics.mean(r[name][key] for r in runs[kind])

    per_op = {}
    for name in DUTIES:
        tput_os, tput_c = agg("os", name, "throughput_units_per_s"), agg("compressed", name, "throughput_units_per_s")
        per_op[name] = {
            "duty": DUTIES[name], "rav_cpu_util": rav[name], "rav_error_pp": errors_pp[name],
            "offered_units_per_s": round(agg("os", name, "offered_units_per_s"), 1),
            "throughput_os": round(tput_os, 1), "throughput_compressed": round(tput_c, 1),
            "throughput_ratio": round(tput_c / tput_os, 4),
            "latency_ms_p50_os": round(agg("os", name, "latency_ms_p50"), 3),
            "latency_ms_p50_compressed": round(agg("compressed", name, "latency_ms_p50"), 3),
            "latency_ms_p99_os": round(agg("os", name, "latency_ms_p99"), 3),
            "latency_ms_p99_compressed": round(agg("compressed", name, "latency_ms_p99"), 3),
        }
    def offered_share(r: dict) -> float:
        return round(sum(x["throughput_units_per_s"] for x in r.values())
                     / sum(x["offered_units_per_s"] for x in r.values()), 4)

    per_round = [{"os_throughput_of_offered": offered_share(o), "compressed_throughput_of_offered": offered_share(c),
                  "compressed_over_os": round(offered_share(c) / offered_share(o), 4), **ch}
                 for o, c, ch in zip(runs["os"], runs["compressed"], chosen)]
    total_os = sum(p["throughput_os"] for p in per_op.values())
    total_c = sum(p["throughput_compressed"] for p in per_op.values())
    res_b, res_c = len(cpus), plan.min_cores
    return {
        "machine": {"name": machine.name, "cpus": list(cpus)},
        "work_units_per_ms": rate, "seconds_per_run": seconds, "rounds": rounds,
        "profile": {"source": window.source, "window_s": round(window.seconds, 3),
                    "pmu": graph["profile"]["pmu"]["detail"],
                    "max_abs_rav_error_pp": max(abs(e) for e in errors_pp.values())},
        "plan": {"cores": plan.cores, "cores_optimal": plan.cores_optimal, "min_cores": plan.min_cores,
                 "clusters": [{"cpu_util": round(c.cpu_util, 3), "operators": list(c.members)}
                              for c in plan.clusters]},
        "rounds_detail": per_round,
        "profile_warnings": graph["profile"]["warnings"],
        "operators": per_op,
        "throughput_ratio_min": min(p["throughput_ratio"] for p in per_op.values()),
        "throughput_ratio_total": round(total_c / total_os, 4),
        # Eq. 5: (Tput_c / Res_c) x (Res_b / Tput_b); baseline b = the OS over all CPUs.
        "savings_factor": round((total_c / res_c) * (res_b / total_os), 3),
        "resources": {"compressed_cores": res_c, "baseline_cpus": res_b},
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in load_after],
    }


def plot(path: Path, tp: dict, rl: dict | None) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed (pip install '.[bench]'): no plot"
    panels = 3 if rl else 2
    fig, axes = plt.subplots(1, panels, figsize=(6 * panels, 4.8))
    for ax, name in zip(axes, PAPER):
        plan = tp[name]["_plan"]
        for c in plan.clusters:
            bottom = 0.0
            for cid in c.compounds:
                u = next(x.cpu_util for x in plan.compounds if x.id == cid)
                ax.bar(f"CPU {c.cpu}", u, bottom=bottom, edgecolor="white", linewidth=0.5)
                if u >= 0.08:
                    label = cid.split("+")[0].split("_", 1)[-1][:14] + ("+" if "+" in cid else "")
                    ax.text(f"CPU {c.cpu}", bottom + u / 2, label, ha="center", va="center", fontsize=6)
                bottom += u
        ax.axhline(1.0, color="black", linestyle="--", linewidth=0.8)
        ax.set_ylim(0, 1.1)
        ax.set_ylabel("cpu_util (share of one core)")
        ax.set_title(f"TPC-W plan on {name}: 44 -> {len(plan.compounds)} -> {plan.cores} cores "
                     f"(node {list(plan.numa.nodes)})", fontsize=9)
    if rl:
        ax = axes[2]
        names = list(rl["operators"])
        x = range(len(names))
        ax.bar([i - 0.2 for i in x], [rl["operators"][n]["throughput_os"] for n in names], 0.4,
               label=f"OS, {rl['resources']['baseline_cpus']} CPUs")
        ax.bar([i + 0.2 for i in x], [rl["operators"][n]["throughput_compressed"] for n in names], 0.4,
               label=f"compressed, {rl['resources']['compressed_cores']} core")
        ax.set_xticks(list(x), [f"{n}\n{int(100 * DUTIES[n])}%" for n in names], fontsize=6)
        ax.set_ylabel("throughput (work units/s)")
        ax.set_title(f"8 operator threads on this VM: savings factor {rl['savings_factor']}", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    return str(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--plot", default=str(ROOT / "docs" / "figures" / "deploy_bench.png"))
    ap.add_argument("--no-real", action="store_true", help="skip the real-thread runs")
    args = ap.parse_args()
    tp = tpcw()
    sc = scale()
    rl = None if args.no_real else real(args.rounds, args.seconds)
    where = plot(Path(args.plot), tp, rl)
    doc = {"tpcw": {k: {kk: vv for kk, vv in v.items() if kk != "_plan"} for k, v in tp.items()},
           "scale": sc, "real": rl, "plot": where}
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

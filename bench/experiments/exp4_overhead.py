#!/usr/bin/env python3
"""Experiment 4, overhead (COD paper, Table 4).

The time of CSCS's two stored procedures in the SKB, initial deployment
(dbos_cost_function/3, Listing 3) and tuple redistribution
(cscs_redistribute/5, Section 7.4), and of the global allocation plan with
CSCS alone and with CSCS plus one application, on the MagnyCours facts and
on this machine, beside the paper's 5.64 / 13.28 / 0.18 / 0.27 ms.

Stored procedures: wall time of each call measured inside the SWI-Prolog
engine (SKB.time_query, the kind of figure the paper gives), and end to end
from Python (pipe round trip included).  Allocation: the allocator's own
solve time (cod.rm.allocator.allocate) for the tasks the RM would build from
the derived properties: CSCS with MinCores from Listing 3, MaxCores every
CPU, WorkingSetSize its partition, NUMA- and cache-sensitive; the one other
application a CPU-bound single-core task.

Writes results/exp4_overhead.csv and results/exp4_overhead.png; prints JSON.
    flock /tmp/cod-bench.lock .venv/bin/python bench/experiments/exp4_overhead.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import common as c
from cod.facts import discover, machines
from cod.rm.allocator import TaskSpec, allocate
from cod.skb import SKB

PAPER_MS = {
    "allocation, CSCS alone": 5.64,
    "allocation, CSCS + 1 application": 13.28,
    "initial deployment procedure": 0.18,
    "tuple redistribution procedure": 0.27,
}
SLA_MS = 3000  # Section 7.4


def stats_ms(samples_us: list[float]) -> dict:
    s = sorted(samples_us)
    return {"median_ms": round(statistics.median(s) / 1000, 4),
            "p95_ms": round(s[int(0.95 * (len(s) - 1))] / 1000, 4), "n": len(s)}


def end_to_end_us(skb: SKB, goal: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        skb.execute_query("cscs", goal)
        out.append((time.perf_counter() - t) * 1e6)
    return out


def measure_machine(label: str, machine, tuples: int, n: int) -> list[dict]:
    rows = []
    with SKB() as skb:
        skb.load_machine(machine)
        skb.add_facts("cscs", [f"db_ntuple({tuples})", f"db_tsize({c.TUPLE_BYTES})",
                               f"db_nquery({c.PAPER_QUERIES})", f"db_nupdate({c.PAPER_UPDATES})",
                               f"db_rtime({SLA_MS})"])
        skb.add_procedure("cscs", c.PAPER_COST_FN.read_text())
        [dep] = skb.execute_query("cscs", "dbos_cost_function(S, N, P), get_list_free_cpus(F)")
        free = dep["F"]
        share, extra = divmod(tuples, len(free))
        current = ", ".join(f"{cpu}-{share + (i < extra)}" for i, cpu in enumerate(free))
        goals = {
            "initial deployment procedure": "dbos_cost_function(S, N, P)",
            # Section 7.4: CSCS on every CPU loses the first one to a newcomer.
            "tuple redistribution procedure":
                f"cscs_redistribute([{current}], [{', '.join(map(str, free[1:] or free))}], S, P, M)",
        }
        for what, goal in goals.items():
            timed = skb.time_query("cscs", goal, n)
            rows.append({"machine": label, "what": what, "paper_ms": PAPER_MS[what],
                         **stats_ms(timed["wall_us"]),
                         "engine_cpu_ms": round(timed["cpu_us_per_call"] / 1000, 4),
                         "end_to_end_median_ms":
                         round(statistics.median(end_to_end_us(skb, goal, n)) / 1000, 4)})
    cscs = TaskSpec(name="cscs", min_cores=dep["N"], max_cores=len(free),
                    working_set_bytes=dep["P"], sensitive=frozenset({"numa", "cache"}))
    other = TaskSpec(name="stressor", min_cores=1, max_cores=1)
    for what, tasks in (("allocation, CSCS alone", [cscs]), ("allocation, CSCS + 1 application", [cscs, other])):
        times, status = [], set()
        for _ in range(max(5, n // 20)):
            r = allocate(machine, tasks)
            times.append(r.solve_ms * 1000)
            status.add(r.status)
        rows.append({"machine": label, "what": what, "paper_ms": PAPER_MS[what], **stats_ms(times),
                     "engine_cpu_ms": "", "end_to_end_median_ms": "",
                     "note": f"min_cores {dep['N']}, status {'/'.join(sorted(status))}"})
    return rows


def plot(rows: list[dict], path) -> None:
    plt = c.pyplot()
    whats = list(PAPER_MS)
    labels = sorted({r["machine"] for r in rows})
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / (len(labels) + 1)
    xs = range(len(whats))
    ax.bar([x - 0.4 + width / 2 for x in xs], [PAPER_MS[w] for w in whats], width, label="paper (Table 4)")
    for k, label in enumerate(labels):
        vals = [next(r["median_ms"] for r in rows if r["machine"] == label and r["what"] == w) for w in whats]
        ax.bar([x - 0.4 + width * (k + 1.5) for x in xs], vals, width, label=f"ours, {label}")
    ax.set_yscale("log")
    ax.set_xticks(list(xs), [w.replace(", ", ",\n") for w in whats], fontsize=8)
    ax.set_ylabel("time (ms, median)")
    ax.set_title("Policy engine computation overhead (Table 4)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-n", type=int, default=500, help="calls per stored procedure (default 500)")
    args = ap.parse_args()
    c.RESULTS.mkdir(exist_ok=True)
    before = c.machine_state()
    mine = discover.from_args()
    rows = measure_machine("magnycours", machines.load("magnycours"), 180_000_000, args.n)
    rows += measure_machine("this machine", mine, c.PAPER_TUPLES_PER_CORE * len(c.allowed_cpus()), args.n)
    print(f"{'machine':<13} {'what':<34} {'paper ms':>9} {'median ms':>10} {'p95 ms':>8} {'cpu ms':>8} "
          f"{'e2e ms':>8}")
    for r in rows:
        print(f"{r['machine']:<13} {r['what']:<34} {r['paper_ms']:>9} {r['median_ms']:>10} {r['p95_ms']:>8} "
              f"{r['engine_cpu_ms']:>8} {r['end_to_end_median_ms']:>8}")
    print("(median, p95: wall time of the call in the engine, or the allocator's solve time; cpu: the SKB\n"
          " engine's CPU time per whole query operation; e2e: from Python, pipe round trip included)")
    c.write_csv(c.RESULTS / "exp4_overhead.csv", [{**r, "note": r.get("note", "")} for r in rows])
    plot(rows, c.RESULTS / "exp4_overhead.png")
    c.print_json({"experiment": "overhead (Table 4)", "rows": rows,
                  "machine_state_before": before, "machine_state_after": c.machine_state()}, "exp4_overhead")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""SKB speed (issue #2): prints JSON figures, median and p99 in microseconds.

End to end means from the Python call to its return (pipe round trip
included); "in_engine" is wall time measured inside the SWI-Prolog process
around the limited call of the query (the paper's Table 4 figure, 0.18 ms,
is of that kind; the target is on this one); "in_engine_cpu_us_per_call" is
the engine's CPU time per whole query operation (parsing the goal, the
safety check, limits, query), averaged, which a busy VM does not inflate.
Optionally compares pyswip in process when it is importable.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Callable

from cod.facts import machines
from cod.skb import SKB

CSCS_FACTS = ["db_ntuple(30000000)", "db_tsize(315)", "db_nquery(2048)", "db_nupdate(0)", "db_rtime(2000)"]
CSCS_COST_FN = (
    "db_cost_fn(NTuples, NRequests, RTimeMs, Cores) :-\n"
    "    Cores is (NTuples * (0.85 * NRequests + 106.37)) / (3750000 * RTimeMs)."
)
TARGET_LISTING3_US = 50.0  # issue #2: 0.05 ms or less in process
PAPER_LISTING3_US = 180.0  # COD paper, Table 4


def percentile(samples: list[float], p: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "median_us": round(statistics.median(samples), 2),
        "p99_us": round(percentile(samples, 99), 2),
        "n": len(samples),
    }


def timed(fn: Callable[[], object], n: int, warmup: int = 50) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1000)
    return out


def bench_pyswip(n: int) -> dict[str, object] | None:
    try:
        from pyswip import Prolog  # type: ignore[import-not-found]
    except Exception:  # pyswip not installed, or it cannot find libswipl
        return None
    prolog = Prolog()
    return {
        "trivial_query": summary(timed(lambda: list(prolog.query("X = 1")), n)),
        "findall_48": summary(timed(lambda: list(prolog.query("numlist(0, 47, L)")), n)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("-n", type=int, default=5000, help="samples per figure")
    args = parser.parse_args()
    n = args.n

    with SKB() as skb:
        skb.load_machine(machines.load("magnycours"))
        skb.add_facts("cscs", CSCS_FACTS)
        skb.add_procedure("cscs", CSCS_COST_FN)

        results: dict[str, object] = {"machine": "magnycours", "samples": n}
        results["ping_round_trip"] = summary(timed(skb.ping, n))
        results["trivial_query"] = summary(timed(lambda: skb.execute_query("bench", "X = 1"), n))
        results["findall_48"] = summary(
            timed(lambda: skb.execute_query("bench", "findall(C, cpu_affinity(C, _, _), L)"), n)
        )
        counter = iter(range(10**9))
        results["add_fact_single"] = summary(
            timed(lambda: skb.add_facts("bench", [f"single({next(counter)})"]), n)
        )
        batches = iter(range(10**9))

        def add_batch() -> None:
            b = next(batches)
            skb.add_facts("bench", [f"batch({b}, {i})" for i in range(1000)])

        batch = timed(add_batch, max(20, n // 50), warmup=3)
        results["add_facts_batch_1000"] = summary(batch)
        results["add_facts_batch_1000"]["per_fact_us"] = round(statistics.median(batch) / 1000, 3)

        goal = "dbos_cost_function(S, N, P)"
        assert skb.execute_query("cscs", goal) == [{"S": 0, "N": 8, "P": 1181250000}]
        results["listing3_end_to_end"] = summary(timed(lambda: skb.execute_query("cscs", goal), n))
        timings = skb.time_query("cscs", goal, n)
        in_engine = [float(w) for w in timings["wall_us"]]
        results["listing3_in_engine"] = summary(in_engine)
        results["listing3_in_engine_cpu_us_per_call"] = round(timings["cpu_us_per_call"], 2)
        results["listing3_target_us"] = TARGET_LISTING3_US
        results["listing3_paper_us"] = PAPER_LISTING3_US
        results["listing3_meets_target"] = statistics.median(in_engine) <= TARGET_LISTING3_US

    pyswip = bench_pyswip(n)
    if pyswip is not None:
        results["pyswip_in_process"] = pyswip
    json.dump(results, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

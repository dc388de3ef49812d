"""Allocator benchmark: prints one JSON document with every figure side by side.

Sections (``--sections``, default all), each with its target from issues #5 and #19:

* ``table4``: the paper's Table 4 scenario on the MagnyCours facts: CSCS alone
  and beside one pinned polluter (paper: 5.64 / 13.28 ms; targets 0.5 / 1.3 ms),
  every solver side by side.
* ``family``: per reference machine a generated family of Table-4-like
  instances (CSCS with random min/max/working set/sensitivity, 0-3 other tasks
  with random properties, some pinned already): every one solved, model build
  included, p100 <= 1.3 ms and median <= 0.5 ms; the slowest instance and why.
* ``large``: synthetic machines from ``lstopo --input`` (1,024 PUs: 4 packages x
  4 NUMA nodes x 4 L3 x 8 cores x 2 threads, 512 tasks, 50 ms; 2,048 PUs, 1,024
  tasks, 200 ms): optimal or a proven gap <= 1 % within the time.
* ``random``: 100 random 128-task instances on each 384-PU machine (the
  largest real export and a synthetic 2-socket one): optimal or a proven gap
  <= 1 % within 100 ms each.
* ``scale``: the earlier 8/32/128-task figures (targets 20 / 100 ms), with the
  phases of the time.
* ``incremental``: from a published allocation of 128 tasks on 384 PUs, one
  arrival or one departure re-planned through the stateful ``Allocator``:
  median <= 2 ms, moves only where the bound forces them (or a stated gap).
* ``refusal``: refusal reasons (per-node memory with the figures; no
  "0 of N available").

The load average is printed before and after; ratios are only taken within
one run.  Usage: python bench/alloc_bench.py [--sections a,b] [--family-size N]
[--random-count N] [--repeat N] [--time-limit S] [--no-naive]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cod.facts import hwloc_xml, machines
from cod.facts.synthetic import GIB, MIB, Shape, build
from cod.rm.allocator import Allocator, TaskSpec, allocate
from cod.rm.allocator.bounds import RelaxedBound, relaxed_bound
from cod.rm.allocator.cpsat import _build as build_count_model
from cod.rm.allocator.explain import explain
from cod.rm.allocator.mapping import map_counts
from cod.rm.allocator.packing import pack
from cod.rm.allocator.problem import moves, objective, violations
from cod.rm.allocator.solve import ACCEPT_GAP
from cod.rm.allocator.topology import build_view

HWLOC_DIR = Path(__file__).resolve().parents[1] / "tests" / "data" / "topologies" / "hwloc"

CSCS = TaskSpec("cscs", min_cores=16, working_set_bytes=53 * GIB // 16,
                sensitive=frozenset({"numa", "cache"}), bound="cpu")
OTHER = TaskSpec("other", min_cores=1, max_cores=1, pollutes_cache=True)
SECTIONS = ("table4", "family", "large", "random", "scale", "incremental", "refusal")
LARGE = {  # lstopo --input shape, tasks, target ms
    "1024": ("pack:4 numa:4(memory=68719476736) l3:4 core:8 pu:2", 512, 50),
    "2048": ("pack:8 numa:4(memory=68719476736) l3:4 core:8 pu:2", 1024, 200),
}


def ms_since(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


def summary(values: list[float]) -> dict:
    ordered = sorted(values)
    return {"n": len(values), "median_ms": round(statistics.median(values), 3),
            "p90_ms": round(ordered[int(0.9 * (len(values) - 1))], 3), "p100_ms": round(ordered[-1], 3)}


def valid_objective(view, tasks, result, current):
    alloc = result.as_mapping()
    if result.status == "infeasible" or violations(view, tasks, alloc):
        return None
    return list(objective(view, tasks, alloc, current))


def timed(machine, tasks, current, solver, repeat, time_limit):
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = allocate(machine, tasks, current, solver=solver, time_limit_s=time_limit)
        times.append(ms_since(t0))
    view = build_view(machine)
    obj = valid_objective(view, tasks, result, current)
    return {"solver": solver, "status": result.status, "used": result.solver, "via": result.via,
            "median_ms": round(statistics.median(times), 3), "min_ms": round(min(times), 3),
            "objective": obj, "gap": result.gap, "valid": obj is not None}


# ---- generated instances -------------------------------------------------------------


def mixed(n: int, n_cpus: int, seed: int) -> list[TaskSpec]:
    """The scale mix: seeded random tasks of every kind."""
    rng = random.Random(seed)
    out = []
    per = max(1, n_cpus // n)
    for i in range(n):
        lo = rng.randint(1, max(1, per // 3))
        hi = rng.choice([None, lo + rng.randint(0, per)])
        sensitive = frozenset(rng.sample(["numa", "cache"], rng.randint(0, 2)))
        pollutes = rng.random() < 0.1
        out.append(TaskSpec(
            f"task{i:03d}", min_cores=lo, max_cores=hi,
            working_set_bytes=rng.choice([0, 64 * MIB, 256 * MIB, GIB]),
            sensitive=sensitive,
            exclusive=rng.random() < 0.8,
            priority=rng.randint(0, 2),
            # a polluter that is itself cache-sensitive needs an L3 domain of its
            # own; more than a few of them make any instance infeasible
            pollutes_cache=pollutes and ("cache" not in sensitive or i % 32 == 0),
            allow_smt_sharing=rng.random() < 0.5,
        ))
    return out


def table4_family(view, seed: int) -> tuple[list[TaskSpec], dict[str, list[int]]]:
    """A Table-4-like instance: CSCS with random min/max, working set (up to
    1.5 x a node's memory per CPU, so memory binds) and sensitivity, plus 0-3
    other tasks with random properties, about half of them pinned already."""
    rng = random.Random(seed)
    cpus = list(view.cpus)
    n = len(cpus)
    per_node = max(1, n // max(1, len(view.nodes)))
    free = [f for f in view.node_free.values() if f is not None]
    per_cpu = min(free) // per_node if free else GIB

    def ws() -> int:
        return int(per_cpu * rng.choice([0, 0, 0.25, 0.5, 1.0, 1.5]))

    lo = rng.randint(1, max(1, n // 2))
    tasks = [TaskSpec("cscs", min_cores=lo, max_cores=rng.choice([None, None, rng.randint(lo, n)]),
                      working_set_bytes=ws(), sensitive=frozenset(rng.sample(["numa", "cache"], rng.randint(0, 2))),
                      priority=rng.choice([0, 0, 1]))]
    current: dict[str, list[int]] = {}
    for i in range(rng.randint(0, 3)):
        lo = rng.randint(1, 4)
        t = TaskSpec(f"app{i}", min_cores=lo, max_cores=rng.choice([None, lo, lo + rng.randint(0, 8)]),
                     working_set_bytes=rng.choice([0, 0, ws()]),
                     sensitive=frozenset(rng.sample(["numa", "cache"], rng.choice([0, 0, 1, 2]))),
                     exclusive=rng.random() < 0.7, priority=rng.choice([0, 0, 1]),
                     pollutes_cache=rng.random() < 0.4, allow_smt_sharing=rng.random() < 0.5)
        tasks.append(t)
        if rng.random() < 0.5:  # pinned already
            start = rng.randrange(n)
            current[t.name] = [cpus[(start + j) % n] for j in range(rng.randint(1, t.min_cores))]
    return tasks, current


def lstopo_machine(spec: str):
    """A synthetic machine as hwloc describes it (``lstopo --input SPEC --of xml``)."""
    cache = Path(tempfile.gettempdir()) / "cod-bench-lstopo"
    cache.mkdir(exist_ok=True)
    path = cache / (spec.replace(" ", "_").replace(":", "").replace("(", "").replace(")", "").replace("=", "") + ".xml")
    if not path.exists():
        subprocess.run(["lstopo", "--input", spec, "--of", "xml", str(path)], check=True)
    return hwloc_xml.load(path)


def largest_real_machine():
    best = None
    for p in sorted(HWLOC_DIR.glob("*.xml")):
        m = hwloc_xml.load(p)
        if best is None or len(m.cpu_ids()) > len(best[1].cpu_ids()):
            best = (p.name, m)
    return best


def synthetic_384():
    return build(Shape("synthetic-2s192c384t", packages=2, dies_per_package=4, cores_per_die=24,
                       threads_per_core=2, node_per_die=True, l3_bytes_per_die=32 * MIB,
                       node_memory_bytes=64 * GIB))


def describe(tasks, current) -> list[str]:
    out = []
    for t in tasks:
        out.append(f"{t.name} min={t.min_cores} max={t.max_cores} ws={t.working_set_bytes / GIB:.2f}G "
                   f"{'+'.join(sorted(t.sensitive)) or '-'} {'excl' if t.exclusive else 'shared'} p{t.priority}"
                   f"{' polluter' if t.pollutes_cache else ''}{' smt' if t.allow_smt_sharing else ''}"
                   f"{' on ' + str(sorted(current[t.name])) if t.name in current else ''}")
    return out


# ---- sections ------------------------------------------------------------------------


def section_table4(args, solvers) -> dict:
    mc = machines.load("magnycours")
    allocate(mc, [CSCS])  # warm-up: imports, caches
    scenarios = {"cscs_alone": ([CSCS], None), "cscs_plus_other": ([CSCS, OTHER], {"other": [0]})}
    targets = {"cscs_alone": 0.5, "cscs_plus_other": 1.3}
    paper = {"cscs_alone": 5.64, "cscs_plus_other": 13.28}
    return {name: {"paper_ms": paper[name], "target_ms": targets[name],
                   "runs": [timed(mc, tasks, current, s, args.repeat, args.time_limit) for s in solvers]}
            for name, (tasks, current) in scenarios.items()}


def section_family(args) -> dict:
    out = {"targets": {"p100_ms": 1.3, "median_ms": 0.5}}
    for name in machines.names():
        m = machines.load(name)
        view = build_view(m)
        allocate(m, [TaskSpec("warm-up")])
        rows = []
        for seed in range(args.family_size):
            tasks, current = table4_family(view, seed)
            t0 = time.perf_counter()
            r = allocate(m, tasks, current, time_limit_s=args.time_limit)
            ms = ms_since(t0)
            ok = r.status == "infeasible" or not violations(view, tasks, r.as_mapping())
            rows.append((ms, seed, r, ok))
        times = [row[0] for row in rows]
        statuses: dict[str, int] = {}
        for _, _, r, _ in rows:
            key = f"{r.status} via {r.via}"
            statuses[key] = statuses.get(key, 0) + 1
        slow_ms, slow_seed, slow, _ = max(rows, key=lambda row: row[0])
        tasks, current = table4_family(view, slow_seed)
        again = []
        for _ in range(5):
            t0 = time.perf_counter()
            allocate(m, tasks, current, time_limit_s=args.time_limit)
            again.append(ms_since(t0))
        out[name] = summary(times) | {
            "all_valid": all(row[3] for row in rows), "how_solved": statuses,
            "over_1.3_ms": sum(1 for t in times if t > 1.3),
            "slowest": {"seed": slow_seed, "ms": round(slow_ms, 3), "again_ms": [round(t, 3) for t in again],
                        "status": slow.status, "via": slow.via, "reason": slow.reason,
                        "tasks": describe(tasks, current)},
        }
    return out


def section_large(args) -> dict:
    out = {}
    for label, (spec, n_tasks, target) in LARGE.items():
        m = lstopo_machine(spec)
        view = build_view(m)
        tasks = mixed(n_tasks, len(view.cpus), seed=n_tasks)
        runs = []
        for limit_ms in (target, 1000):
            t0 = time.perf_counter()
            r = allocate(m, tasks, time_limit_s=limit_ms / 1e3)
            runs.append({"time_limit_ms": limit_ms, "ms": round(ms_since(t0), 3), "status": r.status, "via": r.via,
                         "gap": r.gap, "objective": valid_objective(view, tasks, r, {})})
        rb = relaxed_bound(view, tasks, {}, 10.0)
        out[f"{label} PUs ({spec}), {n_tasks} tasks"] = {
            "target_ms": target, "runs": runs,
            "bound": list(rb.objective) if isinstance(rb, RelaxedBound) else rb,
            "phases_ms": phases(view, tasks, rb)}
    return out


def section_random(args) -> dict:
    out = {"target": "each optimal or a proven gap <= 1 % in 100 ms", "time_limit_ms": 100}
    real_name, real = largest_real_machine()
    for label, m in ((f"real:{real_name}", real), ("synthetic-2s192c384t", synthetic_384())):
        view = build_view(m)
        rows, misses = [], []
        for seed in range(10_000, 10_000 + args.random_count):
            tasks = mixed(128, len(view.cpus), seed)
            t0 = time.perf_counter()
            r = allocate(m, tasks, time_limit_s=0.1)
            ms = ms_since(t0)
            proven = r.status == "optimal" or (r.status == "feasible" and r.gap is not None and r.gap <= ACCEPT_GAP)
            rows.append((ms, proven, r))
            if not proven or ms > 100:
                misses.append({"seed": seed, "ms": round(ms, 1), "status": r.status, "via": r.via, "gap": r.gap})
        statuses: dict[str, int] = {}
        for _, _, r in rows:
            statuses[f"{r.status} via {r.via}"] = statuses.get(f"{r.status} via {r.via}", 0) + 1
        out[label] = summary([row[0] for row in rows]) | {
            "proven_within_1pct": sum(1 for row in rows if row[1]),
            "proven_within_1pct_and_100_ms": sum(1 for row in rows if row[1] and row[0] <= 100),
            "how_solved": statuses, "misses": misses[:20]}
    return out


def phases(view, tasks, rb) -> dict:
    """Where the time goes, each part alone (best of 3): the relaxation bound,
    the packing, counts -> CPUs, the binding explanation, and the Python build
    of the full count model (what a search would cost before solving)."""
    def best_of(f):
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            out = f()
            times.append(ms_since(t0))
        return out, round(min(times), 3)

    _, t_bound = best_of(lambda: relaxed_bound(view, tasks, {}, 5.0))
    out = {"relaxed_bound": t_bound}
    if isinstance(rb, RelaxedBound):
        packed, out["packing"] = best_of(lambda: pack(view, tasks, {}, rb.totals, (rb.spread, rb.moves)))
        if packed is not None:
            alloc, out["map_counts"] = best_of(lambda: map_counts(view, tasks, {}, packed.counts, packed.cores))
            _, out["explain"] = best_of(lambda: explain(view, tasks, alloc))
    if len(tasks) <= 256:  # 512 tasks on 1,024 PUs: 4 s, 1,024 on 2,048: 27 s (measured once)
        _, out["count_model_build"] = best_of(lambda: build_count_model(view, tasks, {}))
    return out


def warm_start(m, view, tasks, limit_ms: float) -> dict:
    """What the RM does: recompute with the previous allocation as ``current``,
    for the same tasks and with one task gone (time limit = the target)."""
    before = allocate(m, tasks, time_limit_s=limit_ms / 1e3).as_mapping()
    out = {}
    for label, now in (("same_tasks", tasks), ("one_task_gone", tasks[:3] + tasks[4:])):
        t0 = time.perf_counter()
        r = allocate(m, now, before, time_limit_s=limit_ms / 1e3)
        out[label] = {"ms": round(ms_since(t0), 3), "status": r.status, "gap": r.gap,
                      "moves": moves(now, r.as_mapping(), before),
                      "objective": list(objective(view, now, r.as_mapping(), before))}
    return out


def section_scale(args, solvers) -> dict:
    out = {}
    real_name, real = largest_real_machine()
    for label, m in ((f"real:{real_name}", real), ("synthetic-2s192c384t", synthetic_384())):
        n_cpus = len(m.cpu_ids())
        rows = {}
        for n in (8, 32, 128):
            tasks = mixed(n, n_cpus, seed=n)
            target = {8: None, 32: 20, 128: 100}[n]
            runs = [timed(m, tasks, None, s, max(1, args.repeat // 10), args.time_limit)
                    for s in solvers if not (s == "naive" and n > 8)]
            if target:  # what the count model delivers within the target itself
                run = timed(m, tasks, None, "cpsat", max(1, args.repeat // 10), target / 1e3)
                run["solver"] = f"cpsat (time limit {target} ms)"
                runs.append(run)
            view = build_view(m)
            rb = relaxed_bound(view, tasks, {}, 5.0)
            bound = list(rb.objective) if isinstance(rb, RelaxedBound) else rb
            rows[f"{n}_tasks"] = {"target_ms": target, "bound": bound, "runs": runs,
                                  "phases_ms": phases(view, tasks, rb),
                                  "warm_start": warm_start(m, view, tasks, target or 1000)}
        out[f"{label} ({n_cpus} cpus)"] = rows
    return out


def section_incremental(args) -> dict:
    """One arrival or one departure from a published 128-task allocation: the
    stateful Allocator the daemon keeps (a fork of it per change, so every
    change starts from the same published state) against the pure allocate()
    on the same input.  ``plan`` is the time until the CPUs are known (what
    the upcalls wait on), ``explain`` the bindings computed afterwards."""
    out = {"target": "median <= 2 ms; no move the bound does not force (or a stated gap)"}
    real_name, real = largest_real_machine()
    for label, m in ((f"real:{real_name}", real), ("synthetic-2s192c384t", synthetic_384())):
        view = build_view(m)
        tasks = mixed(128, len(view.cpus), seed=128)
        base = Allocator(m, time_limit_s=1.0)
        first = base.allocate(tasks)
        published = first.as_mapping()
        newcomers = [TaskSpec(f"new{i}", **{k: v for k, v in t.to_dict().items() if k != "name"})
                     for i, t in enumerate(mixed(128, len(view.cpus), seed=4242)[:args.incremental_count])]
        leavers = random.Random(7).sample(tasks, args.incremental_count)
        rows = {"arrival": [], "departure": []}
        for kind, cases in (("arrival", [(tasks + [t], t.name) for t in newcomers]),
                            ("departure", [([u for u in tasks if u is not t], t.name) for t in leavers])):
            for now, who in cases:
                alloc = base.fork()
                t0 = time.perf_counter()
                r = alloc.allocate(now, published, time_limit_s=0.1, explain=False)
                ms = ms_since(t0)
                t0 = time.perf_counter()
                alloc.explain(r)
                explain_ms = ms_since(t0)
                t0 = time.perf_counter()
                pure = allocate(m, now, published, time_limit_s=0.1)
                pure_ms = ms_since(t0)
                got = objective(view, now, r.as_mapping(), published)
                rows[kind].append({"task": who, "ms": ms, "explain_ms": explain_ms, "pure_ms": pure_ms,
                                   "status": r.status, "via": r.via, "gap": r.gap,
                                   "moves": moves(now, r.as_mapping(), published),
                                   "vs_pure": (got > objective(view, now, pure.as_mapping(), published))
                                   - (got < objective(view, now, pure.as_mapping(), published))})
        res = {"published": {"status": first.status, "via": first.via}}
        for kind, rs in rows.items():
            res[kind] = summary([x["ms"] for x in rs]) | {
                "explain_afterwards": summary([x["explain_ms"] for x in rs]),
                "pure_allocate": summary([x["pure_ms"] for x in rs]),
                "how_solved": {s: sum(1 for x in rs if f"{x['status']} via {x['via']}" == s)
                               for s in sorted({f"{x['status']} via {x['via']}" for x in rs})},
                "moves": [x["moves"] for x in rs],
                "unproven_with_moves": [x["task"] for x in rs if x["moves"] and x["status"] != "optimal"
                                        and x["gap"] is None],
                "max_gap": max((x["gap"] or 0.0) for x in rs),
                "better_equal_worse_than_pure": [sum(1 for x in rs if x["vs_pure"] == v) for v in (1, 0, -1)],
            }
        out[label] = res
    return out


def section_refusal(args) -> dict:
    out = {}
    mc = machines.load("magnycours")  # 8 nodes x 6 cores, 16 GiB each
    r = allocate(mc, [TaskSpec("big", min_cores=33, working_set_bytes=4 * GIB)])
    out["per_node_memory"] = {"status": r.status, "reason": r.reason}
    r = allocate(mc, [CSCS, TaskSpec("fat", min_cores=1, working_set_bytes=20 * GIB)])
    out["working_set_above_any_node"] = {"status": r.status, "reason": r.reason}
    r = allocate(mc, [TaskSpec("db", min_cores=40), TaskSpec("late", min_cores=10, priority=-1)])
    out["min_cores_add_up"] = {"status": r.status, "reason": r.reason}
    m = lstopo_machine(LARGE["1024"][0])
    tasks = mixed(512, 1024, seed=512) + [TaskSpec("huge", min_cores=700)]
    r = allocate(m, tasks, time_limit_s=0.2)
    out["512_tasks_plus_a_huge_one"] = {"status": r.status, "reason": r.reason}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--time-limit", type=float, default=1.0)
    ap.add_argument("--family-size", type=int, default=200)
    ap.add_argument("--random-count", type=int, default=100)
    ap.add_argument("--incremental-count", type=int, default=20)
    ap.add_argument("--no-naive", action="store_true")
    args = ap.parse_args(argv)
    wanted = [s for s in args.sections.split(",") if s]
    unknown = sorted(set(wanted) - set(SECTIONS))
    if unknown:
        ap.error(f"unknown section {unknown[0]!r}; sections: {', '.join(SECTIONS)}")
    solvers = ["cpsat", "greedy"] + ([] if args.no_naive else ["naive"])
    out = {
        "load_average_before": [round(x, 2) for x in os.getloadavg()],
        "gap_definition": (
            "O2 (CPUs per priority level) must equal the relaxation's proven optimum; then "
            "gap = (cost - bound) / cost with cost = (K+1)*spread + moves (K = CPUs of the current "
            f"allocation), bound from cod.rm.allocator.bounds.relaxed_bound; accepted when <= {ACCEPT_GAP}"
        ),
    }
    runners = {"table4": lambda: section_table4(args, solvers), "family": lambda: section_family(args),
               "large": lambda: section_large(args), "random": lambda: section_random(args),
               "scale": lambda: section_scale(args, solvers), "incremental": lambda: section_incremental(args),
               "refusal": lambda: section_refusal(args)}
    for name in SECTIONS:
        if name in wanted:
            t0 = time.perf_counter()
            out[name] = runners[name]()
            out[name + "_section_s"] = round(time.perf_counter() - t0, 1)
    out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

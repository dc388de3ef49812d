#!/usr/bin/env python3
"""Experiment 5, memory distance (seed 002, Gawade et al.): a scan-and-aggregate over a table whose
memory is on the scanning thread's node, one hop away and two hops away, in one run.

The seed ran TPC-H Q1 at SF100 on a 4-socket Xeon with the process pinned to sockets 0-1 and its
memory bound to each socket in turn: local memory was fastest, the socket two hops away slowest.
Here one thread pinned to the CPUs of ``--node`` (default 0) scans a Q1-like table (quantity, price,
discount, tax, ship date and a return flag, ``--mib`` MiB in all) and aggregates by flag.  Each
column is a mapping of its own bound to the node under test before it is filled (`cod.client.
memory.bind_range`, the call an engine makes), and numa_maps confirms where its pages are.  The nodes
under test are chosen by the distances in sysfs: the home node, the nearest other node ("1 hop")
and the farthest ("2 hops"; on a 2-node machine there is none).  Each repetition scans every
placement in turn, so load that comes and goes touches them alike.

Prints JSON beside the seed's ordering and writes results/exp6_memory_distance.json.  In the TCG
test guest the times mean nothing about hardware (emulated memory has no distance); the script
runs there (tests/vm/test_memory.py) and on any NUMA machine:
    flock /tmp/cod-bench.lock .venv/bin/python bench/experiments/exp6_memory_distance.py
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import time
from pathlib import Path

import numpy as np

from cod.client.memory import bind_range
from cod.facts import procfs

RESULTS = Path(__file__).resolve().parent / "results"
SEED_ORDER = ["local", "1 hop", "2 hops"]  # fastest first, as the seed measured
ROW_BYTES = 5 * 8 + 1


def distances(node: int) -> dict[int, int]:
    """Node -> distance from ``node`` (sysfs), for the nodes that have memory and CPUs."""
    base = "/sys/devices/system/node"
    online = procfs.parse_cpu_list(open(f"{base}/online").read().strip())
    row = [int(x) for x in open(f"{base}/node{node}/distance").read().split()]
    return {n: row[i] for i, n in enumerate(online)}


def placements(node: int) -> dict[str, int]:
    """'local', '1 hop', '2 hops' -> the node holding the table (the nearest and the farthest other)."""
    others = sorted((d, n) for n, d in distances(node).items() if n != node)
    out = {"local": node}
    if others:
        out["1 hop"] = others[0][1]
        if others[-1][0] > others[0][0]:
            out["2 hops"] = others[-1][1]
    return out


def on_node(values: np.ndarray, node: int) -> np.ndarray:
    """A copy of ``values`` in a mapping of its own whose pages are bound to ``node`` before they
    are first touched (`cod.client.memory.bind_range`, the call an engine makes for its buffers)."""
    size = max(values.nbytes, 1)
    buf = mmap.mmap(-1, size)
    column = np.frombuffer(buf, dtype=values.dtype, count=values.size)
    bind_range(column.__array_interface__["data"][0], size, [node])
    column[:] = values
    return column


def build_table(rows: int, node: int, seed: int = 26) -> dict[str, np.ndarray]:
    """The table's columns, each in its own mapping on ``node``."""
    rng = np.random.default_rng(seed)
    columns = {
        "quantity": rng.integers(1, 51, rows).astype(np.float64),
        "price": rng.uniform(900.0, 105000.0, rows),
        "discount": rng.integers(0, 11, rows) / 100.0,
        "tax": rng.integers(0, 9, rows) / 100.0,
        "shipdate": rng.integers(0, 2557, rows).astype(np.int64),  # days since 1992-01-01
        "flag": rng.integers(0, 3, rows).astype(np.int8),
    }
    return {name: on_node(values, node) for name, values in columns.items()}


def q1(t: dict[str, np.ndarray]) -> np.ndarray:
    """Q1's shape: filter on the ship date, then per flag the sums of quantity, price, discounted
    price and charge, and the count."""
    keep = t["shipdate"] <= 2557 - 90
    flag = t["flag"][keep]
    price, disc = t["price"][keep], t["discount"][keep]
    disc_price = price * (1.0 - disc)
    charge = disc_price * (1.0 + t["tax"][keep])
    return np.stack([np.bincount(flag, weights=w, minlength=3)
                     for w in (t["quantity"][keep], price, disc_price, charge, np.ones_like(price))])


def pages_on(node: int, arrays: list[np.ndarray]) -> float:
    """The share of the table's pages on ``node`` (numa_maps of this process, by address)."""
    ranges = procfs.numa_ranges(os.getpid())
    on = total = 0
    for a in arrays:
        addr = a.__array_interface__["data"][0]
        for r in ranges:
            if r.start <= addr < r.end:
                total += sum(r.pages.values())
                on += r.pages.get(node, 0)
    return on / total if total else 0.0


def run(args: argparse.Namespace) -> dict:
    home_cpus = procfs.parse_cpu_list(open(f"/sys/devices/system/node/node{args.node}/cpulist").read().strip())
    os.sched_setaffinity(0, [home_cpus[0]])  # one scanning thread on the home node
    where = placements(args.node)
    rows = (args.mib << 20) // ROW_BYTES
    tables = {label: build_table(rows, node) for label, node in where.items()}
    share = {label: round(pages_on(where[label], list(t.values())), 4) for label, t in tables.items()}
    answers = {label: q1(t) for label, t in tables.items()}
    first = next(iter(answers.values()))
    assert all(np.allclose(a, first) for a in answers.values()), "the same table gave different answers"
    times: dict[str, list[float]] = {label: [] for label in tables}
    for _ in range(args.repeat):
        for label, t in tables.items():
            t0 = time.perf_counter()
            q1(t)
            times[label].append(time.perf_counter() - t0)
    med = {label: statistics.median(ts) for label, ts in times.items()}
    order = sorted(med, key=med.get)
    return {
        "node": args.node, "cpu": home_cpus[0], "table_mib": args.mib, "rows": rows, "repeat": args.repeat,
        "placement_nodes": where, "distances": {label: distances(args.node)[n] for label, n in where.items()},
        "pages_on_placement_node": share,
        "median_s": {label: round(v, 4) for label, v in med.items()},
        "relative_to_local": {label: round(v / med["local"], 3) for label, v in med.items()},
        "gb_per_s": {label: round(args.mib / 1024 * 1.0737 / v, 2) for label, v in med.items()},
        "ordering_measured": order,
        "ordering_seed": [label for label in SEED_ORDER if label in med],
        "same_order_as_seed": order == [label for label in SEED_ORDER if label in med],
        "machine_load": [round(x, 2) for x in os.getloadavg()],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--node", type=int, default=0, help="the scanning thread's node (default 0)")
    p.add_argument("--mib", type=int, default=256, help="table size per placement (default 256 MiB)")
    p.add_argument("--repeat", type=int, default=5, help="scans of each placement (default 5)")
    p.add_argument("--no-write", action="store_true", help="print only; do not write results/")
    args = p.parse_args(argv)
    result = run(args)
    print(json.dumps(result, indent=1))
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "exp6_memory_distance.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

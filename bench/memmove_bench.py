"""How fast a task's pages follow it to another node, and how long the task stalls meanwhile; prints JSON.

    python bench/memmove_bench.py [--mib 256] [--from-node 0] [--to-node LAST] [--loop-s 3]

A child process (the "task") maps ``--mib`` MiB on the first node and then writes one byte of
every page, page after page, round and round, noting the largest gap between two checkpoints
of its loop (every 256 pages).  In one run the bench measures that gap

* ``baseline``: for ``--loop-s`` seconds with nothing moving (a TCG guest pauses tasks by itself);
* ``batched``: while COD's `PageMover` moves the pages to the other node (the task pinned there
  first, as the RM does), in ``move_pages`` calls sized to a 20 ms budget;
* ``one_call``: while ``migrate_pages(2)`` moves them back in one call, the way a write of
  ``cpuset.mems`` does,

and the time each move took (seconds per GiB).  Needs two NUMA nodes (a machine with one prints
``skipped``).  Run it under the benchmark lock: ``flock /tmp/cod-bench.lock ...`` on a shared
machine; in the 4-node test guest through ``make vm-test`` (tests/vm/test_memory.py runs it small).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from cod.facts import procfs
from cod.rm.enforce.cpuset import migrate_pages, online_nodes
from cod.rm.enforce.pagemove import BUDGET_S, PageMover

TASK = r"""
import mmap, os, sys, threading, time
size = int(sys.argv[1]) << 20
buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for off in range(0, size, 4096):
    buf[off] = 1
state = {"gap": 0.0, "rounds": 0}

def commands():
    for line in sys.stdin:  # "window": the largest gap since the last window, then start anew
        gap, rounds = state["gap"], state["rounds"]
        state["gap"], state["rounds"] = 0.0, 0
        print(f"{gap} {rounds}", flush=True)
    os._exit(0)

threading.Thread(target=commands, daemon=True).start()
print("ready", flush=True)
last = time.perf_counter()
while True:
    for start in range(0, size, 1 << 20):
        for off in range(start, start + (1 << 20), 4096):
            buf[off] = 2
        now = time.perf_counter()
        if now - last > state["gap"]:
            state["gap"] = now - last
        last = now
    state["rounds"] += 1
"""


def node_cpus(node: int) -> list[int]:
    with open(f"/sys/devices/system/node/node{node}/cpulist") as f:
        return list(procfs.parse_cpu_list(f.read().strip()))


class Task:
    def __init__(self, mib: int, cpus: list[int]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", TASK, str(mib)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True,
                                     preexec_fn=lambda: os.sched_setaffinity(0, cpus))
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            raise SystemExit(f"the task did not start: {line!r}")

    def pin(self, cpus: list[int]) -> None:
        for tid in procfs.thread_ids(self.proc.pid):
            os.sched_setaffinity(tid, cpus)

    def window(self) -> tuple[float, int]:
        """The largest gap of its loop (s) and its rounds over the buffer since the last window."""
        self.proc.stdin.write("window\n")
        self.proc.stdin.flush()
        gap, rounds = self.proc.stdout.readline().split()
        return float(gap), int(rounds)

    def pages(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for rng in procfs.numa_ranges(self.proc.pid):
            for node, n in rng.pages.items():
                out[node] = out.get(node, 0) + n * (rng.page_size // 4096)
        return out

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def share_on(pages: dict[int, int], node: int) -> float:
    return round(pages.get(node, 0) / max(1, sum(pages.values())), 4)


def measure(args: argparse.Namespace) -> dict:
    nodes = online_nodes()
    if len(nodes) < 2:
        return {"skipped": f"one NUMA node ({nodes})"}
    src, dst = args.from_node, nodes[-1] if args.to_node is None else args.to_node
    gib = args.mib / 1024
    task = Task(args.mib, node_cpus(src))
    try:
        out: dict = {"mib": args.mib, "from_node": src, "to_node": dst, "budget_ms": BUDGET_S * 1000,
                     "share_on_from_node_at_start": share_on(task.pages(), src)}
        task.window()
        time.sleep(args.loop_s)
        base_gap, base_rounds = task.window()
        out["baseline"] = {"largest_gap_ms": round(base_gap * 1000, 1), "rounds": base_rounds,
                           "seconds": args.loop_s}

        task.pin(node_cpus(dst))
        task.window()
        report = PageMover(budget_s=args.budget_ms / 1000).move(task.proc.pid, [dst])
        gap, rounds = task.window()
        out["batched"] = {"seconds": round(report.elapsed_s, 3), "s_per_gib": round(report.elapsed_s / gib, 2),
                          "pages_moved": report.moved, "pages_not_moved": report.failed, "calls": report.calls,
                          "largest_call_ms": round(report.largest_call_s * 1000, 1),
                          "largest_gap_ms": round(gap * 1000, 1), "rounds": rounds,
                          "gap_beyond_baseline_ms": round((gap - base_gap) * 1000, 1),
                          "share_on_to_node": share_on(task.pages(), dst)}

        task.pin(node_cpus(src))
        task.window()
        t0 = time.perf_counter()
        left = migrate_pages(task.proc.pid, [dst], [src])
        took = time.perf_counter() - t0
        gap, rounds = task.window()
        out["one_call"] = {"seconds": round(took, 3), "s_per_gib": round(took / gib, 2), "pages_not_moved": left,
                           "largest_gap_ms": round(gap * 1000, 1), "rounds": rounds,
                           "gap_beyond_baseline_ms": round((gap - base_gap) * 1000, 1),
                           "share_on_from_node": share_on(task.pages(), src)}
    finally:
        task.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=256, help="the task's memory (default 256 MiB)")
    p.add_argument("--from-node", type=int, default=0)
    p.add_argument("--to-node", type=int, default=None, help="default: the last online node")
    p.add_argument("--loop-s", type=float, default=3.0, help="the baseline window (default 3 s)")
    p.add_argument("--budget-ms", type=float, default=BUDGET_S * 1000, help="longest move_pages call aimed at")
    args = p.parse_args(argv)
    result = {"machine_load_before": [round(x, 2) for x in os.getloadavg()]}
    try:
        with open("/proc/sys/kernel/numa_balancing") as f:
            result["numa_balancing"] = f.read().strip()
    except OSError:
        result["numa_balancing"] = None
    result.update(measure(args))
    result["machine_load_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

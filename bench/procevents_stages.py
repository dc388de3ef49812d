"""Where an exec event's latency goes: per-stage kernel timestamps, one exec at a time; prints JSON.

    flock /tmp/cod-bench.lock .venv/bin/python bench/procevents_stages.py [--source bpf] [--execs 300] [--fifo]

The paced loop of bench/procevents_bench.py (/bin/true, ``sleep 0.002``) runs against one source
while ``perf record -a -k CLOCK_MONOTONIC`` records the kernel's own tracepoints: the exec
(``sched_process_exec``) and the rename before it (``task_rename``), the IRQ-work interrupts
that deliver a ring buffer's wake-ups (``irq_work_entry``), the reader thread's wake-up
(``sched_waking``), its getting a CPU (``sched_switch``) and its return from ``epoll_wait``.
For each exec of the loop's children, every stage is given in microseconds after the exec
tracepoint (``stamp``: the source's own timestamp of the exec, which the end-to-end bench
trusts; ``child_off_cpu``: when the exec'ing child first left its CPU after the exec;
``fork``/``fork_wake``: the child's fork and the reader's first wake-up after it, and whether that
wake-up put the reader on the CPU the child later exec'd on), and the reader's state when the
exec happened:

* ``sleeping``: inside epoll_wait, not woken since it went in: the exec's own record must wake it;
* ``woken``: inside epoll_wait but already woken by an earlier record (fork, the exec's rename),
  waiting for a CPU or on its way out: the exec is read when that wake-up's reader runs;
* ``running``: out of epoll_wait, handling earlier events.

These figures do not depend on the machine's load the way the end-to-end latency does: the
load moves time between ``waking`` and ``switch``, not the rest.  ``--fifo`` runs the reader
SCHED_FIFO (its children not: reset on fork) to take the run-queue wait out, a diagnosis only
(the RM runs SCHED_OTHER).  The reader asks for the short EEVDF slice the RM's loop asks for
(rm/enforce/slice.py) unless ``--default-slice``.  ``--object``/``--library`` load another build of the BPF source
(A/B against a saved copy).  Root and perf are needed.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import collections
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

from cod.rm.enforce import bpfevents
from cod.rm.enforce.procevents import ConnectorSource
from cod.rm.enforce.slice import request_slice

EVENTS = ["sched:sched_process_fork", "sched:sched_process_exec", "task:task_rename", "irq_vectors:irq_work_entry",
          "sched:sched_waking", "sched:sched_wakeup", "sched:sched_switch",
          "syscalls:sys_enter_epoll_wait", "syscalls:sys_exit_epoll_wait"]
LINE = re.compile(r"^\s*(.+?)\s+(\d+)\s+\[(\d+)\]\s+(\d+)\.(\d+):\s+(\S+):\s*(.*)$")
STAGES = ("stamp", "fork", "fork_wake", "rename", "child_off_cpu", "waking", "switch", "epoll_return", "ready", "decoded")


def run_loop(kind: str, execs: int) -> dict:
    """The paced exec loop against one source; per exec of its children: (pid, ts, ready, decoded)."""
    src = bpfevents.BpfSource() if kind == "bpf" else ConnectorSource()
    rows: list[tuple[int, int, int, int]] = []
    wakes = 0

    async def main() -> None:
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        shell: list[int] = []
        children: set[int] = set()

        def ready() -> None:
            nonlocal wakes
            now = time.monotonic_ns()
            events = src.read_events()
            decoded = time.monotonic_ns()
            wakes += 1
            for ev in events:
                if not shell and ev.kind == "fork" and ev.parent_tgid == os.getpid() and not ev.is_thread:
                    shell.append(ev.pid)
                if ev.kind == "fork" and shell and ev.parent_tgid == shell[0]:
                    children.add(ev.pid)
                elif ev.kind == "exec" and ev.pid in children:
                    rows.append((ev.pid, ev.timestamp_ns, now, decoded))
                elif ev.kind == "exit" and shell and ev.pid == shell[0] and not done.done():
                    done.set_result(None)
        src.read_events()
        loop.add_reader(src.fileno(), ready)
        proc = await asyncio.create_subprocess_exec(
            "sh", "-c", f"i=0; while [ $i -lt {execs} ]; do /bin/true; sleep 0.002; i=$((i+1)); done")
        await proc.wait()
        await asyncio.wait_for(done, 60)
        loop.remove_reader(src.fileno())
    try:
        asyncio.run(main())
    finally:
        src.close()
    return {"tid": threading.get_native_id(), "rows": rows, "reader_wakeups": wakes}


def parse_perf(path: str, tid: int) -> dict:
    text = subprocess.run(["perf", "script", "-i", path, "-F", "comm,tid,cpu,time,event,trace", "--ns"],
                          capture_output=True, text=True, check=True).stdout
    out: dict = {"fork": {}, "rename": {}, "exec": {}, "irq_work": [], "waking": [], "switch": [], "enter": [], "exit": [], "wakeup": [], "waker": [], "off_cpu": {}}
    for line in text.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        _, thread, cpu, sec, ns, event, rest = m.groups()
        t = int(sec) * 10**9 + int(ns.ljust(9, "0")[:9])
        if event == "sched:sched_process_fork":
            out["fork"][int(re.search(r"child_pid=(\d+)", rest).group(1))] = (t, int(thread))
        elif event == "task:task_rename":
            out["rename"].setdefault(int(re.search(r"pid=(\d+)", rest).group(1)), t)
        elif event == "sched:sched_process_exec":
            out["exec"][int(re.search(r" pid=(\d+)", rest).group(1))] = (t, int(cpu))
        elif event == "irq_vectors:irq_work_entry":
            out["irq_work"].append((t, int(cpu)))
        elif event == "sched:sched_waking" and re.search(rf"\bpid={tid}\b", rest):
            out["waking"].append(t)
            out["waker"].append((t, int(thread)))  # the waker's context (sched_wakeup may come on the target CPU)
        elif event == "sched:sched_wakeup" and re.search(rf"\bpid={tid}\b", rest):
            out["wakeup"].append((t, int(re.search(r"target_cpu=(\d+)", rest).group(1))))
        elif event == "sched:sched_switch":
            if re.search(rf"next_pid={tid}\b", rest):
                out["switch"].append(t)
            prev = int(re.search(r"prev_pid=(\d+)", rest).group(1))
            out["off_cpu"].setdefault(prev, []).append(t)  # sorted: perf script is in time order
        elif event.startswith("syscalls:sys_") and int(thread) == tid:
            out["enter" if "enter" in event else "exit"].append(t)
    for k in ("irq_work", "waking", "waker", "wakeup", "switch", "enter", "exit"):
        out[k].sort()
    return out


def last_before(xs: list, t: int) -> int:
    i = bisect.bisect_right(xs, t)
    return xs[i - 1] if i else 0


def stages(loop: dict, trace: dict) -> list[dict]:
    """Per exec: each stage in us after the exec tracepoint, the reader's state, and whether an
    IRQ-work interrupt came on the exec's CPU within 30 us (a ring buffer wake-up queued)."""
    out = []
    irq_times = [t for t, _ in trace["irq_work"]]
    for pid, ts, ready, decoded in loop["rows"]:
        if pid not in trace["exec"]:
            continue
        e, cpu = trace["exec"][pid]
        entered, left = last_before(trace["enter"], e), last_before(trace["exit"], e)
        state = "running" if left >= entered else (
            "woken" if last_before(trace["waking"], e) > entered else "sleeping")
        ret = last_before(trace["exit"], ready)
        i = bisect.bisect_left(irq_times, e)
        irq = any(c == cpu and t <= e + 30_000 for t, c in trace["irq_work"][i:i + 8])
        waking = last_before(trace["waking"], ret)
        j = bisect.bisect_left(trace["wakeup"], (waking,))
        target = trace["wakeup"][j][1] if j < len(trace["wakeup"]) else None
        fork, parent = trace["fork"].get(pid, (0, 0))
        # the parent's first wake-up of the reader from its fork on (the connector sends its
        # message a few us before the fork tracepoint fires), before the exec
        f = bisect.bisect_left(trace["waker"], (fork - 30_000,))
        by_parent = next((w for w, who in trace["waker"][f:f + 16] if who == parent and w < e), None) if fork else None
        g = bisect.bisect_left(trace["wakeup"], (by_parent,)) if by_parent else len(trace["wakeup"])
        fork_wake = (by_parent, trace["wakeup"][g][1]) if g < len(trace["wakeup"]) else None
        row = {"state": state, "irq_work_30us": irq, "on_exec_cpu": target == cpu,
               # the reader's first wake-up after the child's fork (its fork record), onto the exec's CPU?
               "fork_wake_on_exec_cpu": fork_wake[1] == cpu if fork_wake else None,
               "stamp": round((ts - e) / 1e3, 1),  # the source's timestamp against perf's
               "idle_before": round((e - entered) / 1e3, 1)}  # the reader's time in epoll_wait so far
        offs = trace["off_cpu"].get(pid, [])
        k = bisect.bisect_left(offs, e)
        times = {"fork": fork, "fork_wake": fork_wake[0] if fork_wake else None,
                 "rename": trace["rename"].get(pid), "child_off_cpu": offs[k] if k < len(offs) else None,
                 "waking": waking,
                 "switch": last_before(trace["switch"], ret), "epoll_return": ret,
                 "ready": ready, "decoded": decoded}
        row.update({k: round((v - e) / 1e3, 1) if v else None for k, v in times.items()})
        out.append(row)
    return out


def pct(values: list, q: float) -> float | None:
    v = sorted(x for x in values if x is not None)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))] if v else None


def summarize(rows: list[dict]) -> dict:
    res: dict = {"n": len(rows), "stages_us": {}, "by_state": {}}
    for k in STAGES:
        vals = [r[k] for r in rows]
        res["stages_us"][k] = {"p50": pct(vals, .5), "p90": pct(vals, .9), "p99": pct(vals, .99)}
    groups = collections.defaultdict(list)
    for r in rows:
        groups[r["state"]].append(r)
    for state, rs in sorted(groups.items()):
        res["by_state"][state] = {
            "n": len(rs), "irq_work_within_30us": sum(r["irq_work_30us"] for r in rs),
            "woken_onto_the_exec_cpu": sum(r["on_exec_cpu"] for r in rs),
            "fork_record_woke_it_onto_the_exec_cpu": sum(bool(r["fork_wake_on_exec_cpu"]) for r in rs),
            "decoded_p50": pct([r["decoded"] for r in rs], .5), "decoded_p90": pct([r["decoded"] for r in rs], .9),
            "decoded_max": pct([r["decoded"] for r in rs], 1.0)}
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", choices=["bpf", "connector"], default="bpf")
    ap.add_argument("--execs", type=int, default=300, help="paced /bin/true + sleep pairs (n is twice this)")
    ap.add_argument("--fifo", action="store_true", help="run the reader SCHED_FIFO (diagnosis only)")
    ap.add_argument("--default-slice", action="store_true",
                    help="leave the reader the default EEVDF slice (the RM asks for a short one: enforce/slice.py)")
    ap.add_argument("--object", help="another procevents.bpf.o (A/B)")
    ap.add_argument("--library", help="another libcod_procevents.so (A/B)")
    ap.add_argument("--rows", help="write the per-exec rows to this JSON file")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print(json.dumps({"skipped": "root is needed"}))
        return 0
    if args.object:
        bpfevents.OBJECT = args.object
    if args.library:
        bpfevents.LIBRARY = args.library
    if args.fifo:
        os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(50))
    if not args.default_slice:
        request_slice()
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "perf.data")
        cmd = ["perf", "record", "-q", "-a", "-k", "CLOCK_MONOTONIC", "-o", data]
        for ev in EVENTS:
            cmd += ["-e", ev]
        perf = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # perf opens its events
        try:
            loop = run_loop(args.source, args.execs)
        finally:
            perf.send_signal(signal.SIGINT)
            perf.wait(30)
        rows = stages(loop, parse_perf(data, loop["tid"]))
    if args.rows:
        with open(args.rows, "w") as f:
            json.dump(rows, f)
    result = {"source": args.source, "fifo": args.fifo, "object": args.object,
              "reader_slice": "default" if args.default_slice else "short (as the RM's)",
              "load_average_before": [round(x, 2) for x in load],
              "load_average_after": [round(x, 2) for x in os.getloadavg()],
              "execs_seen": len(loop["rows"]), "execs_expected": 2 * args.execs,
              "reader_wakeups": loop["reader_wakeups"], **summarize(rows)}
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

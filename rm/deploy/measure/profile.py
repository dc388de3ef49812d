"""`cod profile`: resource activity vectors of a running process's threads.

``cpu_util`` of a thread is its time on a CPU over the wall time of the window
(the paper's active time; Eq. 1 with IPC folded out, since IPC needs a PMU).
With hardware counters, ``mem_bw`` is LLC misses x 64 bytes over the window
(Eq. 2, the paper's approximation on Intel) and ``ipc`` is reported beside it;
without them ``mem_bw`` stays null (unknown) unless the template gives one.

The output is the graph format of ``cod deploy-plan``: one operator per thread,
named by the thread's name (its comm), so an engine that names its operator
threads gets per-operator RAVs.  Threads sharing a name are siblings (the
threads of one parallel operator) and get ids ``name#TID``.  A *template* (a
graph the engine wrote: edges, blocking flags, siblings) is merged in by id.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..graph import parse_graph
from ..plan import comm_key
from . import perf
from .threads import ProfileError, ThreadSample, detect_source, sample_process, start_time

# Locality strength (seed 003, MCC-DB) estimated from a thread's LLC misses per 1,000
# instructions (MPKI): a small hot working set misses rarely, large one-time accesses miss on
# nearly every new line.  The seed classes plans from their data structures' sizes (done in the
# SKB: stored_procedures/locality.pl); these bounds are ours, to be tuned on RDT hardware
# (docs/deploy.md): below STRONG_MPKI strong, below WEAK_MPKI moderate, else weak.
STRONG_MPKI = 1.0
WEAK_MPKI = 10.0

# A thread runnable but not running for more than this share of the window was starved.
# (Threads woken together, as periodic operators are, queue for a few percent of it.)
CONTENDED_WAIT = 0.25


@dataclass
class Window:
    """Two samples of a process's threads and what happened between them."""

    pid: int
    seconds: float
    source: str
    before: dict[int, ThreadSample]
    after: dict[int, ThreadSample]
    counters: dict[int, dict[str, int | None]] = field(default_factory=dict)
    pmu: tuple[bool, str] = (False, "not asked for")


def measure(pid: int, seconds: float, *, proc_root: str = "/proc", source: str | None = None,
            use_pmu: bool = True, sleep: Callable[[float], None] = time.sleep) -> Window:
    """Sample ``pid``'s threads, wait ``seconds``, sample again (with counters if asked)."""
    if not seconds > 0:
        raise ProfileError(f"seconds: must be > 0, got {seconds!r}")
    born = start_time(pid, proc_root)
    src = source or detect_source(pid, proc_root)
    pmu = perf.probe() if use_pmu else (False, "not asked for (--no-pmu)")
    open_counters: dict[int, perf.ThreadCounters] = {}
    try:
        t0 = time.monotonic()
        before = sample_process(pid, src, proc_root)
        if pmu[0]:
            for tid in before:
                try:
                    open_counters[tid] = perf.ThreadCounters.open(tid)
                except perf.PerfError:
                    pass  # the thread exited, or this one is not ours to count
        sleep(seconds)
        counts = {tid: c.read() for tid, c in open_counters.items()}
        after = sample_process(pid, src, proc_root)
        wall = time.monotonic() - t0
    finally:
        for c in open_counters.values():
            c.close()
    if start_time(pid, proc_root) != born:
        raise ProfileError(f"process {pid} exited during the window (its pid now names another process)")
    return Window(pid, wall, src, before, after, counts, pmu)


def _ids(samples: list[ThreadSample]) -> dict[int, tuple[str, str | None]]:
    """TID -> (operator id, sibling group): the comm, or comm#TID when a name repeats."""
    by_name: dict[str, list[int]] = {}
    for s in samples:
        by_name.setdefault(s.comm, []).append(s.tid)
    out = {}
    for name, tids in by_name.items():
        for tid in tids:
            out[tid] = (name, None) if len(tids) == 1 else (f"{name}#{tid}", name)
    return out


def to_graph(w: Window, template: dict[str, Any] | None = None,
             threads: str | None = None) -> dict[str, Any]:
    """The profile as a deploy-plan graph (plain JSON data)."""
    pattern = re.compile(threads) if threads else None
    live = [s for tid, s in sorted(w.after.items()) if pattern is None or pattern.search(s.comm)]
    ids = _ids(live)
    tmpl_ops: dict[str, dict[str, Any]] = {}
    if template is not None:
        parse_graph(template)  # refuse a malformed template with the usual messages
        tmpl_ops = {op["id"]: op for op in template["operators"]}
    # The template names operators by thread name, possibly longer than a comm's 15 bytes.
    by_comm = {comm_key(k): k for k in tmpl_ops}

    operators = []
    from_template: dict[str, list[str]] = {}  # template id -> profiled operator ids
    for s in live:
        op_id, siblings = ids[s.tid]
        op = _measured_operator(w, s, op_id, siblings)
        t = tmpl_ops.get(s.comm) or tmpl_ops.get(by_comm.get(s.comm, ""))
        if t is not None:
            if siblings is None:
                op["id"] = t["id"]  # the engine's full name, not the 15-byte comm
            from_template.setdefault(t["id"], []).append(op["id"])
            op["blocking"] = bool(t.get("blocking", False))
            if t.get("siblings"):
                op["siblings"] = t["siblings"]
            if op["mem_bw"] is None and t.get("mem_bw") is not None:
                op["mem_bw"] = t["mem_bw"]
                op["mem_bw_from"] = "template"
        operators.append(op)

    edges: list[list[str]] = []
    if template is not None:
        # A sibling group's threads all inherit the edges of their operator.
        for a, b in template.get("edges", []):
            for x in from_template.get(a, []):
                for y in from_template.get(b, []):
                    if [x, y] not in edges:
                        edges.append([x, y])
    return {
        "operators": operators,
        "edges": edges,
        "profile": {
            "pid": w.pid,
            "seconds": round(w.seconds, 6),
            "cpu_time_source": w.source,
            "pmu": {"available": w.pmu[0], "detail": w.pmu[1],
                    "mem_bw": "LLC misses x 64 B / window (Eq. 2)" if w.pmu[0] else
                    "unknown: no hardware counters" + (" (taken from the template where given)" if template else ""),
                    "locality": f"LLC misses per 1,000 instructions: strong < {STRONG_MPKI:g}, moderate < "
                                f"{WEAK_MPKI:g}, weak from there (MCC-DB's classes, estimated)" if w.pmu[0] else
                                "unknown: no hardware counters"},
            "threads": len(operators),
            "exited_during_window": sorted(set(w.before) - set(w.after)),
            "template_operators_not_running": sorted(set(tmpl_ops) - set(from_template)),
            "warnings": _contention_warnings(operators),
        },
    }


def _measured_operator(w: Window, s: ThreadSample, op_id: str, siblings: str | None) -> dict[str, Any]:
    """One thread's operator as the window measured it: cpu_util, run-queue wait, counters."""
    prev = w.before.get(s.tid)
    ran = s.run_ns - (prev.run_ns if prev else 0)
    cpu_util = min(1.0, max(0.0, ran / (w.seconds * 1e9)))
    op: dict[str, Any] = {"id": op_id, "cpu_util": round(cpu_util, 6), "mem_bw": None,
                          "blocking": False}
    if siblings:
        op["siblings"] = siblings
    op.update({"tid": s.tid, "comm": s.comm, "started_in_window": prev is None})
    if s.wait_ns is not None:
        waited = s.wait_ns - ((prev.wait_ns or 0) if prev else 0)
        op["runqueue_wait"] = round(max(0.0, waited / (w.seconds * 1e9)), 6)
    c = w.counters.get(s.tid)
    if c:
        instr, cycles, misses = c.get("instructions"), c.get("cycles"), c.get("llc_misses")
        op.update({"instructions": instr, "cycles": cycles, "llc_misses": misses,
                   "ipc": round(instr / cycles, 4) if instr and cycles else None})
        if misses is not None:
            op["mem_bw"] = round(misses * perf.CACHE_LINE_BYTES / w.seconds, 1)
        estimate = locality_from_counters(instr, misses)
        if estimate is not None:
            op["locality"], op["llc_mpki"] = estimate
    return op


def locality_from_counters(instructions: int | None, llc_misses: int | None) -> tuple[str, float] | None:
    """(locality class, MPKI) of a thread from its counters; None when they say too little
    (no counters, or no instruction counted)."""
    if not instructions or llc_misses is None or instructions < 0 or llc_misses < 0:
        return None
    mpki = llc_misses * 1000 / instructions
    cls = "strong" if mpki < STRONG_MPKI else "moderate" if mpki < WEAK_MPKI else "weak"
    return cls, round(mpki, 3)


def _contention_warnings(operators: list[dict[str, Any]]) -> list[str]:
    """A warning when threads waited for a CPU: their cpu_util may understate what they need."""
    waits = [op["runqueue_wait"] for op in operators if "runqueue_wait" in op]
    busy = [op for op in operators if op.get("runqueue_wait", 0) > CONTENDED_WAIT]
    if not busy:
        return []
    return [f"{len(busy)} thread(s) waited for a CPU more than {CONTENDED_WAIT:.0%} of the window "
            f"(up to {max(waits):.0%}): the machine was contended, so cpu_util may understate what "
            "they need; profile on an idle machine, or with the threads pinned one per core, as the paper does"]

"""What exp3's COD variant needs to run under a chosen enforcement mode, and what it measures
there (Figure 6 in the sched_ext guest, issue 27):

* `scheduler`: scx_cod loaded for ``--enforce sched_ext`` (started here unless it runs), and no
  sched_ext scheduler for the other modes (so that they run under the kernel's own);
* `AllocationPoller`: the CPUs the RM keeps for a task (what it announced to the task,
  `list_tasks`), sampled over time;
* `newcomer_figures`: where a newcomer ran against those CPUs.  The newcomers are
  tests/vm/percpu.c (built here) with one spinning thread: it charges its run time to the CPU
  `sched_getcpu()` names, in slices of at most SLICE_MS, so the time can be set against the
  allocation's samples.
"""

from __future__ import annotations

import subprocess
import tempfile
import threading
import time
from bisect import bisect_left, bisect_right
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import common as c

PERCPU_SRC = c.REPO / "tests" / "vm" / "percpu.c"
SLICE_MS = 50
# A newcomer stops this long before the task's run ends: once the task has left, the RM frees
# its CPUs and a newcomer may go there (the first guest run's newcomers ran 5-22 ms on them so).
END_MARGIN_S = 2.0


@contextmanager
def scheduler(mode: str | None) -> Iterator[str]:
    """The sched_ext scheduler a run in enforcement ``mode`` needs; yields what is in force."""
    from cod.rm.enforce.errors import EnforceError
    from cod.rm.enforce.scxloader import ScxLoader, built_loader
    from cod.rm.enforce.scxmaps import scheduler_state

    running = scheduler_state() is None
    if mode != "sched_ext":
        if running and mode is not None:
            raise SystemExit(f"scx_cod is running: a run with --enforce {mode} would not be under the kernel's "
                             "own scheduler; stop it first")
        yield "scx_cod (already running)" if running else "the kernel's own (no sched_ext scheduler)"
        return
    if running:
        yield "scx_cod (already running)"
        return
    try:
        loader = ScxLoader(built_loader(c.REPO))
    except EnforceError as err:
        raise SystemExit(str(err)) from err
    with loader:
        yield "scx_cod (started for this run)"


def build_percpu(into: Path) -> Path:
    exe = into / "percpu"
    subprocess.run(["cc", "-std=gnu11", "-O1", "-Wall", "-Wextra", "-Werror", "-pthread", "-o", str(exe),
                    str(PERCPU_SRC)], check=True)
    return exe


@contextmanager
def percpu_newcomer() -> Iterator[callable]:
    """Yields ``command(seconds)``: a one-thread percpu run, with slices, that ends END_MARGIN_S
    before ``seconds``."""
    with tempfile.TemporaryDirectory(prefix="cod-percpu-") as d:
        exe = build_percpu(Path(d))
        yield lambda seconds: [str(exe), "1", f"{max(seconds - END_MARGIN_S, 0.1):.3f}", str(SLICE_MS)]


class AllocationPoller:
    """The CPUs the RM announced to ``task``, every ``interval`` s: ``samples`` holds
    (sent ns, received ns, cores) on CLOCK_MONOTONIC (percpu's clock).  ``enforcement`` is
    what get_topology said was in force when it started."""

    def __init__(self, sock: Path, task: str, interval: float = 0.2) -> None:
        from cod.client import Client

        self.task, self.interval = task, interval
        self.samples: list[tuple[int, int, frozenset[int]]] = []
        self.error: str | None = None
        self.client = Client(str(sock), app="experiment-poller")
        self.enforcement = self.client.call("get_topology").get("enforcement", {})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                sent = time.monotonic_ns()
                tasks = self.client.call("list_tasks")["tasks"]
                cores = next((t["cores"] for t in tasks if t["task"] == self.task), ())
                self.samples.append((sent, time.monotonic_ns(), frozenset(cores)))
                self._stop.wait(self.interval)
        except Exception as err:  # noqa: BLE001 (reported with the figures: later slices go unattributed)
            self.error = f"{type(err).__name__}: {err}"

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        self.client.close()


def kept_throughout(samples: list[tuple[int, int, frozenset[int]]], start: int, end: int) -> frozenset[int] | None:
    """The CPUs every sample from the last one received before ``start`` to the first one sent
    after ``end`` names (so the task held them over the whole interval, unless they left and
    came back between two samples); None when no samples bracket the interval."""
    received = [r for _s, r, _cores in samples]
    sent = [s for s, _r, _cores in samples]
    first = bisect_right(received, start) - 1
    last = bisect_left(sent, end)
    if first < 0 or last >= len(samples):
        return None
    kept = samples[first][2]
    for _s, _r, cores in samples[first + 1:last + 1]:
        kept = kept & cores
    return kept


def newcomer_figures(out: dict, samples: list, t0_ns: int, arrival_s: float) -> tuple[dict, list[dict]]:
    """Where one newcomer (percpu's JSON ``out``) ran: in all, and on the CPUs kept for the task
    then (ms), with its first and last moments there in s after its arrival, and while the task
    held no CPU (not registered yet, or gone).  Also its slices on any CPU the task ever held, as
    rows (times in s from the task's start) for a CSV."""
    ever = frozenset().union(*(cores for _s, _r, cores in samples))
    on, unknown, none_held, rows = [], 0, 0, []
    for start, end, cpu, ran, _thread in out["slices"]:
        kept = kept_throughout(samples, start, end)
        if kept is None:
            unknown += ran
        elif not kept:
            none_held += ran
        elif cpu in kept:
            on.append((start, end, ran))
        if cpu in ever:
            rows.append({"arrival_s": arrival_s, "start_s": round((start - t0_ns) / 1e9, 4),
                         "end_s": round((end - t0_ns) / 1e9, 4), "cpu": cpu, "ran_ms": round(ran / 1e6, 3),
                         "task_cpus": "unknown" if kept is None else " ".join(map(str, sorted(kept))),
                         "on_task_cpus": kept is not None and cpu in kept})

    def after(ns: int) -> float:
        return round((ns - t0_ns) / 1e9 - arrival_s, 3)

    return {"arrival_s": arrival_s, "ms_total": round(sum(out["ns_per_cpu"].values()) / 1e6, 1),
            "ms_per_cpu": {cpu: round(ns / 1e6, 1) for cpu, ns in sorted(out["ns_per_cpu"].items())},
            "ms_on_task_cpus": round(sum(ran for _s, _e, ran in on) / 1e6, 3),
            "on_task_cpus_from_s": after(on[0][0]) if on else None,
            "on_task_cpus_until_s": after(max(e for _s, e, _r in on)) if on else None,
            "ms_while_task_held_none": round(none_held / 1e6, 1),
            "ms_unattributed": round(unknown / 1e6, 1)}, rows

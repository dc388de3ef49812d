"""What the experiment scripts share: the CSCS build, runs of the engine,
the CPU stressor, the paper's constants, and the plots.

Run every experiment under the shared benchmark lock, e.g.
    flock /tmp/cod-bench.lock .venv/bin/python bench/experiments/exp1_deployment.py
"""

from __future__ import annotations

import csv
import json
import os
import platform
import re
import signal
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[2]
CSCS_DIR = REPO / "clients" / "cscs"
CSCS = CSCS_DIR / "cscs"
RESULTS = Path(__file__).resolve().parent / "results"
PAPER_COST_FN = REPO / "stored_procedures" / "examples" / "cscs_cost_fn.pl"

TUPLE_BYTES = 315
COST_C_DIVISOR = 3_750_000  # Section 4.4's normalisation, c = 1 / 3,750,000
PAPER_A, PAPER_B = 0.85, 106.37  # Section 4.4, the MagnyCours constants
# Section 7.2: 30 * 10^6 tuples of 315 B; 2048 queries and 512 updates per batch.
PAPER_TUPLES = 30_000_000
PAPER_QUERIES, PAPER_UPDATES = 2048, 512
# Section 7.3/7.4: 180 * 10^6 tuples on 48 cores, i.e. 3.75 M tuples per core.
PAPER_TUPLES_PER_CORE = 3_750_000


def build() -> Path:
    subprocess.run(["make", "-s", "-C", str(CSCS_DIR), "cscs"], check=True)
    return CSCS


def allowed_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def format_cpus(cpus: list[int]) -> str:
    from cod.facts.cpulist import format_cpulist

    return format_cpulist(cpus)


def model_rt_ms(a: float, b: float, tuples: int, cores: int, requests: int, d: float = 0.0) -> float:
    """Section 4.4: RT[ms] = c * tuples / cores * (a * requests + b), plus
    d * requests in `cscs calibrate --model extended`."""
    return tuples / cores / COST_C_DIVISOR * (a * requests + b) + d * requests


def read_cost_constants(path: Path) -> tuple[float, float, float]:
    """a, b and d (0 for the paper's model) of a file `cscs calibrate` wrote."""
    text = path.read_text()
    m = re.search(r"^db_cost_constants\(([^,]+),\s*([^,]+),", text, re.M)
    if not m:
        raise SystemExit(f"{path}: no db_cost_constants/3 fact (not written by cscs calibrate?)")
    d = re.search(r"^db_cost_per_request\(([^)]+)\)", text, re.M)
    return float(m.group(1)), float(m.group(2)), float(d.group(1)) if d else 0.0


def machine_state() -> dict:
    """Figures to print beside every measurement: this VM's load matters."""
    return {
        "host": platform.node(),
        "cpus": len(allowed_cpus()),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "mem_available_gb": round(mem_available_bytes() / 1e9, 1),
    }


def mem_available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


@dataclass
class Run:
    rows: list[dict[str, float | str]]
    stdout: str

    @property
    def rt_ms(self) -> list[float]:
        return [float(r["rt_ms"]) for r in self.rows]

    @property
    def own_cores_rt_ms(self) -> list[float]:
        """Response time had the scan threads had their cores to themselves:
        index, the slowest scan thread's CPU time, merge."""
        return [float(r["index_ms"]) + float(r["scan_max_cpu_ms"]) + float(r["merge_ms"]) for r in self.rows]

    def mean_rt_ms(self, skip: int = 1) -> float:
        """Mean response time, without the first `skip` batches (warm-up)."""
        xs = self.rt_ms[skip:] or self.rt_ms
        return sum(xs) / len(xs)

    def throughput_qps(self) -> float:
        """Queries answered per second over the run (after the first batch)."""
        rows = self.rows[1:] if len(self.rows) > 1 else self.rows
        t0 = float(self.rows[0]["time_s"]) if len(self.rows) > 1 else 0.0
        span = float(rows[-1]["time_s"]) - t0
        return sum(int(r["queries"]) for r in rows) / span


def run_cscs(args: list[str], csv_path: Path, timeout: float = 3600) -> Run:
    """Run `cscs run` with `args`, its per-batch CSV to csv_path."""
    cmd = [str(CSCS), "run", *args, "--csv", str(csv_path)]
    print("$", " ".join(cmd[1:]), file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise SystemExit(f"cscs failed ({proc.returncode}): {proc.stderr.strip()}")
    with csv_path.open() as f:
        rows = list(csv.DictReader(f))
    return Run(rows, proc.stdout)


STRESSOR = "while True: pass"


@contextmanager
def stressors() -> Iterator[callable]:
    """Start CPU-bound processes (pinned to chosen CPUs, or not); all are killed on exit.

    Only processes started here are pinned or killed."""
    procs: list[subprocess.Popen] = []

    def start(cpu: int | None, cmd: list[str] | None = None) -> subprocess.Popen:
        """A stressor pinned on `cpu`, or (None) left where the scheduler and the RM put it:
        STRESSOR, or `cmd` with its output to pipes (a stressor that reports, e.g. percpu)."""
        p = (subprocess.Popen([sys.executable, "-c", STRESSOR]) if cmd is None else
             subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        if cpu is not None:
            os.sched_setaffinity(p.pid, {cpu})
        procs.append(p)
        return p

    try:
        yield start
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
            p.wait()


def write_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def read_rows(path: Path) -> list[dict]:
    """A CSV this package wrote, numbers as numbers (for --replot)."""
    def value(v: str):
        for conv in (int, float):
            try:
                return conv(v)
            except ValueError:
                pass
        return {"True": True, "False": False}.get(v, v)

    with path.open() as f:
        return [{k: value(v) for k, v in row.items()} for row in csv.DictReader(f)]


def pyplot():
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("the plots need matplotlib: .venv/bin/pip install -e '.[experiments]'")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def print_json(obj: dict, name: str | None = None) -> None:
    """Print the experiment's JSON, and keep it as results/<name>.json."""
    text = json.dumps(obj, indent=1, default=lambda x: round(x, 4) if isinstance(x, float) else str(x))
    print(text)
    if name:
        (RESULTS / f"{name}.json").write_text(text + "\n")


class LiveRun:
    """`cscs run` in the background, for experiments that act during a run.

    ``t0`` is the moment the engine started its first batch (it prints the
    column header then), so times here line up with the CSV's time_s.  ``prefix``
    runs it under another command (e.g. taskset)."""

    def __init__(self, args: list[str], csv_path: Path, prefix: tuple[str, ...] = ()):
        self.csv_path = csv_path
        cmd = [*prefix, str(CSCS), "run", *args, "--csv", str(csv_path)]
        print("$", " ".join([*prefix, "cscs", *cmd[len(prefix) + 1:]]), file=sys.stderr, flush=True)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self.t0: float | None = None
        self._started = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if self.t0 is None and line.lstrip().startswith("batch"):
                self.t0 = time.monotonic()
                self._started.set()
            self.lines.append(line)
        self._started.set()

    def wait_started(self, timeout: float = 600) -> float:
        if not self._started.wait(timeout) or self.t0 is None:
            self.kill()
            raise SystemExit(f"cscs did not start: {self.proc.stderr.read().strip()}")
        return self.t0

    def elapsed(self) -> float:
        return time.monotonic() - (self.t0 or time.monotonic())

    def sleep_until(self, t: float) -> None:
        time.sleep(max(0.0, t - self.elapsed()))

    def finish(self, timeout: float = 600) -> Run:
        rc = self.proc.wait(timeout)
        self._reader.join(10)
        if rc != 0:
            raise SystemExit(f"cscs failed ({rc}): {self.proc.stderr.read().strip()}")
        with self.csv_path.open() as f:
            rows = list(csv.DictReader(f))
        return Run(rows, "".join(self.lines))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class CodRM:
    """A Resource Manager of the experiment's own: socket, state and cgroup parent under a
    temporary directory, seeing (and confining) only the processes this script starts.
    ``extra``: more of `cod rm`'s options (e.g. --enforce); ``start_timeout``: seconds to
    wait for its socket (under emulation it starts in minutes)."""

    def __init__(self, extra: tuple[str, ...] = (), start_timeout: float = 30.0) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="cod-exp-"))
        self.sock = self.dir / "rm.sock"
        self.log = self.dir / "rm.log"
        self.parent = f"cod_exp_{os.getpid()}"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cod.cli.main", "rm", "--socket", str(self.sock),
                 "--state-dir", str(self.dir / "state"), "--cgroup-parent", self.parent,
                 "--busy-scope", f"descendants:{os.getpid()}", *extra], stdout=log, stderr=log)
        deadline = time.monotonic() + start_timeout
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"the RM did not start: {self.log_text()}")
            try:
                with socket.socket(socket.AF_UNIX) as probe:
                    probe.connect(str(self.sock))
                break
            except OSError:
                time.sleep(0.05)

    def others(self) -> dict[int, dict]:
        """The unregistered busy processes the RM knows, by pid."""
        from cod.client import Client

        with Client(str(self.sock), app="experiment") as c:
            return {o["pid"]: o for o in c.call("list_tasks").get("other_tasks", [])}

    def wait_other(self, pid: int, present: bool = True, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while (pid in self.others()) != present:
            if time.monotonic() > deadline:
                raise SystemExit(f"the RM did not {'find' if present else 'forget'} busy process {pid} "
                                 f"in {timeout:g} s")
            time.sleep(0.1)

    def log_text(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def events(self) -> list[str]:
        """The RM's log lines that tell the story: epochs, busy processes, confinement."""
        keep = re.compile(r"epoch \d+ \(|busy process|confined|released")
        return [line.split(" ", 2)[2] for line in self.log_text().splitlines() if keep.search(line)]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextmanager
def cod_rm(extra: tuple[str, ...] = (), start_timeout: float = 30.0) -> Iterator[CodRM]:
    rm = CodRM(extra, start_timeout)
    try:
        yield rm
    finally:
        rm.stop()
        shutil.rmtree(rm.dir, ignore_errors=True)

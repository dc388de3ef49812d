#!/usr/bin/env python3
"""Reaction latency of the RM daemon to a CPU hog; prints JSON.

    python bench/react_bench.py [--trials 100] [--enforce cpuset|affinity]

A task ``db`` (a sleeping process with 2 threads) is registered with
``min_cores=1`` and may hold every CPU of this machine, so it holds them all.
Then, per trial, a CPU hog starts:

* ``registering``: a small C program that connects, registers itself as a task
  (hello and register_task pipelined in one write) and spins.  The RM must take
  a core from ``db``;
* ``unregistered``: a C spinner that nobody registers.  The RM notices it with
  its busy detector, which needs the hog to stay busy for a window
  (``--busy-window`` samples of ``--busy-interval`` s), records it as
  ``other_task``, keeps a core for it and confines it to the cores left over.

Measured per trial, all on CLOCK_MONOTONIC:

* ``exec_to_upcall``: from the hog's exec (the kernel's proc-connector exec
  event, root; else the moment before the bench spawns it) to the arrival of
  ``db``'s ``allocation_changed`` upcall (with ``removed``) at the client's socket;
* ``exec_to_hog_excluded``: to the moment every thread of the hog has an
  affinity that excludes ``db``'s new cores (polled with sched_getaffinity; the
  client acknowledges the upcall at once, as a well-behaved client does);
* ``exit_to_upcall``: the hog is killed; from the kill to ``db``'s upcall giving
  the core back (the exit path).

* ``newcomer`` (issue 18): ``db`` is replaced by ``db1`` with ``min_cores =
  max_cores = 1``, and per trial an unregistered spinner starts on ``db1``'s
  very CPU.  Counted: how often ``db1`` is moved (goal: never, while a free
  CPU exists), how often the hog is confined away from it, and the time from
  the hog's exec to its confinement.

Targets (issue #6): exec_to_upcall median <= 5 ms and p99 <= 20 ms for the
registering hog.  For the unregistered hog the window is reported apart, with
the latency beyond it.  Anchors: numad re-evaluates every 5 to 15 s; the paper
speaks of "a few seconds".
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cod.rm.enforce.procevents import ConnectorSource
from cod.protocol.framing import FrameDecoder, encode

HERE = Path(__file__).resolve().parent
SPINNER_C = HERE.parent / "tests" / "helpers" / "spinner.c"

# Connects, registers itself (hello + register_task in one write), waits for the reply, spins.
HOG_C = r"""
#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

static char buf[1 << 20];

static int read_all(int fd, void *p, size_t n) {
    char *c = p;
    while (n) { ssize_t r = read(fd, c, n); if (r <= 0) return -1; c += r; n -= (size_t)r; }
    return 0;
}

static void frame(char *out, size_t *len, const char *json) {
    uint32_t n = htonl((uint32_t)strlen(json));
    memcpy(out + *len, &n, 4); memcpy(out + *len + 4, json, strlen(json)); *len += 4 + strlen(json);
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: hog SOCKET TASK\n"); return 2; }
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    strncpy(a.sun_path, argv[1], sizeof a.sun_path - 1);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) { perror("connect"); return 1; }
    char req[1024], out[2048]; size_t len = 0;
    frame(out, &len, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"hello\",\"params\":{\"version\":1,\"app\":\"hog\"}}");
    snprintf(req, sizeof req, "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"register_task\",\"params\":"
             "{\"name\":\"%s\",\"properties\":{\"min_cores\":1,\"max_cores\":1}}}", argv[2]);
    frame(out, &len, req);
    if (write(fd, out, len) != (ssize_t)len) { perror("write"); return 1; }
    for (;;) {
        uint32_t n;
        if (read_all(fd, &n, 4) < 0) return 1;
        n = ntohl(n);
        if (n >= sizeof buf || read_all(fd, buf, n) < 0) return 1;
        buf[n] = 0;
        if (strstr(buf, "\"id\": 2") || strstr(buf, "\"id\":2")) {
            if (strstr(buf, "\"error\"")) { fprintf(stderr, "%s\n", buf); return 1; }
            break;
        }
    }
    volatile unsigned long spin = 0;
    for (;;) spin++;
}
"""


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def summary_ms(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "median_ms": round(statistics.median(xs) * 1e3, 3),
            "p99_ms": round(pct(xs, 99) * 1e3, 3), "max_ms": round(max(xs) * 1e3, 3)}


def compile_c(src: str | Path, out: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit("react_bench needs a C compiler (cc) for its hog programs")
    if isinstance(src, str):
        path = out.with_suffix(".c")
        path.write_text(src)
        src = path
    subprocess.run([cc, "-O1", "-pthread", "-o", str(out), str(src)], check=True)
    return out


class Conn:
    """The client of task db: a bare socket, so the upcall's arrival time is the socket's."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(path))
        self.dec = FrameDecoder()
        self.inbox: list[tuple[int, dict]] = []
        self.next_id = 1

    def recv(self, timeout: float) -> tuple[int, dict]:
        while not self.inbox:
            self.sock.settimeout(timeout)
            data = self.sock.recv(65536)
            now = time.monotonic_ns()
            if not data:
                raise SystemExit("the daemon hung up")
            self.inbox.extend((now, json.loads(b)) for b in self.dec.feed(data))
        return self.inbox.pop(0)

    def call(self, method: str, params: dict) -> dict:
        rid = self.next_id
        self.next_id += 1
        self.sock.sendall(encode({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}))
        kept = []
        while True:
            at, msg = self.recv(30)
            if msg.get("id") == rid:
                self.inbox[:0] = kept
                if "error" in msg:
                    raise SystemExit(f"{method}: {msg['error']}")
                return msg["result"]
            kept.append((at, msg))

    def upcall(self, pred, timeout: float = 30) -> tuple[int, dict]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no upcall")
            at, msg = self.recv(left)
            if msg.get("method") == "allocation_changed" and pred(msg["params"]):
                return at, msg["params"]


def excluded_at(pid: int, cores: set[int], limit_s: float = 5.0) -> int | None:
    """Poll until every thread of pid has an affinity disjoint from `cores`; CLOCK_MONOTONIC ns
    (resolution: the 0.2 ms sleep between polls plus timer slack, about 0.3 ms)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        time.sleep(0.0002)  # a bench that spins would itself be seen as a hog and confined
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            if all(not (os.sched_getaffinity(t) & cores) for t in tids):
                return time.monotonic_ns()
        except (FileNotFoundError, ProcessLookupError):
            return None
    return None


def exec_time(src: ConnectorSource | None, pid: int, fallback_ns: int) -> int:
    """The kernel's exec event time of pid (the last exec: Popen may exec twice via a shell)."""
    if src is None:
        return fallback_ns
    found = None
    for ev in src.read_events():
        if ev.kind == "exec" and ev.tgid == pid:
            found = ev.timestamp_ns
    return found if found is not None else fallback_ns


def run_trials(args, kind: str, conn: Conn, src: ConnectorSource | None, hog_cmd, cpus: set[int]) -> dict:
    e2u, e2x, x2u, beyond = [], [], [], []
    skipped = 0
    for i in range(args.trials):
        if src is not None:
            src.read_events()  # drop what happened before this trial
        t_spawn = time.monotonic_ns()
        hog = subprocess.Popen(hog_cmd(i), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        try:
            try:
                at, params = conn.upcall(lambda p: p["task"] == "db" and p["removed"], timeout=10)
            except TimeoutError:
                skipped += 1
                continue
            conn.call("ack_allocation", {"task": "db", "epoch": params["epoch"]})
            t_excl = excluded_at(hog.pid, set(params["cores"]))
            t_exec = exec_time(src, hog.pid, t_spawn)
            e2u.append((at - t_exec) / 1e9)
            if t_excl is not None:
                e2x.append((t_excl - t_exec) / 1e9)
            if kind == "unregistered":
                beyond.append((at - t_exec) / 1e9 - args.busy_window * args.busy_interval)
        finally:
            t_kill = time.monotonic_ns()
            hog.kill()
            hog.wait()
        try:
            at, params = conn.upcall(lambda p: p["task"] == "db" and len(p["cores"]) == len(cpus), timeout=10)
            x2u.append((at - t_kill) / 1e9)
        except TimeoutError:
            skipped += 1
            time.sleep(1)
    out = {"exec_to_upcall": summary_ms(e2u), "exec_to_hog_excluded": summary_ms(e2x),
           "exit_to_upcall": summary_ms(x2u), "trials_without_reaction": skipped}
    if kind == "unregistered":
        out["window_s"] = round(args.busy_window * args.busy_interval, 3)
        out["busy_threshold_cores"] = args.busy_threshold
        out["beyond_window"] = summary_ms(beyond)
    return out


def newcomer_trials(args, conn: Conn, src: ConnectorSource | None, spinner: Path, cpus: set[int]) -> dict:
    """Issue 18: an unregistered hog starts on the CPU of a one-CPU task; does the task move?"""
    db1 = subprocess.Popen([str(spinner), "1", "sleep"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    db1.stdout.readline()
    try:
        home = conn.call("register_task", {"name": "db1", "pid": db1.pid,
                                           "properties": {"min_cores": 1, "max_cores": 1}})["allocation"]["cores"]
        moved, confined, skipped, e2c = 0, 0, 0, []
        for _ in range(args.trials):
            if src is not None:
                src.read_events()
            t_spawn = time.monotonic_ns()
            hog = subprocess.Popen([str(spinner), "1", "spin"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                   preexec_fn=lambda: os.sched_setaffinity(0, home))
            try:
                t_conf = excluded_at(hog.pid, set(home), limit_s=5.0)
                t_exec = exec_time(src, hog.pid, t_spawn)
                if t_conf is not None:
                    confined += 1
                    e2c.append((t_conf - t_exec) / 1e9)
                try:  # any upcall that moves db1 (none is expected)
                    _, params = conn.upcall(lambda p: p["task"] == "db1" and p["cores"] != home, timeout=0.3)
                    moved += 1
                    conn.call("ack_allocation", {"task": "db1", "epoch": params["epoch"]})
                    home = params["cores"]
                except (TimeoutError, socket.timeout):
                    pass
                if t_conf is None:
                    skipped += 1
            finally:
                hog.kill()
                hog.wait()
            deadline = time.monotonic() + 5
            while conn.call("list_tasks", {})["other_tasks"] and time.monotonic() < deadline:
                time.sleep(0.05)
        return {"trials": args.trials, "task_moved": moved, "hog_confined_away": confined,
                "trials_without_confinement": skipped, "exec_to_hog_confined": summary_ms(e2c),
                "goal": "task_moved == 0 while a free CPU exists", "goal_met": moved == 0}
    finally:
        db1.kill()
        db1.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=100)
    ap.add_argument("--enforce", choices=["cpuset", "affinity"], default=None,
                    help="backend (default: the daemon's: cpuset as root, else affinity)")
    ap.add_argument("--busy-interval", type=float, default=0.1)
    ap.add_argument("--busy-window", type=int, default=3)
    ap.add_argument("--busy-threshold", type=float, default=0.5)
    ap.add_argument("--only", choices=["registering", "unregistered", "newcomer"], default=None)
    ap.add_argument("--solver", choices=["cpsat", "greedy"], default="cpsat", help="the daemon's allocator")
    args = ap.parse_args()
    cpus = set(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("react_bench needs at least 2 CPUs")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        hog_exe = compile_c(HOG_C, tmp / "hog")
        spinner = compile_c(SPINNER_C, tmp / "spinner")
        sock = tmp / "rm.sock"
        cmd = [sys.executable, "-m", "cod.cli.main", "rm", "--socket", str(sock), "--state-dir", str(tmp / "state"),
               "--cgroup-parent", f"cod_bench_{os.getpid()}", "--log-level", os.environ.get("COD_BENCH_LOG", "warning"),
               "--busy-interval", str(args.busy_interval), "--busy-window", str(args.busy_window),
               "--busy-threshold", str(args.busy_threshold), "--solver", args.solver,
               # Only what the bench starts may be seen as busy and confined (never other work here).
               "--busy-scope", f"descendants:{os.getpid()}"]
        if args.enforce:
            cmd += ["--enforce", args.enforce]
        daemon = subprocess.Popen(cmd, stderr=open(tmp / "rm.log", "wb"))
        db = subprocess.Popen([str(spinner), "2", "sleep"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        db.stdout.readline()
        src = None
        try:
            for _ in range(400):
                if sock.exists():
                    break
                time.sleep(0.05)
            time.sleep(0.2)
            src = ConnectorSource() if os.geteuid() == 0 else None
            conn = Conn(sock)
            info = conn.call("hello", {"version": 1, "app": "bench"})
            conn.call("register_task", {"name": "db", "pid": db.pid,
                                        "properties": {"min_cores": 1, "max_cores": len(cpus)}})
            result = {"cpus": len(cpus), "trials": args.trials, "enforce": info.get("enforce_mode"),
                      "solver": args.solver,
                      "exec_time_from": "proc connector exec event" if src else "before spawn (not root)",
                      "targets_registering": {"exec_to_upcall_median_ms": 5, "exec_to_upcall_p99_ms": 20}}
            if args.only in (None, "registering"):
                reg = run_trials(args, "registering", conn, src, lambda i: [str(hog_exe), str(sock), f"hog{i}"], cpus)
                e = reg["exec_to_upcall"]
                reg["targets_met"] = bool(e.get("n")) and e["median_ms"] <= 5 and e["p99_ms"] <= 20
                result["registering"] = reg
            if args.only in (None, "unregistered"):
                result["unregistered"] = run_trials(args, "unregistered", conn, src,
                                                    lambda i: [str(spinner), "1", "spin"], cpus)
            if args.only in (None, "newcomer"):
                conn.call("deregister_task", {"task": "db"})
                result["newcomer"] = newcomer_trials(args, conn, src, spinner, cpus)
            result["anchors"] = {"numad_interval_s": [5, 15], "paper": "a few seconds"}
            result["machine_load_1min"] = round(os.getloadavg()[0], 2)
        finally:
            if src is not None:
                src.close()
            db.kill()
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(20)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
                print(f"the daemon did not stop within 20 s of SIGTERM; its log:\n{(tmp / 'rm.log').read_text()}",
                      file=sys.stderr)
        if os.environ.get("COD_BENCH_LOG"):
            print((tmp / "rm.log").read_text()[-6000:], file=sys.stderr)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

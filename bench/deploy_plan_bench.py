#!/usr/bin/env python3
"""What a big ``deploy_plan`` costs the daemon and its other clients (issue 47, item 3); prints JSON.

1. chain: the planner alone (``deploy()``, the daemon's options: 0.5 s per exact
   search) on 1,400-operator chains, each in a fresh process that reports its
   wall time and peak memory (VmHWM): 0.9 of a core each (cannot fit: the
   report's case) on this machine and on MagnyCours, 0.01 each (fits in 14
   cores) on MagnyCours.
2. daemon: a planning daemon for MagnyCours; a victim client's ``list_tasks``
   round trip (median, p90) alone, then while an attacker (one unprivileged
   uid, three connections) keeps three big graphs in flight, round after round
   (1,400 x 0.01: planned; ``--cannot-fit`` x 0.9: cannot fit); the daemon's
   RSS before, at its highest during, and after.

With ``--baseline-python`` (an interpreter whose ``cod`` is other code, e.g. a
checkout of main with its own venv) both parts run for it too, and the ratios
baseline / this are printed.  Run it under the shared lock:

    flock /tmp/cod-bench.lock .venv/bin/python bench/deploy_plan_bench.py [--baseline-python P] [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cod.protocol.framing import FrameDecoder, encode

NOBODY = 65534

PLANNER = r"""
import json, sys, time
from cod.facts import machines, sysfs
from cod.rm.deploy import DeployError, Options, deploy, parse_graph
n, util, where = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
machine = sysfs.discover() if where == "here" else machines.load(where)
g = {"operators": [{"id": f"op{i}", "cpu_util": util, "mem_bw": 1e8} for i in range(n)],
     "edges": [[f"op{i}", f"op{i + 1}"] for i in range(n - 1)]}
t0 = time.perf_counter()
try:
    plan = deploy(parse_graph(g), machine, Options(time_limit_s=0.5))
    outcome = f"{plan.min_cores} cores"
except DeployError as err:
    outcome = f"refused: {err}"[:160]
seconds = time.perf_counter() - t0
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM"))
print(json.dumps({"s": round(seconds, 3), "peak_mib": round(hwm / 1024, 1), "outcome": outcome}))
"""


def chain_graph(n: int, util: float) -> dict:
    return {"operators": [{"id": f"op{i}", "cpu_util": util, "mem_bw": 1e8} for i in range(n)],
            "edges": [[f"op{i}", f"op{i + 1}"] for i in range(n - 1)]}


def planner_alone(python: str, n: int) -> dict:
    out = {}
    for name, util, where in (("cannot_fit_here", 0.9, "here"), ("cannot_fit_magnycours", 0.9, "magnycours"),
                              ("fits_magnycours", 0.01, "magnycours")):
        run = subprocess.run([python, "-c", PLANNER, str(n), str(util), where], capture_output=True, text=True,
                             timeout=600)
        out[name] = json.loads(run.stdout) if run.returncode == 0 else {"error": run.stderr[-300:]}
    return out


class Conn:
    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(path)
        self.decoder = FrameDecoder()
        self.inbox: list[dict] = []
        self.next_id = 1

    def send(self, method: str, params: dict) -> int:
        rid = self.next_id
        self.next_id += 1
        self.sock.sendall(encode({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}))
        return rid

    def reply(self, rid: int) -> dict:
        while True:
            while not self.inbox:
                data = self.sock.recv(1 << 16)
                if not data:
                    raise ConnectionError("daemon hung up")
                self.inbox.extend(json.loads(b) for b in self.decoder.feed(data))
            msg = self.inbox.pop(0)
            if msg.get("id") == rid:
                return msg

    def call(self, method: str, params: dict | None = None) -> dict:
        return self.reply(self.send(method, params or {}))


def attack(path: str, rounds: int, cannot_fit: int) -> None:
    """Runs in a child: three connections, three big graphs in flight at once, round after round."""
    if os.geteuid() == 0:
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    conns = [Conn(path) for _ in range(3)]
    for i, c in enumerate(conns):
        c.call("hello", {"version": 1, "app": f"attack{i}"})
        c.call("register_task", {"name": f"a{i}", "pid": os.getpid(), "properties": {"min_cores": 1}})
    graphs = [chain_graph(1400, 0.01), chain_graph(cannot_fit, 0.9)]
    for r in range(rounds):
        g = graphs[r % 2]
        rids = [c.send("deploy_plan", {"graph": g}) for c in conns]
        for c, rid in zip(conns, rids):
            c.reply(rid)


def planners(pid: int) -> list[str]:
    """The planner processes among the daemon's children (its SKB engine is one too)."""
    out = []
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            if b"cod.rm.deploy_worker" in Path(f"/proc/{child}/cmdline").read_bytes():
                out.append(child)
        except OSError:
            continue  # gone meanwhile
    return out


def rss_kib(pid: int) -> int:
    return next(int(l.split()[1]) for l in Path(f"/proc/{pid}/status").read_text().splitlines()
                if l.startswith("VmRSS"))


def ms(samples: list[float]) -> dict:
    s = sorted(samples)
    return {"median_ms": round(statistics.median(s) * 1e3, 3), "p90_ms": round(s[int(0.9 * (len(s) - 1))] * 1e3, 3),
            "samples": len(s)}


def daemon_under_attack(python: str, rounds: int, cannot_fit: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="cod-dpbench-") as tmp:
        os.chmod(tmp, 0o755)
        path = f"{tmp}/rm.sock"
        log = open(f"{tmp}/rm.log", "wb")
        daemon = subprocess.Popen([python, "-m", "cod.cli.main", "rm", "--machine", "magnycours", "--socket", path,
                                   "--log-level", "warning"], stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + 60
            while not os.path.exists(path) and time.monotonic() < deadline:
                time.sleep(0.05)
            victim = Conn(path)
            victim.call("hello", {"version": 1, "app": "victim"})

            def trips(count: int) -> list[float]:
                out = []
                for _ in range(count):
                    t0 = time.perf_counter()
                    victim.call("list_tasks")
                    out.append(time.perf_counter() - t0)
                return out

            base = trips(500)
            rss_before = rss_kib(daemon.pid)
            t0 = time.perf_counter()
            child = os.fork()
            if child == 0:
                try:
                    attack(path, rounds, cannot_fit)
                    os._exit(0)
                except BaseException as err:  # noqa: BLE001 (reported, the child exits)
                    print(f"attacker: {err!r}", file=sys.stderr)
                    os._exit(1)
            during: list[float] = []
            rss_peak = rss_before
            while os.waitpid(child, os.WNOHANG)[0] == 0:
                during += trips(20)
                rss_peak = max(rss_peak, rss_kib(daemon.pid))
            attack_s = time.perf_counter() - t0
            while planners(daemon.pid):  # still exiting
                time.sleep(0.05)
            after = trips(500)
            rss_after = rss_kib(daemon.pid)
            b, d = ms(base + after), ms(during)
            return {"victim_alone": b, "victim_during_attack": d,
                    "latency_ratio": round(d["median_ms"] / b["median_ms"], 2),
                    "attack_s": round(attack_s, 2), "rss_before_mib": round(rss_before / 1024, 1),
                    "rss_peak_mib": round(rss_peak / 1024, 1), "rss_after_mib": round(rss_after / 1024, 1)}
        finally:
            daemon.terminate()
            daemon.wait(30)
            log.close()


def ratios(before: Any, after: Any) -> Any:
    """before / after for every number in both (a speed-up or a saving above 1)."""
    if isinstance(before, dict) and isinstance(after, dict):
        pairs = {k: ratios(before[k], after[k]) for k in before if k in after}
        return {k: v for k, v in pairs.items() if v is not None}
    if isinstance(before, (int, float)) and isinstance(after, (int, float)) and after:
        return round(before / after, 2)
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline-python", help="an interpreter whose cod is the code to compare with")
    ap.add_argument("--operators", type=int, default=1400)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--cannot-fit", type=int, default=1400, help="operators of the graphs that cannot fit")
    args = ap.parse_args()
    doc: dict[str, Any] = {"loadavg_before": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(),
                           "operators": args.operators, "rounds": args.rounds, "cannot_fit": args.cannot_fit}
    runs = {"this": sys.executable}
    if args.baseline_python:
        runs["baseline"] = args.baseline_python
    for name, python in runs.items():
        doc[name] = {"python": python, "chain": planner_alone(python, args.operators),
                     "daemon": daemon_under_attack(python, args.rounds, args.cannot_fit)}
    if "baseline" in doc:
        doc["baseline_over_this"] = ratios(
            {k: doc["baseline"][k] for k in ("chain", "daemon")}, {k: doc["this"][k] for k in ("chain", "daemon")})
    doc["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What another uid's subscriptions and conditions cost everyone else (issue 47, items 5 and 6); prints JSON.

* register_task: root registers and deregisters a task, alternately on two daemons started alike,
  one of them with 16 connections x 1,024 subscriptions present, of four unprivileged uids (each at
  its default cap, max_subscriptions_per_uid = 4,096), so both columns see the same load:
  ``nomatch`` subscriptions filter on tasks that do not exist, ``match`` ones want every
  allocation change (the subscribers read them).  Reported: the medians, their ratio, and the
  daemon's own CPU per registration (the SKB is another process).  Target: nomatch ratio close to 1.
* conditions: a client's one fast condition on its own fact, the time from the change to its
  upcall, without and then with another uid's application holding 400 slow conditions (about
  10 ms each, condition_timeout_s = 0.5) whose facts change every 0.2 s.  Target: the victim's median within 1.5x and well under
  the attacker's round (4-5 s before issue 47).

    flock /tmp/cod-bench.lock .venv/bin/python bench/upcall_bench.py [--quick] [--only register|conditions]

Needs root (the other uids are nobody and the three below it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from helpers.upcall_load import (  # noqa: E402
    SLOW_SETTINGS, SUBSCRIBER_UIDS, AsUser, ConditionWatcher, cpu_seconds, hold_subscriptions, register_seconds,
    slow_conditions)
from helpers.rm_support import NOBODY, RawConn, shared_dir, start_daemon  # noqa: E402

SETTINGS = ["--machine", "magnycours", "--log-level", "warning"]
KINDS = {
    "nomatch": ("allocation_changed", lambda i: {"task": f"absent{i}"}),
    "match": ("allocation_changed", lambda i: {}),
}


def summary_ms(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"median_ms": round(statistics.median(xs) * 1e3, 3), "p90_ms": round(xs[int(0.9 * (len(xs) - 1))] * 1e3, 3),
            "n": len(xs)}


def bench_register(tmp: Path, kind: str, rounds: int) -> dict[str, object]:
    plain = start_daemon(tmp, *SETTINGS, name=f"plain-{kind}.sock")
    loaded = start_daemon(tmp, *SETTINGS, name=f"loaded-{kind}.sock")
    event, filters = KINDS[kind]
    holders = [AsUser(uid, hold_subscriptions, loaded.path, 4, 1024, event, filters) for uid in SUBSCRIBER_UIDS]
    try:
        for holder in holders:
            holder.wait_ready(300)
        conns = {"plain": RawConn(plain.path), "loaded": RawConn(loaded.path)}
        pids = {"plain": plain.proc.pid, "loaded": loaded.proc.pid}
        times: dict[str, list[float]] = {"plain": [], "loaded": []}
        cpu = {"plain": 0.0, "loaded": 0.0}
        for key, c in conns.items():
            c.hello("rootapp")
            register_seconds(c, "warmup")
        for i in range(rounds):
            for key, c in conns.items():
                before = cpu_seconds(pids[key])
                times[key].append(register_seconds(c, f"t{i}"))
                cpu[key] += cpu_seconds(pids[key]) - before
        out: dict[str, object] = {k: summary_ms(v) for k, v in times.items()}
        out["ratio_of_medians"] = round(statistics.median(times["loaded"]) / statistics.median(times["plain"]), 2)
        out["daemon_cpu_ms_per_registration"] = {k: round(v / rounds * 1e3, 3) for k, v in cpu.items()}
        return out
    finally:
        for holder in holders:
            holder.stop()
        loaded.stop()
        plain.stop()


def bench_conditions(tmp: Path, trials: int) -> dict[str, object]:
    d = start_daemon(tmp, *SETTINGS, *(a for s in SLOW_SETTINGS for a in ("--set", s)), name="conditions.sock")
    try:
        watcher = ConditionWatcher(d.path)
        alone = [watcher.seconds() for _ in range(trials)]
        attacker = AsUser(NOBODY, slow_conditions, d.path, 400)
        try:
            attacker.wait_ready(300)
            beside = [watcher.seconds() for _ in range(trials)]
        finally:
            attacker.stop()
        watcher.close()
        return {"alone": summary_ms(alone), "beside_400_slow_conditions": summary_ms(beside),
                "max_beside_ms": round(max(beside) * 1e3, 3),
                "ratio_of_medians": round(statistics.median(beside) / statistics.median(alone), 2)}
    finally:
        d.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", choices=("register", "conditions"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root: the other uid is nobody")
    rounds, trials = (20, 5) if args.quick else (60, 15)
    out: dict[str, object] = {"load_average_before": [round(x, 2) for x in os.getloadavg()],
                              "cpus": os.cpu_count()}
    with shared_dir("cod-upcall-bench-") as tmp:  # nobody reaches the sockets
        if args.only in (None, "register"):
            out["register_task"] = {kind: bench_register(Path(tmp), kind, rounds) for kind in KINDS}
        if args.only in (None, "conditions"):
            out["conditions"] = bench_conditions(Path(tmp), trials)
    out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

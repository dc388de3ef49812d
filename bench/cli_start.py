#!/usr/bin/env python3
"""How long `cod` takes to start, beside the interpreter's own start; prints JSON.

A user who runs `cod facts`, `cod query` or `cod plan` from a script pays the command's start
each time. The floor is the same interpreter starting and importing argparse (what any Python
CLI needs); each command is timed in rounds interleaved with that floor, so both see the same
load, and reported as a median and as a ratio to the floor's median. `--help` of a subcommand
builds its parser and exits, so it measures the imports and nothing of the command's own work;
the rows after it run a command to its end (the machine's facts, a plan of one task).

    .venv/bin/python bench/cli_start.py [--rounds N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLOOR = [sys.executable, "-c", "import argparse"]
COD = [sys.executable, "-m", "cod.cli.main"]
COMMANDS = {
    "cod --help": ["--help"],
    "cod facts --help": ["facts", "--help"],
    "cod query --help": ["query", "--help"],
    "cod plan --help": ["plan", "--help"],
    "cod rm --help": ["rm", "--help"],
    "cod facts --machine magnycours": ["facts", "--machine", "magnycours"],
    "cod plan (two tasks, cpsat)": ["plan", "--machine", "magnycours", "--tasks", "TASKS"],
}
TASKS = {"tasks": [{"name": "scan", "min_cores": 2, "max_cores": 8}, {"name": "oltp", "min_cores": 4}]}


def wall_s(argv: list[str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    floor: list[float] = []
    runs: dict[str, list[float]] = {name: [] for name in COMMANDS}
    with tempfile.TemporaryDirectory(prefix="cod-cli-start-") as tmp:
        tasks = Path(tmp) / "tasks.json"
        tasks.write_text(json.dumps(TASKS))
        for _ in range(args.rounds):
            for name, argv in COMMANDS.items():
                floor.append(wall_s(FLOOR))
                runs[name].append(wall_s(COD + [str(tasks) if a == "TASKS" else a for a in argv]))
    floor_ms = statistics.median(floor) * 1000
    out = {
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
        "rounds": args.rounds,
        "floor_python_import_argparse_ms": round(floor_ms, 1),
        "commands": {
            name: {"median_ms": round(statistics.median(t) * 1000, 1),
                   "ratio_to_floor": round(statistics.median(t) * 1000 / floor_ms, 2)}
            for name, t in runs.items()
        },
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

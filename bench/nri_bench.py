#!/usr/bin/env python3
"""The NRI plugin's reaction time (clients/nri, docs/kubernetes.md); prints JSON.

Runs the Go suite's 50-pod scenario (NRI's own adaptation runtime, the plugin, a real
`cod rm` on the MagnyCours facts) `--rounds` times and reports, per round, the time from
reading an `allocation_changed` upcall to the runtime's answer to `UpdateContainers`
(target: within 50 ms).  The load average is printed beside it: the figure means little
on a busy machine.

    .venv/bin/python bench/nri_bench.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE = ROOT / "clients" / "nri"
TARGET_MS = 50.0


def one_round() -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="cod-nri-bench-") as tmp:
        out = Path(tmp) / "figures.json"
        env = {**os.environ, "COD_NRI_BENCH_JSON": str(out)}
        env.setdefault("COD_BIN", str(ROOT / ".venv" / "bin" / "cod"))
        run = subprocess.run(["go", "test", "./plugin/", "-run", "^TestFiftyPods$", "-count=1"],
                             cwd=MODULE, env=env, capture_output=True, text=True, timeout=900)
        if run.returncode != 0:
            sys.exit(f"the 50-pod scenario failed:\n{run.stdout[-4000:]}\n{run.stderr[-2000:]}")
        return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    result: dict[str, object] = {"loadavg_before": [round(x, 2) for x in os.getloadavg()],
                                 "cpus_here": os.cpu_count(), "target_ms": TARGET_MS}
    rounds = [one_round() for _ in range(args.rounds)]
    result["rounds"] = rounds
    result["worst_p99_ms"] = max(r["p99_ms"] for r in rounds)
    result["met"] = all(r["p99_ms"] <= TARGET_MS for r in rounds)
    result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

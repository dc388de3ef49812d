"""Standalone elastic runner (until the RM drives groups):

    python -m cod.rm.elastic (--pid PID ... | --cgroup PATH) [--mode adaptive|dense|sparse]
        [--metric cpu_load|cpu_demand] [--min N] [--max N] [--period S] [--duration S]
        [--enforce affinity|cpuset] [--csv FILE] [--facts]

Manages the group until it ends, ``--duration`` passes or SIGINT/SIGTERM; then every
process gets its CPUs back.  ``--csv`` writes one row per period; ``--facts`` prints the
group's SKB facts at the end.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import tempfile
import threading

from cod.facts import from_args
from cod.rm.enforce import EnforceError, detect

from .errors import ElasticError
from .facts import as_text
from .runner import ElasticRunner, Record, open_events, open_group
from .settings import METRICS, MODES, ElasticSettings


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cod.rm.elastic", description=__doc__.split("\n")[0])
    who = ap.add_mutually_exclusive_group(required=True)
    who.add_argument("--pid", type=int, action="append", help="a process of the group (repeatable)")
    who.add_argument("--cgroup", help="a cgroup directory (v1 or v2)")
    ap.add_argument("--name", default="group")
    ap.add_argument("--mode", choices=MODES, default="adaptive")
    ap.add_argument("--metric", choices=tuple(METRICS), default="cpu_load")
    ap.add_argument("--min", type=int, default=1, dest="min_cores")
    ap.add_argument("--max", type=int, default=None, dest="max_cores")
    ap.add_argument("--period", type=float, default=ElasticSettings().period_s)
    ap.add_argument("--th-min", type=float, default=ElasticSettings().th_min)
    ap.add_argument("--th-max", type=float, default=ElasticSettings().th_max)
    ap.add_argument("--duration", type=float, default=None)
    ap.add_argument("--enforce", choices=("affinity", "cpuset"), default="affinity")
    ap.add_argument("--state-dir", default=None, help="the enforcer's records (default: a temporary directory)")
    ap.add_argument("--csv", default=None)
    ap.add_argument("--facts", action="store_true")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        settings = ElasticSettings(mode=args.mode, metric=args.metric, min_cores=args.min_cores,
                                   max_cores=args.max_cores, period_s=args.period,
                                   th_min=args.th_min, th_max=args.th_max)
        group = open_group(pids=args.pid, cgroup=args.cgroup)
        with tempfile.TemporaryDirectory() as tmp:
            enforcer = detect(args.enforce, args.state_dir or tmp)
            try:
                enforcer.cleanup_stale()
                runner = ElasticRunner(args.name, group, from_args(), enforcer, settings, events=open_events(group))
                try:
                    runner.run(duration=args.duration, stop=stop)
                finally:
                    runner.close()
            finally:
                enforcer.close()
    except (ElasticError, EnforceError) as err:
        print(f"cod elastic: {err}", file=sys.stderr)
        return 1
    if runner.gone:
        print(f"cod elastic: {runner.gone}", file=sys.stderr)
    if args.csv:
        with open(args.csv, "w") as f:
            f.write(",".join(Record.FIELDS) + "\n")
            for rec in runner.history:
                f.write(",".join(rec.row()) + "\n")
    if args.facts and runner.state is not None:
        sys.stdout.write(as_text(runner.facts()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

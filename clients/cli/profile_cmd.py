"""`cod profile`: resource activity vectors of a running process's threads.

    cod profile --pid PID --seconds S [--plan FILE] [--threads REGEX] [--no-pmu] [--source NAME]

Prints the graph format of ``cod deploy-plan`` (one operator per thread, named by
its thread name), so ``cod profile --pid 42 --seconds 5 | cod deploy-plan --graph -``
works.  ``--plan`` merges in the engine's own graph (edges, blocking flags,
siblings, bandwidths) by thread name.  Without hardware counters (most VMs)
``mem_bw`` is null and the output's ``profile.pmu`` says why.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from cod.rm.deploy import DeployError
from cod.rm.deploy.measure.threads import SOURCES, ProfileError
from cod.rm.deploy.measure.profile import measure, to_graph

from .deploy_cmd import read_graph
from .errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile", help="measure the RAVs (cpu_util, mem_bw) of a process's threads",
        description="Measure each thread's resource activity vector over a window and print "
        "the operator graph that `cod deploy-plan --graph -` reads.")
    p.add_argument("--pid", type=int, required=True, help="the process to profile")
    p.add_argument("--seconds", type=float, required=True, help="length of the window")
    p.add_argument("--plan", metavar="FILE",
                   help="the engine's graph (edges, blocking, siblings) to merge in by thread name")
    p.add_argument("--threads", metavar="REGEX", help="only threads whose name matches")
    p.add_argument("--no-pmu", action="store_true", help="do not try hardware counters")
    p.add_argument("--source", choices=SOURCES, help="where CPU time comes from (default: the best there is)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if not args.seconds > 0:
        raise UserError(f"--seconds: must be > 0, got {args.seconds}")
    if args.threads:
        try:
            re.compile(args.threads)
        except re.error as err:
            raise UserError(f"--threads: not a regular expression: {err}") from None
    template = read_graph(args.plan) if args.plan else None
    try:
        window = measure(args.pid, args.seconds, source=args.source, use_pmu=not args.no_pmu)
        graph = to_graph(window, template, args.threads)
    except ProfileError as err:
        raise UserError(str(err)) from None
    except DeployError as err:
        raise UserError(f"--plan {args.plan}: {err}") from None
    if not graph["operators"]:
        raise UserError(f"process {args.pid}: no thread matches {args.threads!r}")
    sys.stdout.write(json.dumps(graph, indent=1) + "\n")
    return 0

"""`cod query`: one query against an embedded SKB, without a daemon.

    cod query [--machine NAME | --hwloc FILE | --sysfs-root DIR] [--app NAME]
              [--load FILE.pl ...] [--fact TERM ...] [--first] [--timeout S] "GOAL"

``--load`` and ``--fact`` push application facts and procedures exactly as an
application would (into ``--app``, default ``cli``) and the goal runs as that
application.  Each solution is printed as one JSON object per line.
"""

from __future__ import annotations

import argparse
import json
import sys

from cod.facts import FactsError
from cod.facts.user_input import InputError, read_bytes

from .errors import ExitStatus, UserError
from .facts_cmd import add_machine_source, machine_of


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("query", help="run a Prolog query against an embedded SKB")
    add_machine_source(p)
    p.add_argument("--app", default="cli", help="application namespace (default: cli)")
    p.add_argument("--load", metavar="FILE.pl", action="append", default=[],
                   help="push the clauses of FILE as the application's procedures")
    p.add_argument("--fact", metavar="TERM", action="append", default=[],
                   help="push one application fact")
    p.add_argument("--first", action="store_true", help="only the first solution")
    p.add_argument("--timeout", type=float, default=5.0, help="query time limit in seconds")
    p.add_argument("goal", help="the Prolog goal, e.g. 'dbos_cost_function(S, N, P)'")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cod.skb import SKB, SKBError  # the engine's drivers (~0.2 s), not needed to parse arguments

    try:
        machine = machine_of(args)
    except FactsError as err:
        raise UserError(str(err)) from None
    try:
        with SKB(query_timeout_s=args.timeout) as skb:
            skb.load_machine(machine)
            for path in args.load:
                try:
                    text = read_bytes(path).decode("utf-8")
                except OSError as err:
                    raise UserError(f"cannot read {path}: {err.strerror}") from None
                except InputError as err:
                    raise UserError(f"{path}: {err}") from None
                except UnicodeDecodeError as err:
                    raise UserError(f"{path}: not UTF-8 text: {err}") from None
                try:
                    skb.add_procedure(args.app, text)
                except SKBError as err:
                    raise UserError(f"{path}: {err.message}") from None
            if args.fact:
                skb.add_facts(args.app, args.fact)
            solutions = skb.execute_query(args.app, args.goal, all_solutions=not args.first,
                                          timeout_s=args.timeout)
    except SKBError as err:
        raise UserError(err.message, ExitStatus.FAILED if err.code == "engine" else ExitStatus.BAD_INPUT) from None
    out = sys.stdout
    for solution in solutions:
        out.write(json.dumps(solution) + "\n")
    if not solutions:
        print("no solutions", file=sys.stderr)
        return ExitStatus.NOT_FOUND
    return ExitStatus.OK

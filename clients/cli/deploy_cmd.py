"""`cod deploy-plan`: deploy a query plan's operator threads on the fewest cores.

    cod deploy-plan --graph FILE|- [--machine NAME | --hwloc FILE | --sysfs-root DIR]
                    [--format json|text] [--explain] [--capacity F] [--node-bandwidth BYTES|N=BYTES,...]
                    [--unavailable CPUS] [--link-distance D] [--time-limit S] [--no-exact] [--no-balance]

The graph is ``{"operators": [{"id", "cpu_util", "mem_bw", "blocking", "siblings"}], "edges": [[a, b]]}``
(see docs/deploy.md); ``cod profile`` writes it.  On this machine (no machine
option) the NUMA nodes' bandwidth comes from ``--node-bandwidth``, else from the
``numa_bandwidth/2`` facts of a running RM (``cod bandwidth`` stores them), else
it is unknown and phase 3 packs by core count only.  Exit status 2: the plan does
not fit the machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cod.facts import FactsError, from_args
from cod.facts.cpulist import parse_cpulist
from cod.facts.model import Machine
from cod.facts.user_input import InputError, loads_json, read_bytes, read_stream
from cod.rm.deploy import DeployError, InfeasibleError, Options, deploy, parse_graph
from cod.rm.deploy.render import render_text

from .errors import ExitStatus, UserError
from .facts_cmd import add_machine_source
from .terminal import terminal_safe_lines


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "deploy-plan", help="deploy a query plan's operators on the fewest cores (RAVs)",
        description="Deploy a dataflow graph of operator threads with resource activity vectors "
        "on the fewest cores and NUMA nodes (Giceva et al., VLDB 2015).")
    p.add_argument("--graph", metavar="FILE", required=True, help="the operator graph (JSON); - reads stdin")
    add_machine_source(p)
    p.add_argument("--format", choices=("json", "text"), default="text")
    p.add_argument("--explain", action="store_true", help="say what each phase did")
    p.add_argument("--capacity", type=float, default=1.0,
                   help="share of a core one cluster may fill (default 1.0)")
    p.add_argument("--node-bandwidth", metavar="BYTES|N=BYTES,...",
                   help="attainable bandwidth (bytes/s) of every node, or of the nodes named")
    p.add_argument("--unavailable", metavar="CPUS", default="", help="CPUs not to use, e.g. 0,4-7")
    p.add_argument("--link-distance", type=int, metavar="D",
                   help="largest SLIT distance of a direct link (default: the smallest remote distance)")
    p.add_argument("--time-limit", type=float, default=2.0, metavar="SECONDS",
                   help="time limit of each exact search (default 2)")
    p.add_argument("--no-exact", action="store_true", help="skip the CP-SAT optimum of phases 2 and 3")
    p.add_argument("--no-balance", action="store_true", help="keep FFD's bins (no load-balancing epilogue)")
    p.add_argument("--ffd-only", action="store_true",
                   help="deploy on FFD's packing even when the exact one needs fewer cores (the paper's algorithm)")
    p.add_argument("--socket", metavar="PATH",
                   help="RM socket to read numa_bandwidth facts from (this machine only)")
    p.set_defaults(func=run)


def read_graph(path: str) -> Any:
    """The graph file (``-``: standard input) as parsed JSON, within user_input's limits."""
    where = "stdin" if path == "-" else path
    try:
        text = (read_stream(sys.stdin.buffer) if path == "-" else read_bytes(path)).decode("utf-8")
        return loads_json(text)
    except OSError as err:
        raise UserError(f"graph {path}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise UserError(f"graph {where}: not UTF-8 text: {err}") from None
    except InputError as err:
        raise UserError(f"graph {where}: {err}") from None
    except ValueError as err:
        raise UserError(f"graph {where}: not valid JSON: {err}") from None


def parse_node_bandwidth(text: str, machine: Machine) -> dict[int, int]:
    def number(s: str) -> int:
        try:
            v = float(s)
        except ValueError:
            raise UserError(f"--node-bandwidth: {s!r} is not a number of bytes/s") from None
        if not v > 0 or v != v or v == float("inf"):
            raise UserError(f"--node-bandwidth: must be a positive number of bytes/s, got {s!r}")
        return int(v)

    if "=" not in text:
        bw = number(text)
        return {n.id: bw for n in machine.numa_nodes} or {0: bw}
    out: dict[int, int] = {}
    known = {n.id for n in machine.numa_nodes} or {0}
    for part in filter(None, (p.strip() for p in text.split(","))):
        node, _, value = part.partition("=")
        try:
            nid = int(node)
        except ValueError:
            raise UserError(f"--node-bandwidth: {node!r} is not a node number") from None
        if nid not in known:
            raise UserError(f"--node-bandwidth: {machine.name} has no NUMA node {nid}")
        out[nid] = number(value)
    return out


def bandwidth_from_rm(socket: str | None, machine: Machine) -> dict[int, int]:
    """numa_bandwidth/2 facts of a running RM about this same machine; {} when none answers."""
    from cod.client import CodError, Client

    try:
        with Client(socket, reconnect=False, call_timeout_s=2.0) as client:
            names = client.execute_query("machine_name(M)", timeout_s=1.0)
            if [r.get("M") for r in names] != [machine.name]:
                return {}  # a daemon planning for another machine
            rows = client.execute_query("numa_bandwidth(N, B)", timeout_s=1.0)
    except (CodError, OSError):
        return {}
    return {r["N"]: r["B"] for r in rows if isinstance(r.get("N"), int) and isinstance(r.get("B"), int)}


def run(args: argparse.Namespace) -> int:
    try:
        machine = from_args(sysfs_root=args.sysfs_root, hwloc=args.hwloc, machine=args.machine)
    except FactsError as err:
        raise UserError(str(err)) from None
    try:
        graph = parse_graph(read_graph(args.graph))
    except DeployError as err:
        raise UserError(str(err)) from None
    try:
        unavailable = tuple(parse_cpulist(args.unavailable)) if args.unavailable else ()
    except ValueError as err:
        raise UserError(f"--unavailable: {err}") from None
    source = "override"
    if args.node_bandwidth:
        node_bw = parse_node_bandwidth(args.node_bandwidth, machine)
    elif args.machine is None and args.hwloc is None and args.sysfs_root is None:
        node_bw, source = bandwidth_from_rm(args.socket, machine), "rm"
    else:
        node_bw = {}
    try:
        options = Options(capacity=args.capacity, exact=not args.no_exact, balance=not args.no_balance,
                          prefer_exact=not args.ffd_only,
                          time_limit_s=args.time_limit, link_distance=args.link_distance,
                          unavailable=unavailable, node_bandwidth=node_bw or None,
                          node_bandwidth_source=source)
        plan = deploy(graph, machine, options)
    except InfeasibleError as err:
        raise UserError(str(err), ExitStatus.DOES_NOT_FIT) from None
    except DeployError as err:
        raise UserError(str(err)) from None
    if args.format == "json":
        out = plan.to_dict()
        if not args.explain:
            out.pop("explain")
        sys.stdout.write(json.dumps(out, indent=1) + "\n")
    else:
        sys.stdout.write(terminal_safe_lines(render_text(plan, explain=args.explain)))  # ids are the user's
    return 0

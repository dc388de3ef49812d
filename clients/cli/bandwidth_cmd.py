"""`cod bandwidth`: measure this machine's NUMA nodes' attainable bandwidth.

    cod bandwidth [--node N ...] [--threads T] [--size-mib M] [--iterations I]
                  [--format text|json] [--no-store] [--socket PATH]

A STREAM-like triad per node (threads pinned to the node's cores, memory bound
to the node).  When an RM answers on the socket and the caller may change
system facts (root or the RM's user), each figure replaces that node's
``numa_bandwidth/2`` fact in the SKB; otherwise it is only printed.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cod.facts import FactsError, from_args
from cod.rm.deploy import DeployError
from cod.rm.deploy.measure.bandwidth import (MIB, default_array_bytes, fact, measure_node, mem_available, plan_run,
                                             size_arrays)

from .errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bandwidth", help="measure each NUMA node's memory bandwidth (STREAM-like triad)",
        description="Measure the attainable local memory bandwidth of this machine's NUMA nodes "
        "and store it as numa_bandwidth/2 facts in a running RM.")
    p.add_argument("--node", type=int, action="append", help="measure this node (default: every node)")
    p.add_argument("--threads", type=int, help="threads per node (default: one per usable core)")
    p.add_argument("--size-mib", type=int,
                   help="MiB per array (default: 4 x the node's last-level cache, at least 64)")
    p.add_argument("--iterations", type=int, default=10, help="triad iterations (default 10)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--no-store", action="store_true", help="only print, do not store in the RM")
    p.add_argument("--socket", metavar="PATH", help="the RM's socket (default: the usual one)")
    p.set_defaults(func=run)


def store(results: list[dict[str, Any]], socket: str | None) -> str:
    """Replace the nodes' numa_bandwidth facts in a running RM; a line saying what happened."""
    from cod.client import Client, CodError, NotConnected, PermissionDenied

    try:
        with Client(socket, reconnect=False, call_timeout_s=10.0) as client:
            for r in results:
                client.remove_facts(f"numa_bandwidth({r['node']}, _)", scope="system")
            client.add_facts([fact(r["node"], r["bandwidth_bytes_per_s"]) for r in results], scope="system")
            return f"stored as system facts in the RM on {client.path}"
    except NotConnected as err:
        return f"not stored: {err}"
    except PermissionDenied as err:
        return f"not stored: {err}"
    except CodError as err:
        return f"not stored: the RM refused: {err}"


def run(args: argparse.Namespace) -> int:
    if args.iterations < 2:
        raise UserError(f"--iterations: must be >= 2, got {args.iterations}")
    if args.size_mib is not None and args.size_mib < 1:
        raise UserError(f"--size-mib: must be >= 1, got {args.size_mib}")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads: must be >= 1, got {args.threads}")
    try:
        machine = from_args()
    except FactsError as err:
        raise UserError(str(err)) from None
    nodes = args.node or ([n.id for n in machine.numa_nodes if set(n.cpus) & set(machine.cpu_ids())] or [0])
    results = []
    try:
        for node in nodes:
            # Sized before each node's run: the arrays are freed between nodes.
            wanted = default_array_bytes(machine, node) if args.size_mib is None else args.size_mib * MIB
            sizing = size_arrays(wanted, mem_available(), asked=args.size_mib is not None)
            if args.format == "text":
                sys.stdout.write(f"node {node}: {sizing.sentence()}\n")
                sys.stdout.flush()
            run_ = plan_run(machine, node, threads=args.threads, array_bytes=sizing.array_bytes)
            results.append(measure_node(run_, args.iterations) | {"memory": sizing.sentence()})
    except DeployError as err:
        raise UserError(str(err)) from None
    stored = "not stored (--no-store)" if args.no_store else store(results, args.socket)
    if args.format == "json":
        sys.stdout.write(json.dumps({"nodes": results, "facts": [fact(r["node"], r["bandwidth_bytes_per_s"])
                                                                  for r in results], "stored": stored},
                                    indent=1) + "\n")
    else:
        for r in results:
            mib = r["elements"] * 8 / MIB
            sys.stdout.write(
                f"node {r['node']}: {r['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s triad "
                f"(best of {r['iterations'] - 1}; mean {r['mean_bandwidth_bytes_per_s'] / 1e9:.2f} GB/s; "
                f"{r['threads']} threads on CPUs {r['cpus']}; 3 x {mib:.0f} MiB"
                f"{', bound to the node' if r['memory_bound_to_node'] else ''})\n")
        sys.stdout.write(f"{'; '.join(fact(r['node'], r['bandwidth_bytes_per_s']) for r in results)}: {stored}\n")
    return 0

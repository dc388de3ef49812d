"""`cod bandwidth`: measure this machine's NUMA nodes' attainable bandwidth, node x node.

    cod bandwidth [--node N ...] [--local] [--threads T] [--size-mib M] [--iterations I]
                  [--format text|json] [--no-store] [--socket PATH]

A STREAM-like triad per pair of nodes (threads pinned to the first node's cores,
memory bound to the second node): the node x node matrix, whose diagonal is each
node's local bandwidth (``--local``: the diagonal alone).  When an RM answers on
the socket and the caller may change system facts (root or the RM's user), the
figures replace the measured nodes' ``numa_bandwidth/2`` (local) and
``memory_bandwidth/3`` (matrix) facts in the SKB; otherwise they are only printed.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from cod.facts import FactsError, from_args
from cod.facts.model import Machine
from cod.rm.deploy import DeployError
from cod.rm.deploy.measure.bandwidth import (MIB, default_array_bytes, fact, matrix_fact, measure_node, mem_available,
                                             plan_run, size_arrays)

from .errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bandwidth", help="measure the NUMA nodes' memory bandwidth, node x node (STREAM-like triad)",
        description="Measure the attainable memory bandwidth of this machine's NUMA nodes, with the threads on "
        "each node's CPUs and the memory on each node, and store it as numa_bandwidth/2 (local) and "
        "memory_bandwidth/3 (node x node) facts in a running RM.")
    p.add_argument("--node", type=int, action="append",
                   help="run the threads on this node's CPUs (default: every node with CPUs)")
    p.add_argument("--local", action="store_true",
                   help="only each node's own memory (numa_bandwidth/2), not the node x node matrix")
    p.add_argument("--threads", type=int, help="threads per node (default: one per usable core)")
    p.add_argument("--size-mib", type=int,
                   help="MiB per array (default: 4 x the node's last-level cache, at least 64)")
    p.add_argument("--iterations", type=int, default=10, help="triad iterations (default 10)")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.add_argument("--no-store", action="store_true", help="only print, do not store in the RM")
    p.add_argument("--socket", metavar="PATH", help="the RM's socket (default: the usual one)")
    p.set_defaults(func=run)


def store(results: list[dict[str, Any]], matrix: list[dict[str, Any]], socket: str | None) -> str:
    """Replace the measured nodes' numa_bandwidth and memory_bandwidth facts in a running RM; a line
    saying what happened."""
    from cod.client import Client, CodError, NotConnected, PermissionDenied

    try:
        with Client(socket, reconnect=False, call_timeout_s=10.0) as client:
            for r in results:
                client.remove_facts(f"numa_bandwidth({r['node']}, _)", scope="system")
            for node in sorted({r["node"] for r in matrix}):
                client.remove_facts(f"memory_bandwidth({node}, _, _)", scope="system")
            client.add_facts([fact(r["node"], r["bandwidth_bytes_per_s"]) for r in results]
                             + [matrix_fact(r) for r in matrix], scope="system")
            return f"stored as system facts in the RM on {client.path}"
    except NotConnected as err:
        return f"not stored: {err}"
    except PermissionDenied as err:
        return f"not stored: {err}"
    except CodError as err:
        return f"not stored: the RM refused: {err}"


def pairs(machine: Machine, cpu_nodes: list[int], local: bool) -> list[tuple[int, int]]:
    """(CPU node, memory node) to measure: each CPU node with every node, or with itself (``local``)."""
    memory_nodes = [n.id for n in machine.numa_nodes] or [0]
    return [(c, c) for c in cpu_nodes] if local else [(c, m) for c in cpu_nodes for m in memory_nodes]


def measure(machine: Machine, todo: list[tuple[int, int]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """One triad per pair, each sized to the memory available just before it (half of MemAvailable)."""
    out = []
    try:
        for node, mem in todo:
            # Sized before each run: the arrays are freed between runs.
            wanted = default_array_bytes(machine, node) if args.size_mib is None else args.size_mib * MIB
            sizing = size_arrays(wanted, mem_available(), asked=args.size_mib is not None)
            if args.format == "text":
                where = f"node {node}" if mem == node else f"node {node}'s CPUs, node {mem}'s memory"
                sys.stdout.write(f"{where}: {sizing.sentence()}\n")
                sys.stdout.flush()
            run_ = plan_run(machine, node, threads=args.threads, array_bytes=sizing.array_bytes, memory_node=mem)
            out.append(measure_node(run_, args.iterations) | {"memory": sizing.sentence()})
    except DeployError as err:
        raise UserError(str(err)) from None
    return out


def matrix_lines(matrix: list[dict[str, Any]]) -> list[str]:
    """The matrix as a table: a row per CPU node, a column per memory node, GB/s."""
    rows = sorted({r["node"] for r in matrix})
    cols = sorted({r["memory_node"] for r in matrix})
    cell = {(r["node"], r["memory_node"]): r["bandwidth_bytes_per_s"] / 1e9 for r in matrix}
    out = ["GB/s triad, threads on the row's CPUs, memory on the column's node:",
           "cpu\\mem " + "".join(f"{c:>8}" for c in cols)]
    out += [f"{r:>8} " + "".join(f"{cell[r, c]:8.2f}" if (r, c) in cell else f"{'-':>8}" for c in cols) for r in rows]
    return out


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
    measured = measure(machine, pairs(machine, nodes, args.local), args)
    results = [r for r in measured if r["memory_node"] == r["node"]]  # each node's local figure
    matrix = [] if args.local else measured
    stored = "not stored (--no-store)" if args.no_store else store(results, matrix, args.socket)
    facts = [fact(r["node"], r["bandwidth_bytes_per_s"]) for r in results]
    if args.format == "json":
        sys.stdout.write(json.dumps({"nodes": results, "matrix": matrix, "facts": facts + [matrix_fact(r) for r in matrix],
                                     "stored": stored}, indent=1) + "\n")
        return 0
    for r in results:
        mib = r["elements"] * 8 / MIB
        sys.stdout.write(
            f"node {r['node']}: {r['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s triad "
            f"(best of {r['iterations'] - 1}; mean {r['mean_bandwidth_bytes_per_s'] / 1e9:.2f} GB/s; "
            f"{r['threads']} threads on CPUs {r['cpus']}; 3 x {mib:.0f} MiB"
            f"{', bound to the node' if r['memory_bound_to_node'] else ''})\n")
    if matrix:
        sys.stdout.write("\n".join(matrix_lines(matrix)) + "\n")
    what = "; ".join(facts) + (f" and {len(matrix)} memory_bandwidth/3 facts" if matrix else "")
    sys.stdout.write(f"{what}: {stored}\n")
    return 0

#!/usr/bin/env python3
"""The COD paper's Listing 1, written with `cod.client`.

CSCS connects to the RM, registers as a CPU-bound, cache- and NUMA-sensitive
task that could use every core, pushes its facts and cost function (all in the
one registration call: the paper needed 16 calls), runs the deployment stored
procedure `dbos_cost_function/3` (Listing 3, shipped in stored_procedures/),
tells the RM how many cores it needs, and receives the allocation upcall.

    python clients/python/examples/listing1.py [--socket PATH] [--sla-ms 3000]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from typing import Any

from cod.client import Client, CodError

# Listing 1, lines 11-15: the dataset and the workload.
def cscs_facts(sla_ms: int) -> list[str]:
    return [
        "db_ntuple(3750000)",
        "db_tsize(315)",
        "db_nquery(2048)",
        "db_nupdate(256)",
        f"db_rtime({sla_ms})",
    ]


# Listing 1, line 17: the cost function of Section 4.4 (cores needed to meet the SLA).
COST_FN = "db_cost_fn(X, Y, Z, NrCores) :- NrCores is (X * ((0.47 * Y) + 265.29)) / (3750000 * Z)."


def show(title: str, value: Any) -> None:
    sys.stdout.write(f"{title}: {json.dumps(value, sort_keys=True)}\n")  # one write: handlers run on another thread
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", help="RM socket (default: $COD_SOCKET or the daemon's default)")
    ap.add_argument("--sla-ms", type=int, default=3000, help="response-time SLA in milliseconds")
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the upcall")
    args = ap.parse_args(argv)

    upcalls: list[dict[str, Any]] = []
    arrived = threading.Condition()
    client: Client | None = None

    def on_allocation(event: dict[str, Any]) -> None:
        show("upcall allocation_changed", {k: event[k] for k in ("epoch", "cores", "numa_nodes", "added",
                                                                  "removed", "reason")})
        if event["removed"] and client is not None:
            # Cores are being taken away: a storage engine moves its scan threads and data first,
            # then acknowledges so the RM may give the cores to someone else.
            client.ack_allocation(epoch=event["epoch"])
        with arrived:
            upcalls.append(event)
            arrived.notify_all()

    try:
        # Lines 1-4: connect to the RM and the SKB (one socket does both).
        with Client.connect(args.socket, app="cscs") as client:
            info = client.server_info
            show("connected", {"machine": info["machine"], "protocol": info["protocol"], "app": info["app"]})
            facts = cscs_facts(args.sla_ms)
            show("facts pushed", facts + [COST_FN])
            # Lines 6-19 in one call: system-level properties, application facts, cost function.
            reg = client.register_task(
                "cscs", max_cores=len(client.execute_query("get_list_free_cpus(L)")[0]["L"]),
                bound="cpu", sensitive=["cache", "numa"],
                facts=facts, procedures=[COST_FN], on_allocation=on_allocation,
            )
            show("registered", {"task": reg["task"], "pid": reg["pid"], "properties": reg["properties"]})
            # Line 20: the deployment stored procedure (Listing 3).
            sols = client.execute_query("dbos_cost_function(Status, NrCores, PartSize)")
            if not sols:
                print("the deployment procedure failed: the SKB lacks a fact it needs", file=sys.stderr)
                return 1
            deployment = sols[0]
            show("deployment derived by the SKB", deployment)
            if deployment["Status"] != 0:
                why = {1: "not enough free cores", 2: "the dataset does not fit in free memory"}
                detail = ""
                if deployment["Status"] == 2:  # say by how much: free memory is the machine's, right now
                    free = client.execute_query("get_free_memory(F)")[0]["F"]
                    size = client.execute_query("db_ntuple(N), db_tsize(S), B is N * S")[0]["B"]
                    detail = f" ({size} bytes of data, {free} bytes free)"
                print(f"this machine cannot meet the SLA: {why.get(deployment['Status'])}{detail}", file=sys.stderr)
                return 2
            # The procedure's outcome becomes the task's system-level properties; the RM
            # recomputes the global allocation and sends the upcall with the concrete cores.
            n = deployment["NrCores"]
            done = client.update_task(min_cores=n, max_cores=n)
            epoch = done["allocation"]["epoch"]
            with arrived:
                ok = arrived.wait_for(lambda: any(u["epoch"] >= epoch and len(u["cores"]) == n for u in upcalls),
                                      args.timeout)
            if not ok:
                print(f"no allocation upcall with {n} cores within {args.timeout} s", file=sys.stderr)
                return 1
            final = client.allocation("cscs")
            show("allocation", {k: final[k] for k in ("epoch", "cores", "numa_nodes", "memory_nodes")})
            return 0
    except CodError as err:
        print(f"listing1: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The paper's Listing 1 as one call, and an SLA that moves: the allocation follows by itself.

CSCS registers with its facts, its cost function, the Listing 3 procedure (in
the SKB's library) and min_cores/max_cores derived from that procedure.  Then
the SLA changes three times; after each change the daemon evaluates the
procedure again and the task receives its upcall, without a line of CSCS
code translating one into the other.

    python clients/python/examples/codesign_loop.py --socket /tmp/rm.sock
(with a daemon running, e.g. `cod rm --socket /tmp/rm.sock --machine magnycours`)
"""

from __future__ import annotations

import argparse
import queue
import sys
from pathlib import Path

from cod.client import Client, CodError

COST_FN = (Path(__file__).resolve().parents[2] / "stored_procedures" / "examples" / "cscs_cost_fn.pl").read_text()
DERIVED_N = {"query": "dbos_cost_function(_, N, _)", "var": "N"}
DERIVED_P = {"query": "dbos_cost_function(_, _, P)", "var": "P"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", default=None)
    args = ap.parse_args()
    upcalls: queue.Queue = queue.Queue()
    try:
        with Client(args.socket, app="cscs") as c:
            r = c.register_task(
                "cscs", min_cores=DERIVED_N, max_cores=DERIVED_N, working_set_bytes=DERIVED_P,
                bound="cpu", sensitive=["cache", "numa"],
                facts=["db_ntuple(30000000)", "db_tsize(315)", "db_nquery(2048)", "db_nupdate(0)", "db_rtime(2000)"],
                procedures=[COST_FN], on_allocation=upcalls.put)
            print(f"SLA 2 s: {len(r['allocation']['cores'])} cores, partitions of "
                  f"{r['properties']['working_set_bytes'] / 2**30:.2f} GiB (derived by the SKB)")
            for sla in (4000, 8000, 2000):
                c.remove_facts("db_rtime(_)")
                c.add_facts([f"db_rtime({sla})"])
                while True:
                    up = upcalls.get(timeout=10)
                    if "derived" in up["reason"]:
                        break
                c.ack_allocation(epoch=up["epoch"])
                print(f"SLA {sla / 1000:g} s: {len(up['cores'])} cores ({up['reason']})")
    except CodError as err:
        print(f"codesign_loop: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

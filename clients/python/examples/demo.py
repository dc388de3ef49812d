#!/usr/bin/env python3
"""`make demo`: COD's main job, shown end to end on this machine.

1. An SKB starts on this machine's discovered facts; a few system queries.
2. The CSCS application pushes its facts and cost function (the paper's
   Listing 1) and calls the deployment procedure of Listing 3, on this
   machine and on the four machines of the paper (Table 3).
"""

from __future__ import annotations

import json
import sys

from cod.facts import from_args, machines
from cod.facts.text import count_noun, human_bytes
from cod.skb import SKB, SKBError

CSCS_FACTS = ["db_ntuple(30000000)", "db_tsize(315)", "db_nquery(2048)", "db_nupdate(0)"]
CSCS_COST_FN = (
    "db_cost_fn(NTuples, NRequests, RTimeMs, Cores) :-\n"
    "    Cores is (NTuples * (0.85 * NRequests + 106.37)) / (3750000 * RTimeMs)."
)


def show(skb: SKB, app: str, goal: str) -> None:
    print(f"  ?- {goal}")
    for solution in skb.execute_query(app, goal):
        print(f"     {json.dumps(solution)}")


def show_memory(skb: SKB) -> None:
    """The memory facts in the units the rest of the demo uses (the SKB's answer is in bytes)."""
    goal = "get_list_numa_sizes(Sizes), get_free_memory(Free)"
    print(f"  ?- {goal}")
    for solution in skb.execute_query("demo", goal):
        sizes = ", ".join(human_bytes(n) for n in solution["Sizes"])
        print(f"     NUMA node sizes [{sizes}], free {human_bytes(solution['Free'])}")


# dbos_cost_function's Status (stored_procedures/cscs.pl), in words.
STATUS_WORDS = {0: "the deployment fits",
                1: "not enough free CPUs here for that many cores",
                2: "the data does not fit in free memory"}


def status_text(status: int, free_cpus: int) -> str:
    words = STATUS_WORDS.get(status, "unknown status")
    if status == 1:
        words += f" ({free_cpus} free)"
    return f"status {status}, {words}"


def deploy(skb: SKB, sla_s: int) -> dict:
    skb.remove_facts("cscs", "db_rtime(_)")
    skb.add_facts("cscs", [f"db_rtime({sla_s * 1000})"])
    [answer] = skb.execute_query("cscs", "dbos_cost_function(Status, NrCores, PartSize)")
    return answer


def main() -> int:
    here = from_args()
    print(f"== SKB on this machine ({here.source}): {count_noun(len(here.cpu_ids()), 'CPU')}, "
          f"{count_noun(len(here.numa_nodes), 'NUMA node')}")
    with SKB() as skb:
        skb.load_machine(here)
        show(skb, "demo", "get_nr_cores(N)")
        show(skb, "demo", "get_list_free_cpus(Cpus)")
        show_memory(skb)
        show(skb, "demo", "cpu_affinity(0, Core, Node)")

        print("\n== CSCS pushes its facts and cost function (Listing 1)")
        for fact in CSCS_FACTS:
            print(f"  add_fact {fact}")
        skb.add_facts("cscs", CSCS_FACTS)
        print(f"  add_procedure {CSCS_COST_FN.splitlines()[0]} ...")
        skb.add_procedure("cscs", CSCS_COST_FN)

        print("\n== the untrusted-code sandbox at work (the SKB's default limits, as the shell and the daemon)")
        for goal in ("shell('rm -rf /')", "repeat, fail"):
            try:
                skb.execute_query("cscs", goal)
            except SKBError as err:
                print(f"  ?- {goal}\n     rejected ({err.code}): {err.message}")

        print("\n== Listing 3 deployment on this machine")
        [free] = skb.execute_query("demo", "get_list_free_cpus(Cpus), length(Cpus, N)")
        for sla in (2, 4, 8):
            a = deploy(skb, sla)
            print(f"  SLA {sla} s: {count_noun(a['NrCores'], 'core')}, partitions of {a['PartSize'] / 2**30:.2f} GiB: "
                  f"{status_text(a['Status'], free['N'])}")

    print("\n== Listing 3 on the machines of the paper (Table 3)")
    for name in ("nehalem-ex", "barcelona", "shanghai", "magnycours"):
        with SKB() as skb:
            skb.load_machine(machines.load(name))
            skb.add_facts("cscs", CSCS_FACTS)
            skb.add_procedure("cscs", CSCS_COST_FN)
            cores = [deploy(skb, sla)["NrCores"] for sla in (2, 4, 8)]
        print(f"  {name:11s} SLA 2/4/8 s -> {cores[0]} / {cores[1]} / {count_noun(cores[2], 'core')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

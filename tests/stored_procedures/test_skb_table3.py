"""The COD paper's Table 3: the CSCS deployment procedure on the four reference machines."""

from __future__ import annotations

import pytest

from cod.facts import machines
from cod.skb import SKB

# Section 7.2: 30 * 10^6 tuples of 315 B, 2048 requests per batch (the
# Table 3 figures follow from 2048 requests in all, see docs/design.md).
CSCS_FACTS = [
    "db_ntuple(30000000)",
    "db_tsize(315)",
    "db_nquery(2048)",
    "db_nupdate(0)",
]
# Section 4.4: RT[ms] = c * tuples / cores * (a * requests + b), solved for cores.
CSCS_COST_FN = (
    "db_cost_fn(NTuples, NRequests, RTimeMs, Cores) :-\n"
    "    Cores is (NTuples * (0.85 * NRequests + 106.37)) / (3750000 * RTimeMs)."
)
DATASET_BYTES = 30_000_000 * 315

# Table 3: total number of cores for SLA 2 s, 4 s and 8 s.
TABLE3 = {
    "nehalem-ex": (8, 4, 2),
    "barcelona": (8, 5, 5),
    "shanghai": (8, 4, 3),
    "magnycours": (8, 4, 2),
}


@pytest.mark.parametrize("machine", sorted(TABLE3))
def test_table3_core_counts(machine: str) -> None:
    with SKB() as skb:
        skb.load_machine(machines.load(machine))
        skb.add_facts("cscs", CSCS_FACTS)
        skb.add_procedure("cscs", CSCS_COST_FN)
        for sla_s, expected in zip((2, 4, 8), TABLE3[machine]):
            skb.remove_facts("cscs", "db_rtime(_)")
            skb.add_facts("cscs", [f"db_rtime({sla_s * 1000})"])
            [answer] = skb.execute_query("cscs", "dbos_cost_function(S, N, P)")
            assert answer["S"] == 0, (machine, sla_s, answer)
            assert answer["N"] == expected, (machine, sla_s, answer)
            assert answer["P"] == DATASET_BYTES // expected


def test_not_enough_cores_gives_status_1() -> None:
    with SKB() as skb:
        skb.load_machine(machines.load("shanghai"))  # 16 cores
        skb.add_facts("cscs", CSCS_FACTS + ["db_rtime(200)"])  # 10x tighter SLA: 74 cores
        skb.add_procedure("cscs", CSCS_COST_FN)
        [answer] = skb.execute_query("cscs", "dbos_cost_function(S, N, P)")
        assert answer["S"] == 1 and answer["N"] > 16


def test_not_enough_memory_gives_status_2() -> None:
    with SKB() as skb:
        skb.load_machine(machines.load("barcelona"))  # 16 GiB in all
        skb.add_facts(
            "cscs",
            ["db_ntuple(3000000)", "db_tsize(10000)", "db_nquery(2048)", "db_nupdate(0)", "db_rtime(8000)"],
        )  # 30 GB of data, needs 14 cores of the 32 to fit the nodes
        skb.add_procedure("cscs", CSCS_COST_FN)
        [answer] = skb.execute_query("cscs", "dbos_cost_function(S, N, P)")
        assert answer["S"] == 2, answer


def test_cores_of_other_applications_are_not_free() -> None:
    with SKB() as skb:
        skb.load_machine(machines.load("shanghai"))
        skb.add_system_facts(["task(other, 1, other)"] + [f"allocated(other, {c})" for c in range(12)])
        skb.add_facts("cscs", CSCS_FACTS + ["db_rtime(2000)"])
        skb.add_procedure("cscs", CSCS_COST_FN)
        [answer] = skb.execute_query("cscs", "dbos_cost_function(S, N, P), get_list_free_cpus(F)")
        assert answer["F"] == [12, 13, 14, 15]
        assert answer["S"] == 1  # 8 cores needed, 4 free

"""Writes tpcw_magnycours.json and tpcw_nehalem-ex.json: a TPC-W-shaped global plan.

The shape follows SharedDB's TPC-W plan (Giceva et al., VLDB 2015, Figure 6):
44 always-on operators numbered 0-47 with four numbers unused, Crescando scans
(two threads each for Item and OrderLine, siblings), key-value lookups, shared
joins, and ten pipelines of blocking operators (group-by, sort, top-N,
distinct) that phase 1 collapses (44 -> 32).

The RAVs are *not* the paper's data (it prints them only as bar charts): they
are made up to have the shape its text describes.  MagnyCours (Figure 8d,
Figure 9): 19 operators above 5 % cpu_util, the scans 0 and 1 the busiest
scans, join 16 the busiest join.  Nehalem-EX (Figure 9b): the scans 0, 1, 13
and 14 busier, only 8 operators above 5 %.  mem_bw is the bandwidth averaged
over the whole run (Eq. 2), small for all but the scans.  Run this file to
regenerate the JSON after changing it.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
GB = 1e9

# id, name, blocking, siblings, (cpu_util, mem_bw) on magnycours, on nehalem-ex
OPERATORS = [
    (0, "scan_item", False, "scan_item", (0.70, 1.60 * GB), (0.82, 1.10 * GB)),
    (1, "scan_item", False, "scan_item", (0.66, 1.50 * GB), (0.80, 1.05 * GB)),
    (2, "scan_author", False, None, (0.08, 0.20 * GB), (0.03, 0.10 * GB)),
    (3, "scan_customer", False, None, (0.20, 0.50 * GB), (0.12, 0.30 * GB)),
    (5, "scan_address", False, None, (0.07, 0.15 * GB), (0.02, 0.08 * GB)),
    (6, "scan_country", False, None, (0.01, 0.01 * GB), (0.005, 0.01 * GB)),
    (7, "scan_orders", False, None, (0.18, 0.45 * GB), (0.09, 0.30 * GB)),
    (8, "scan_ccxacts", False, None, (0.06, 0.12 * GB), (0.03, 0.06 * GB)),
    (9, "kv_cart", False, None, (0.04, 0.05 * GB), (0.02, 0.03 * GB)),
    (10, "kv_cartline", False, None, (0.05, 0.06 * GB), (0.02, 0.03 * GB)),
    (12, "kv_customer", False, None, (0.03, 0.04 * GB), (0.01, 0.02 * GB)),
    (13, "scan_orderline", False, "scan_orderline", (0.40, 0.90 * GB), (0.62, 0.80 * GB)),
    (14, "scan_orderline", False, "scan_orderline", (0.38, 0.85 * GB), (0.58, 0.75 * GB)),
    (15, "join_item_auth", False, None, (0.30, 0.30 * GB), (0.22, 0.20 * GB)),
    (16, "join_ord_ol", False, None, (0.85, 0.60 * GB), (0.66, 0.45 * GB)),
    (17, "join_cust_addr", False, None, (0.12, 0.10 * GB), (0.05, 0.06 * GB)),
    (18, "kv_item", False, None, (0.06, 0.05 * GB), (0.03, 0.03 * GB)),
    (19, "groupby_bestsel", True, None, (0.15, 0.08 * GB), (0.05, 0.05 * GB)),
    (20, "sort_bestsel", True, None, (0.06, 0.03 * GB), (0.03, 0.02 * GB)),
    (21, "topn_bestsel", True, None, (0.02, 0.01 * GB), (0.01, 0.01 * GB)),
    (22, "join_addr_cntry", False, None, (0.04, 0.03 * GB), (0.02, 0.02 * GB)),
    (23, "join_cc_orders", False, None, (0.05, 0.04 * GB), (0.03, 0.03 * GB)),
    (24, "sort_newprod", True, None, (0.04, 0.02 * GB), (0.02, 0.01 * GB)),
    (25, "topn_newprod", True, None, (0.01, 0.01 * GB), (0.01, 0.005 * GB)),
    (26, "sort_title", True, None, (0.05, 0.02 * GB), (0.03, 0.01 * GB)),
    (27, "topn_title", True, None, (0.01, 0.01 * GB), (0.01, 0.005 * GB)),
    (28, "sort_author", True, None, (0.04, 0.02 * GB), (0.02, 0.01 * GB)),
    (29, "topn_author", True, None, (0.01, 0.01 * GB), (0.01, 0.005 * GB)),
    (30, "sort_subject", True, None, (0.03, 0.02 * GB), (0.02, 0.01 * GB)),
    (31, "union_results", False, None, (0.02, 0.02 * GB), (0.01, 0.01 * GB)),
    (32, "topn_subject", True, None, (0.01, 0.01 * GB), (0.005, 0.005 * GB)),
    (33, "groupby_related", True, None, (0.06, 0.03 * GB), (0.03, 0.02 * GB)),
    (34, "sort_related", True, None, (0.03, 0.01 * GB), (0.01, 0.01 * GB)),
    (35, "join_cust_ord", False, None, (0.09, 0.06 * GB), (0.04, 0.04 * GB)),
    (36, "sort_lastord", True, None, (0.02, 0.01 * GB), (0.01, 0.01 * GB)),
    (37, "topn_lastord", True, None, (0.01, 0.01 * GB), (0.005, 0.005 * GB)),
    (38, "groupby_ordhist", True, None, (0.07, 0.03 * GB), (0.03, 0.02 * GB)),
    (39, "sort_ordhist", True, None, (0.03, 0.01 * GB), (0.02, 0.01 * GB)),
    (41, "topn_ordhist", True, None, (0.01, 0.01 * GB), (0.005, 0.005 * GB)),
    (42, "sort_cart", True, None, (0.02, 0.01 * GB), (0.01, 0.01 * GB)),
    (43, "distinct_cart", True, None, (0.01, 0.01 * GB), (0.005, 0.005 * GB)),
    (44, "groupby_caddr", True, None, (0.03, 0.01 * GB), (0.02, 0.01 * GB)),
    (45, "topn_caddr", True, None, (0.01, 0.01 * GB), (0.005, 0.005 * GB)),
    (46, "join_cart_item", False, None, (0.10, 0.08 * GB), (0.04, 0.04 * GB)),
]

# Dataflow: storage -> joins -> pipelines of blocking operators -> the result union.
EDGES = [
    (0, 15), (1, 15), (2, 15),                       # item x author
    (7, 16), (13, 16), (14, 16),                     # orders x order_line
    (3, 17), (5, 17),                                # customer x address
    (17, 22), (6, 22),                               # ... x country
    (8, 23), (7, 23),                                # cc_xacts x orders
    (12, 35), (7, 35),                               # customer x orders
    (9, 46), (10, 46), (18, 46),                     # shopping cart x item
    (16, 19), (19, 20), (20, 21), (21, 31),          # best sellers: group, sort, top-N
    (15, 24), (24, 25), (25, 31),                    # new products
    (15, 26), (26, 27), (27, 31),                    # search by title
    (15, 28), (28, 29), (29, 31),                    # search by author
    (15, 30), (30, 32), (32, 31),                    # search by subject
    (16, 33), (33, 34), (34, 31),                    # related items
    (35, 36), (36, 37), (37, 31),                    # order display: last order
    (23, 38), (38, 39), (39, 41), (41, 31),          # order history
    (46, 42), (42, 43), (43, 31),                    # shopping cart contents
    (22, 44), (44, 45), (45, 31),                    # customer addresses
]


def op_id(num: int) -> str:
    name = next(n for i, n, *_ in OPERATORS if i == num)
    return f"{num:02d}_{name}"


def graph(machine: str) -> dict:
    which = 0 if machine == "magnycours" else 1
    ops = []
    for num, name, blocking, siblings, *ravs in OPERATORS:
        cpu, bw = ravs[which]
        op = {"id": op_id(num), "cpu_util": cpu, "mem_bw": bw, "blocking": blocking}
        if siblings:
            op["siblings"] = siblings
        ops.append(op)
    return {
        "description": f"TPC-W-shaped SharedDB global plan, RAVs shaped like the paper's {machine} "
                       "figures (made up; see make_tpcw.py)",
        "machine": machine,
        "operators": ops,
        "edges": [[op_id(a), op_id(b)] for a, b in EDGES],
    }


if __name__ == "__main__":
    for machine in ("magnycours", "nehalem-ex"):
        (HERE / f"tpcw_{machine}.json").write_text(json.dumps(graph(machine), indent=1) + "\n")

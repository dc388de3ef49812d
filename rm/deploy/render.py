"""A deployment as text: a summary line, then a table per NUMA node."""

from __future__ import annotations

from .plan import DeployPlan


def _gbs(bw: int | None) -> str:
    return "?" if bw is None else f"{bw / 1e9:.2f}"


def render_text(plan: DeployPlan, *, explain: bool = False) -> str:
    lines: list[str] = []
    if explain:
        lines += list(plan.explanation) + [""]
    opt = "unproven" if plan.cores_optimal is None else str(plan.cores_optimal)
    used = "" if plan.min_cores == plan.cores else f", deployed on {plan.min_cores}"
    n = plan.numa
    lines.append(
        f"{plan.machine}: {plan.operators} operators -> {len(plan.compounds)} compound operators -> "
        f"{plan.cores} cores (optimal {opt}{used}) -> {len(n.nodes)} NUMA node(s) {list(n.nodes)} "
        f"(density {n.density:.2f})")
    for use in n.usage:
        lines.append("")
        lines.append(f"NUMA node {use.node}: {len(use.cpus)} of {use.usable_slots} cores, "
                     f"mem_bw {_gbs(use.mem_bw)} of {_gbs(use.bandwidth)} GB/s"
                     + ("" if use.bandwidth_source == "machine" else f" ({use.bandwidth_source})"))
        lines.append(f"  {'CPU':>4}  {'cluster':>7}  {'cpu_util':>8}  {'mem_bw':>11}  operators")
        by_index = {c.index: c for c in plan.clusters}
        rows = sorted((by_index[i] for i in use.clusters), key=lambda c: (c.cpu if c.cpu is not None else -1))
        for c in rows:
            bw = f"{_gbs(c.mem_bw)} GB/s" + ("" if c.mem_bw_known else "?")
            lines.append(f"  {c.cpu:>4}  {c.index:>7}  {100 * c.cpu_util:>7.1f}%  {bw:>11}  "
                         f"{', '.join(c.compounds)}")
    if plan.warnings:
        lines.append("")
        lines += [f"warning: {w}" for w in plan.warnings]
    return "\n".join(lines) + "\n"

"""Why a task has the CPUs it has, in sentences.

The allocator names what limited each task in its ``binding`` list
(cod.rm.allocator.explain: ``"min"``, ``"max"``, ``"machine size"``,
``"exclusive neighbour T"``, ``"SMT sibling of T"``, ``"SMT sibling held by T"``,
``"memory of node N"``, ``"cache polluter T"``, ``"cache-sensitive T"``,
``"unavailable CPUs"``, ``"reserved for other.PID"``).  This module turns each into a sentence with its
evidence (the neighbour's CPUs, the node's memory, the busy processes), and
adds what the task asked for and where its CPUs lie.  Pure: the data in, the
explanation out.
"""

from __future__ import annotations

import re
from typing import Any

from cod.facts.cpulist import format_cpulist
from cod.facts.model import Machine
from cod.facts.text import human_bytes

from ..matrix import cpu_groups


def cpus_text(cpus: Any) -> str:
    cpus = list(cpus or [])
    return format_cpulist(cpus) if cpus else "none"


def _asked(props: dict[str, Any], n_cpus: int) -> list[str]:
    lo = props.get("min_cores", 1)
    hi = props.get("max_cores")
    out = [f"min_cores {lo}, max_cores {hi if hi is not None else f'none (up to the machine, {n_cpus})'}"]
    ws = props.get("working_set_bytes") or 0
    if ws:
        out.append(f"working set {human_bytes(ws)} per CPU, on that CPU's NUMA node")
    sens = props.get("sensitive") or []
    if sens:
        out.append(f"sensitive to {' and '.join(sens)}: kept on as few "
                   f"{' and '.join({'numa': 'NUMA nodes', 'cache': 'L3 domains'}.get(s, s) for s in sens)} as it can")
    out.append("exclusive: shares its CPUs with no other task" if props.get("exclusive", True)
               else "not exclusive: may share CPUs with other non-exclusive tasks")
    if props.get("pollutes_cache"):
        out.append("pollutes the cache: kept out of the L3 domains of cache-sensitive tasks")
    if props.get("priority"):
        out.append(f"priority {props['priority']}")
    return out


def explain_binding(item: str, task: dict[str, Any], tasks: dict[str, dict[str, Any]],
                    others: list[dict[str, Any]], unavailable: list[int], machine: Machine | None) -> str:
    """One entry of the allocator's ``binding`` list, as a sentence with its evidence."""
    props = task.get("properties") or {}
    n = len(task.get("cores") or [])
    if item == "min":
        return f"It holds exactly its min_cores ({props.get('min_cores', n)}): no more was left for it."
    if item == "max":
        return f"It holds its max_cores ({props.get('max_cores', n)}): it asked for no more."
    if item == "machine size":
        return "It holds every CPU it could use on this machine."
    if item == "unavailable CPUs":
        who = ", ".join(f"pid {o['pid']} ({o.get('comm')})" for o in others) or "unregistered processes"
        return f"CPUs {cpus_text(unavailable)} are kept free for busy processes no task registered: {who}."
    m = re.fullmatch(r"(exclusive neighbour|SMT sibling of|SMT sibling held by|cache polluter|cache-sensitive) (.+)",
                     item)
    if m:
        kind, other = m.group(1), m.group(2)
        theirs = cpus_text((tasks.get(other) or {}).get("cores"))
        if kind == "exclusive neighbour":
            return (f"Task {other} holds CPUs {theirs}, and an exclusive task shares its CPUs with no one, "
                    f"so {task['task']} cannot have them.")
        if kind == "SMT sibling of":
            return (f"Task {other} is exclusive and holds CPUs {theirs}: their SMT siblings stay idle for it, "
                    f"so {task['task']} cannot have them.")
        if kind == "SMT sibling held by":
            return (f"{task['task']} is exclusive and keeps the SMT siblings of its CPUs idle; task {other} "
                    f"holds siblings ({theirs}) of CPUs it could otherwise take.")
        if kind == "cache polluter":
            return (f"Task {other} pollutes the cache and holds CPUs {theirs}; {task['task']} is cache-sensitive "
                    f"and does not share an L3 domain with it.")
        return (f"Task {other} is cache-sensitive and holds CPUs {theirs}; {task['task']} pollutes the cache "
                f"and keeps out of its L3 domains.")
    m = re.fullmatch(r"reserved for other\.(\d+)", item)
    if m:
        pid = int(m.group(1))
        other = next((o for o in others if o.get("pid") == pid), {})
        return (f"Unregistered busy process {pid}" + (f" ({other['comm']})" if other.get("comm") else "")
                + f" is kept on CPUs {cpus_text(other.get('cpus'))}: moving it there cost less than moving "
                  f"a registered task, so {task['task']} cannot have them.")
    m = re.fullmatch(r"memory of node (-?\d+)", item)
    if m:
        return memory_text([int(m.group(1))], task, tasks, machine)
    return f"{item[0].upper()}{item[1:]}."


def memory_text(nodes: list[int], task: dict[str, Any], tasks: dict[str, dict[str, Any]],
                machine: Machine | None) -> str:
    """Why NUMA nodes `nodes` give the task no more CPUs: no room for another working set there."""
    ws = (task.get("properties") or {}).get("working_set_bytes") or 0
    usage = []
    for node in nodes:
        free = None
        if machine is not None:
            for nd in machine.numa_nodes:
                if nd.id == node:
                    free = nd.free_bytes if nd.free_bytes is not None else nd.memory_bytes
        used = sum((t.get("properties") or {}).get("working_set_bytes", 0) or 0
                   for t in tasks.values() for c in (t.get("cores") or []) if _node_of(machine, c) == node)
        usage.append((node, used, free))
    which = f"NUMA node {nodes[0]} has" if len(nodes) == 1 else \
        f"NUMA nodes {', '.join(map(str, nodes[:-1]))} and {nodes[-1]} have"
    known = [(n, u, f) for n, u, f in usage if f is not None]
    if known and len({(u, f) for _, u, f in known}) == 1:
        _, used, free = known[0]
        who = "each has" if len(nodes) > 1 else "it has"
        room = f" ({who} {human_bytes(used)} of working sets in {human_bytes(free)})"
    elif known:
        room = " (" + "; ".join(f"node {n} has {human_bytes(u)} of working sets in {human_bytes(f)}"
                                for n, u, f in known) + ")"
    else:
        room = ""
    return f"{which} no room for another {human_bytes(ws)} working set{room}; so no more CPUs there."


def _node_of(machine: Machine | None, cpu: int) -> int | None:
    if machine is None:
        return None
    for pu in machine.pus:
        if pu.id == cpu:
            return pu.numa_node
    return None


def _placement(name: str, task: dict[str, Any], tasks: dict[str, dict[str, Any]], machine: Machine) -> list[str]:
    """Where the task's CPUs lie, what else is there, and how that meets what it asked for."""
    cores = list(task.get("cores") or [])
    props = task.get("properties") or {}
    all_groups = cpu_groups(machine)
    used = [(node, label, [c for c in cpus if c in cores], cpus) for node, label, cpus in all_groups]
    used = [u for u in used if u[2]]
    nodes = sorted({node for node, _, _, _ in used})
    out = [f"{len(cores)} CPUs ({cpus_text(cores)}) in {len(used)} L3 domain(s) on NUMA node(s) "
           f"{', '.join(map(str, nodes))}."]
    ws = props.get("working_set_bytes") or 0
    capacity = {n.id: (n.free_bytes if n.free_bytes is not None else n.memory_bytes) for n in machine.numa_nodes}
    for node, label, held, members in used:
        sharing = sorted(o for o, t in tasks.items() if o != name and set(t.get("cores") or []) & set(members))
        line = f"node {node}, {label}: {cpus_text(held)} ({len(held)} of {len(members)})"
        if sharing:
            line += f"; shared with {', '.join(sharing)}"
        if ws and capacity.get(node):
            on_node = sum(1 for c in cores if _node_of(machine, c) == node)
            line += (f"; working sets {on_node} x {human_bytes(ws)} = {human_bytes(on_node * ws)} "
                     f"of {human_bytes(capacity[node])}")
        out.append(line)
    sensitive = props.get("sensitive") or []
    per_node: dict[int, int] = {}
    for pu in machine.pus:
        if pu.online and pu.numa_node is not None:
            per_node[pu.numa_node] = per_node.get(pu.numa_node, 0) + 1
    if "numa" in sensitive and per_node:
        per = max(per_node.values())
        if ws:
            per = min(per, max(((capacity.get(n) or 0) // ws for n in per_node), default=per) or per)
        out.append(f"NUMA-sensitive: on {len(nodes)} node(s); the fewest that could hold {len(cores)} CPUs"
                   f"{' and their working sets' if ws else ''}: {-(-len(cores) // max(per, 1))}.")
    if "cache" in sensitive:
        biggest = max((len(m) for _, _, m in all_groups), default=1)
        out.append(f"Cache-sensitive: in {len(used)} L3 domain(s); the fewest that could hold {len(cores)} CPUs: "
                   f"{-(-len(cores) // biggest)}.")
    return out


def memory_lines(task: dict[str, Any], machine: Machine | None) -> list[str]:
    """Where the task's resident pages are (``task_numa_pages/3``, as last measured), against its
    memory nodes, where they belong: the nodes of its CPUs, or more (``memory_reason`` says why)."""
    home = sorted({n for c in task.get("cores") or [] if (n := _node_of(machine, c)) is not None})
    mems = sorted(task.get("memory_nodes") or home)
    reason = task.get("memory_reason")
    chosen = [f"Memory nodes {', '.join(map(str, mems))}: {reason}."] if reason else []
    pages = {int(n): int(p) for n, p in (task.get("numa_pages") or {}).items()}
    total = sum(pages.values())
    if not total:
        return chosen + ["Not measured yet (the daemon reads numa_maps every few refreshes)."]
    out = chosen + [f"{human_bytes(total * 4096)} resident: " + ", ".join(
        f"node {n} {human_bytes(p * 4096)} ({p / total:.0%})" for n, p in sorted(pages.items()))]
    if mems:
        on = sum(p for n, p in pages.items() if n in mems)
        whose = "its memory nodes" if reason else "the nodes of its CPUs"
        out.append(f"{on / total:.0%} on {whose} ({', '.join(map(str, mems))})"
                   + ("." if on == total else "; the rest drifted off them or was not moved (the daemon logs it)."))
    return out


def explain_task(name: str, listing: dict[str, Any], machine: Machine | None) -> dict[str, Any]:
    """The explanation of task ``name`` from a list_tasks listing (and the machine, when known)."""
    tasks = {t["task"]: t for t in listing.get("tasks", [])}
    task = tasks.get(name)
    if task is None:
        known = ", ".join(sorted(tasks)) or "none"
        raise KeyError(f"no task named {name!r} (registered tasks: {known})")
    plan = listing.get("plan") or {}
    others = listing.get("other_tasks") or []
    unavailable = list(plan.get("unavailable") or [])
    cores = list(task.get("cores") or [])
    n_cpus = len(machine.cpu_ids()) if machine is not None else 0
    placement: list[str] = []
    if machine is not None and cores:
        placement += _placement(name, task, tasks, machine)
    elif not cores:
        placement.append("It holds no CPUs.")
    binding = list(task.get("binding") or [])
    memory_nodes = [int(b.rsplit(" ", 1)[1]) for b in binding if re.fullmatch(r"memory of node -?\d+", b)]
    constraints = [{"binding": b, "text": explain_binding(b, task, tasks, others, unavailable, machine)}
                   for b in binding if not b.startswith("memory of node ")]
    if memory_nodes:
        constraints.append({"binding": [f"memory of node {n}" for n in memory_nodes],
                            "text": memory_text(memory_nodes, task, tasks, machine)})
    if not binding:
        constraints.append({"binding": None, "text": "The allocator recorded nothing that limited it "
                            "(no plan explains it: the daemon made none, or this SKB holds its facts only)."})
    releasing = task.get("releasing") or []
    return {
        "task": name, "pid": task.get("pid"), "app": task.get("app"), "cores": cores,
        "releasing": releasing, "asked": _asked(task.get("properties") or {}, n_cpus),
        "placement": placement, "memory": memory_lines(task, machine), "constraints": constraints,
        "plan": {k: plan.get(k) for k in ("solver", "status", "solve_ms", "cache_policy", "cache_partition")},
        "epoch": listing.get("epoch"),
    }


def explanation_lines(ex: dict[str, Any]) -> list[str]:
    """The explanation as text lines (the renderer adds colour)."""
    who = f"task {ex['task']}" + (f" (application {ex['app']}, pid {ex['pid']})" if ex.get("app") else "")
    lines = [f"{who} holds CPUs {cpus_text(ex['cores'])} in epoch {ex.get('epoch')}."]
    if ex.get("releasing"):
        lines.append(f"It is giving back CPUs {cpus_text(ex['releasing'])} (taken from it, not yet acknowledged).")
    lines.append("It asked for:")
    lines += [f"  - {a}" for a in ex["asked"]]
    lines.append("Where its CPUs are:")
    lines += [f"  - {p}" for p in ex["placement"]]
    if ex.get("memory"):
        lines.append("Where its memory is:")
        lines += [f"  - {m}" for m in ex["memory"]]
    lines.append("What bounds it:")
    lines += [f"  - {c['text']}" for c in ex["constraints"]]
    plan = ex.get("plan") or {}
    if plan.get("solver") not in (None, "none"):
        lines.append(f"The plan was made by {plan['solver']} ({plan.get('status')}, {plan.get('solve_ms')} ms).")
    for key in ("cache_policy", "cache_partition"):  # what was done about cache locality (SLS, MLS)
        if plan.get(key):
            lines.append(plan[key])
    return lines

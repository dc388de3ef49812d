"""A compact human picture of a Machine, for a person at a terminal.

Like ``lstopo-no-graphics`` but one line per package, NUMA node and L3 group,
nested by CPU containment (whichever of package, node or L3 is the larger on
this machine comes outside: nodes inside packages on Magny-Cours, packages
inside nodes on POWER7), followed by the node distance matrix.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .cpulist import format_cpulist
from .model import Machine


def human_bytes(n: int | None) -> str:
    if n is None:
        return "? B"
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            value = n / size
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{n} B"


def memory_note(m: Machine) -> str:
    """A word when the NUMA nodes' memory does not add up to the machine's (more than 1 % apart)."""
    counted = [n.memory_bytes for n in m.numa_nodes]
    if m.total_memory_bytes is None or not counted or None in counted:
        return ""
    nodes = sum(c or 0 for c in counted)
    if abs(nodes - m.total_memory_bytes) <= m.total_memory_bytes // 100:
        return ""
    return (f"memory: the NUMA nodes count {human_bytes(nodes)} of the {human_bytes(m.total_memory_bytes)} "
            f"the kernel counts in all (/proc/meminfo); some kernels count memory per node only once it "
            f"has been used (docs/design-facts.md, \"Memory\")")


@dataclass
class _Box:
    rank: int  # outer before inner when CPU sets are equal: package, node, L3
    cpus: frozenset[int]
    label: str
    children: list["_Box"] = field(default_factory=list)


def count_noun(n: int, noun: str) -> str:
    """`1 core`, `2 cores`: the one way COD's text counts things."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def render(machine: Machine) -> str:
    m = machine
    online = [p for p in m.pus if p.online]
    offline = [p.id for p in m.pus if not p.online]
    head = (f"Machine {m.name} ({m.source}): {count_noun(len(m.packages), 'package')}, "
            f"{count_noun(len(m.numa_nodes), 'NUMA node')}, {len(m.l3_caches())} L3, {count_noun(len(m.cores), 'core')}, "
            f"{count_noun(len(online), 'PU')}, {human_bytes(m.total_memory_bytes)}")
    lines = [head]
    core_of = {p.id: p.core for p in m.pus}

    def counts(cpus: frozenset[int]) -> str:
        n_cores = len({core_of[c] for c in cpus if c in core_of})
        return f"{count_noun(n_cores, 'core')}, {count_noun(len(cpus), 'PU')}: {format_cpulist(cpus)}"

    boxes = [_Box(0, frozenset(p.cpus), f"Package P#{p.id}") for p in m.packages]
    for n in m.numa_nodes:
        free = f", {human_bytes(n.free_bytes)} free" if n.free_bytes is not None else ""
        boxes.append(_Box(1, frozenset(n.cpus), f"NUMANode P#{n.id} "
                          f"({human_bytes(n.memory_bytes)}{free})"))
    boxes += [_Box(2, frozenset(c.cpus), f"L3 ({human_bytes(c.size_bytes)})")
              for c in m.l3_caches()]
    # Place each box inside the smallest earlier box that contains its CPUs.
    boxes.sort(key=lambda b: (-len(b.cpus), b.rank, min(b.cpus, default=-1)))
    top: list[_Box] = []
    placed: list[_Box] = []
    for box in boxes:
        # Same-kind groups with equal CPUs (KNL's DRAM and MCDRAM nodes) are siblings.
        parents = [p for p in placed if box.cpus and box.cpus <= p.cpus
                   and (len(p.cpus) > len(box.cpus) or p.rank < box.rank)]
        if parents:
            min(parents, key=lambda p: (len(p.cpus), -p.rank)).children.append(box)
        else:
            top.append(box)
        placed.append(box)

    def emit(box: _Box, depth: int) -> None:
        lines.append(f"{'  ' * depth}{box.label}  {counts(box.cpus)}")
        for child in sorted(box.children, key=lambda b: (min(b.cpus, default=-1), b.rank)):
            emit(child, depth + 1)

    for box in sorted(top, key=lambda b: (min(b.cpus, default=-1), b.rank)):
        emit(box, 1)
    if offline:
        lines.append(f"  offline PUs: {format_cpulist(offline)}")
    if m.allowed_cpus is not None:
        lines.append(f"  allowed CPUs: {format_cpulist(m.allowed_cpus)}")
    if m.allowed_mems is not None:
        lines.append(f"  allowed NUMA nodes: {format_cpulist(m.allowed_mems)}")
    note = memory_note(m)
    if note:
        lines.append(f"  {note}")
    ids = [n.id for n in sorted(m.numa_nodes, key=lambda n: n.id)]
    if any(n.distances for n in m.numa_nodes) and len(ids) > 1:
        width = max(4, *(len(str(i)) + 1 for i in ids))
        lines.append("  distances" + "".join(f"{i:>{width}}" for i in ids))
        for n in sorted(m.numa_nodes, key=lambda n: n.id):
            row = "".join(f"{n.distances.get(j, '-'):>{width}}" for j in ids)
            lines.append(f"  {n.id:>9}{row}")
    return "\n".join(lines) + "\n"

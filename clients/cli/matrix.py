"""The allocation matrix, the COD paper's Figure 4: its one renderer.

One row per task, one column per CPU, the columns grouped by NUMA node and L3
domain (``|`` between groups).  A matrix wider than ``width`` is folded at group
boundaries into blocks that each fit, the row labels repeated in each; a single
group wider than the width is cut into pieces too.  `cod plan` prints it as
plain text and the shell in colour: a line is a list of (text, style)
segments, so neither needs the other's output library.  Row labels are made
terminal-safe (terminal.py) before the columns are measured.  No I/O here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from cod.facts.cpulist import format_cpulist
from cod.facts.model import Machine

from .terminal import terminal_safe

# The marks of a cell, and the legend's words for them.
HELD, NOT_HELD, RELEASING, BUSY, FREE, RESERVED = "X", ".", "r", "#", "o", "R"

_MEANING = {HELD: "held by the row's task", RESERVED: "reserved for an unregistered process",
            RELEASING: "being given back", BUSY: "busy with unregistered work", FREE: "free"}

Segment = tuple[str, str]  # (text, style); style "" is plain
Group = tuple[int, str, list[int]]  # (node, label, cpus); node -1 when unknown


@dataclass(frozen=True)
class MatrixRow:
    """One row: its label, the label's style, and the mark and style of each CPU's cell."""

    label: str
    style: str
    mark: Callable[[int], Segment]


def cpu_groups(machine: Machine, cpus: list[int] | None = None) -> list[Group]:
    """Runs of CPUs sharing one NUMA node and one L3 domain, in node then domain order.

    Each is (node, label, cpus), the label naming the L3 (``L3 0-5``), or the
    node when the machine reports no L3.  These are the matrix's column groups."""
    node_of = {p.id: (p.numa_node if p.numa_node is not None else -1) for p in machine.pus}
    l3_of: dict[int, tuple[int, ...]] = {}
    for cache in machine.l3_caches():
        for c in cache.cpus:
            l3_of.setdefault(c, cache.cpus)
    wanted = sorted(cpus if cpus is not None else machine.cpu_ids())
    keyed = sorted(wanted, key=lambda c: (node_of.get(c, -1), min(l3_of.get(c, (c,))) if c in l3_of else -1, c))
    groups: list[Group] = []
    prev: tuple[int, tuple[int, ...] | None] | None = None
    for c in keyed:
        key = (node_of.get(c, -1), l3_of.get(c))
        if key != prev:
            domain = key[1]
            label = f"L3 {format_cpulist(domain)}" if domain else (f"node {key[0]}" if key[0] >= 0 else "machine")
            groups.append((key[0], label, []))
            prev = key
        groups[-1][2].append(c)
    return groups


def _node_text(node: int) -> str:
    return f"node {node}" if node >= 0 else "node ?"


def _piece_width(piece: Group, cell: int) -> int:
    """Columns of one group's piece: its CPUs, or its node and L3 labels when they are wider
    (a node of two CPUs: "node 0" and "L3 0-1" are wider than " 0  1")."""
    node, label, cpus = piece
    return max(len(cpus) * (cell + 1) - 1, len(_node_text(node)), len(label))


def _fold(groups: list[Group], cell: int, label_w: int, width: int) -> list[list[Group]]:
    """Blocks of groups that each fit in `width` columns (a group too wide alone is cut)."""
    room = max(width - label_w - 2, cell + 3)
    per_group = max(1, (room - 3 + 1) // (cell + 1))  # CPUs of one group that fit in a block by themselves
    pieces: list[Group] = []
    for node, label, cpus in groups:
        for i in range(0, len(cpus), per_group):
            pieces.append((node, label, cpus[i:i + per_group]))
    blocks: list[list[Group]] = [[]]
    used = 0
    for piece in pieces:
        w = 3 + _piece_width(piece, cell)
        if blocks[-1] and used + w > room:
            blocks.append([])
            used = 0
        blocks[-1].append(piece)
        used += w
    return [b for b in blocks if b]


def _head_lines(block: list[Group], cell: int, label_w: int) -> list[list[Segment]]:
    """The block's NUMA, L3 and CPU lines; a label repeated from the piece before is left blank."""
    node_line: list[Segment] = [("NUMA".ljust(label_w), "bold")]
    l3_line: list[Segment] = [("L3".ljust(label_w), "bold")]
    cpu_line: list[Segment] = [("CPU".ljust(label_w), "bold")]
    prev_node: int | None = None
    prev_label: str | None = None
    for piece in block:
        node, label, members = piece
        w = _piece_width(piece, cell)
        node_text = _node_text(node) if node != prev_node else ""
        l3_text = label if label != prev_label else ""
        node_line.append((" | " + node_text[:w].ljust(w), "bold"))
        l3_line.append((" | " + l3_text[:w].ljust(w), ""))
        cpu_line.append((" | " + " ".join(str(c).rjust(cell) for c in members).ljust(w), "bold"))
        prev_node, prev_label = node, label
    return [node_line, l3_line, cpu_line]


def _row_line(row: MatrixRow, block: list[Group], cell: int, label_w: int) -> list[Segment]:
    line: list[Segment] = [(row.label.ljust(label_w), row.style)]
    for piece in block:
        line.append((" | ", ""))
        members = piece[2]
        for i, c in enumerate(members):
            mark, style = row.mark(c)
            line.append(((" " if i else "") + mark.rjust(cell), style))
        line.append((" " * (_piece_width(piece, cell) - (len(members) * (cell + 1) - 1)), ""))
    return line


def matrix_lines(groups: list[Group], rows: list[MatrixRow], width: int) -> list[list[Segment]]:
    """The matrix of `rows` over the CPUs of `groups`, folded to `width` columns: for each block
    its NUMA, L3 and CPU lines, one line per row, then an empty line."""
    cell = max((len(str(c)) for _, _, cpus in groups for c in cpus), default=1)
    rows = [replace(r, label=terminal_safe(r.label)) for r in rows]
    label_w = max([len(r.label) for r in rows] + [len("NUMA"), len("CPU")])
    out: list[list[Segment]] = []
    for block in _fold(groups, cell, label_w, width):
        lines = _head_lines(block, cell, label_w) + [_row_line(r, block, cell, label_w) for r in rows]
        out.extend(line + [(" |", "")] for line in lines)
        out.append([])
    return out


def plain_text(lines: list[list[Segment]]) -> str:
    """The lines without their styles, each ended by a newline."""
    return "".join("".join(text for text, _ in line) + "\n" for line in lines)


def legend(marks: str) -> str:
    """One line saying what each of `marks` means, in that order."""
    return "   ".join(f"{m} {_MEANING[m]}" for m in marks)

"""A Machine as Prolog facts, the text the SKB loads into its system module.

The schema (names, arities and argument order are an interface: the SKB
depends on them):

    machine_name(Name).                        % atom
    package(PkgId, CpuList).
    numa_node(Node, MemBytes, CpuList).
    numa_free(Node, FreeBytes).                % only where known
    numa_bandwidth(Node, BytesPerS).           % only where known (STREAM-like triad)
    node_distance(From, To, Distance).
    core(CoreId, Package, Node, PuList).
    pu(Cpu, CoreId, Package, Node).            % online PUs
    pu_offline(Cpu).
    cache(Level, Type, SizeBytes, CpuList).    % Type: unified | data | instruction
    allowed_cpus(CpuList).                     % when known
    allowed_mems(NodeList).                    % when known
    total_memory(Bytes).

Every id is an OS number (see cod.facts.model).  Sizes are bytes.  A value the
source does not give is the atom ``unknown``.  One fact per line; predicates
in the order above, each sorted by its arguments, so equal machines give
byte-identical text.  Atoms, numbers and lists are written by the one writer,
:mod:`cod.protocol.prolog_text` (``atom`` is re-exported here).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

from cod.protocol.prolog_text import atom, compound

from .model import Machine

__all__ = ["UNKNOWN", "atom", "facts", "to_prolog"]

UNKNOWN = "unknown"
# The layout of this file: no space after a comma, as writeq writes (the text is byte-compared).
_fact = partial(compound, sep=",")


def _num(value: int | None) -> int | str:
    return UNKNOWN if value is None else int(value)


def _list(values: Iterable[int]) -> list[int]:
    return sorted(int(v) for v in values)


def _end(fact: str) -> str:
    return fact + "."


def facts(machine: Machine) -> list[str]:
    """The facts, one per element, each ending in '.'."""
    m = machine
    out = [_fact("machine_name", m.name)]
    out += [_fact("package", p.id, _list(p.cpus)) for p in sorted(m.packages, key=lambda p: p.id)]
    nodes = sorted(m.numa_nodes, key=lambda n: n.id)
    out += [_fact("numa_node", n.id, _num(n.memory_bytes), _list(n.cpus)) for n in nodes]
    out += [_fact("numa_free", n.id, n.free_bytes) for n in nodes if n.free_bytes is not None]
    out += [_fact("numa_bandwidth", n.id, n.bandwidth_bytes_per_s) for n in nodes
            if n.bandwidth_bytes_per_s is not None]
    out += [_fact("node_distance", n.id, to, d) for n in nodes for to, d in sorted(n.distances.items())]
    out += [_fact("core", c.id, _num(c.package), _num(c.numa_node), _list(c.pus))
            for c in sorted(m.cores, key=lambda c: c.id)]
    pus = sorted(m.pus, key=lambda p: p.id)
    out += [_fact("pu", p.id, p.core, _num(p.package), _num(p.numa_node)) for p in pus if p.online]
    out += [_fact("pu_offline", p.id) for p in pus if not p.online]
    out += [_fact("cache", c.level, c.type, _num(c.size_bytes), _list(c.cpus))
            for c in sorted(m.caches, key=lambda c: (c.level, c.type, c.cpus, c.size_bytes or 0))]
    if m.allowed_cpus is not None:
        out.append(_fact("allowed_cpus", _list(m.allowed_cpus)))
    if m.allowed_mems is not None:
        out.append(_fact("allowed_mems", _list(m.allowed_mems)))
    out.append(_fact("total_memory", _num(m.total_memory_bytes)))
    return [_end(f) for f in out]


def to_prolog(machine: Machine) -> str:
    """The fact text for ``machine`` (ends with a newline)."""
    return "\n".join(facts(machine)) + "\n"

"""The machine as the SKB holds it, rebuilt as a :class:`cod.facts.Machine`.

One query reads every hardware fact of docs/skb-schema.md (``pu/4``,
``core/4``, ``cache/4``, ``numa_node/3``, ``numa_bandwidth/2``, ...); :func:`machine_from_answer`
turns its answer back into the machine model that ``cod facts`` prints and
the allocator's view groups, so the shell shows the topology the daemon plans
on, through the code that made it.  No I/O here.
"""

from __future__ import annotations

from typing import Any

from cod.facts.model import PU, Cache, Core, Machine, NumaNode, Package
from cod.protocol.errors import CodError

TOPOLOGY_QUERY = (
    "( machine_name(Name) -> true ; Name = unknown ), "
    "findall(p(C, Co, P, N), pu(C, Co, P, N), Pus), "
    "findall(C, pu_offline(C), Offline), "
    "findall(c(Co, P, N, Ps), core(Co, P, N, Ps), Cores), "
    "findall(k(L, T, S, Cs), cache(L, T, S, Cs), Caches), "
    "findall(n(N, M, Cs), numa_node(N, M, Cs), Nodes), "
    "findall(f(N, F), numa_free(N, F), Free), "
    "findall(b(N, B), numa_bandwidth(N, B), Bandwidth), "
    "findall(d(A, B, D), node_distance(A, B, D), Distances), "
    "findall(k(P, Cs), package(P, Cs), Packages), "
    "( allowed_cpus(AllowedCpus) -> true ; AllowedCpus = unknown ), "
    "( allowed_mems(AllowedMems) -> true ; AllowedMems = unknown ), "
    "( total_memory(Total) -> true ; Total = unknown )"
)


class TopologyError(CodError, ValueError):
    """The SKB holds no usable hardware facts."""


def _args(term: Any) -> list[Any]:
    if not isinstance(term, dict) or "args" not in term:
        raise TopologyError(f"unexpected term in the SKB's answer: {term!r}")
    return list(term["args"])


def _opt_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def machine_from_answer(answer: dict[str, Any], source: str = "skb") -> Machine:
    """The Machine of one solution of :data:`TOPOLOGY_QUERY`."""
    pus_raw = answer.get("Pus") or []
    if not pus_raw:
        raise TopologyError("the SKB holds no CPUs (pu/4): no machine is loaded")
    free = {a[0]: a[1] for a in map(_args, answer.get("Free") or []) if isinstance(a[1], int)}
    bandwidth = {a[0]: a[1] for a in map(_args, answer.get("Bandwidth") or []) if isinstance(a[1], int)}
    distances: dict[int, dict[int, int]] = {}
    for a, b, d in map(_args, answer.get("Distances") or []):
        distances.setdefault(a, {})[b] = d
    pus = [PU(c, co, _opt_int(p), _opt_int(n)) for c, co, p, n in map(_args, pus_raw)]
    pus += [PU(c, c, None, None, online=False) for c in answer.get("Offline") or []]
    nodes = tuple(NumaNode(n, tuple(cs), _opt_int(m), free.get(n), distances.get(n, {}), bandwidth.get(n))
                  for n, m, cs in map(_args, answer.get("Nodes") or []))
    caches = tuple(Cache(lvl, str(kind), _opt_int(size), tuple(cs))
                   for lvl, kind, size, cs in map(_args, answer.get("Caches") or []))
    cores = tuple(Core(co, _opt_int(p), _opt_int(n), tuple(ps))
                  for co, p, n, ps in map(_args, answer.get("Cores") or []))
    packages = tuple(Package(p, tuple(cs)) for p, cs in map(_args, answer.get("Packages") or []))
    allowed_cpus = answer.get("AllowedCpus")
    allowed_mems = answer.get("AllowedMems")
    return Machine(
        name=str(answer.get("Name") or "unknown"),
        source=source,
        packages=tuple(sorted(packages, key=lambda p: p.id)),
        numa_nodes=tuple(sorted(nodes, key=lambda n: n.id)),
        caches=caches,
        cores=tuple(sorted(cores, key=lambda c: c.id)),
        pus=tuple(sorted(pus, key=lambda p: p.id)),
        allowed_cpus=tuple(allowed_cpus) if isinstance(allowed_cpus, list) else None,
        allowed_mems=tuple(allowed_mems) if isinstance(allowed_mems, list) else None,
        total_memory_bytes=_opt_int(answer.get("Total")),
    )

"""The machine model: one picture of the hardware that every part of COD shares.

Every id is the operating system's own number (see docs/skb-schema.md):

* a PU (hardware thread) is its Linux CPU number (hwloc's ``os_index``);
* a core's id is the lowest CPU number among its PUs;
* a NUMA node is its Linux node number;
* a package is its physical package id;
* a cache is identified by (level, type, lowest CPU number sharing it).

Logical indexes (hwloc's ``logical_index``, document order) never appear here.
The model is plain immutable data: readers in this package build it, the SKB
turns it into Prolog facts and the allocator reads it.  It holds no policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from cod.protocol.errors import CodError


@dataclass(frozen=True)
class Package:
    id: int
    cpus: tuple[int, ...]


@dataclass(frozen=True)
class NumaNode:
    id: int
    cpus: tuple[int, ...]
    memory_bytes: int | None
    free_bytes: int | None = None
    # Distance to every node of the machine, keyed by node id (SLIT units, 10 = local).
    distances: dict[int, int] = field(default_factory=dict)
    # Attainable local memory bandwidth (STREAM-like triad), bytes/s; None = not known.
    # Neither sysfs nor hwloc give it: it comes from a reference machine's file or a
    # measurement (`cod bandwidth`).  The plan deployment's phase 3 packs by it.
    bandwidth_bytes_per_s: int | None = None


@dataclass(frozen=True)
class Cache:
    level: int
    type: str  # "unified" | "data" | "instruction"
    size_bytes: int | None
    cpus: tuple[int, ...]

    @property
    def id(self) -> tuple[int, str, int]:
        return (self.level, self.type, self.cpus[0] if self.cpus else -1)


@dataclass(frozen=True)
class Core:
    id: int  # lowest CPU number among its PUs
    package: int | None
    numa_node: int | None
    pus: tuple[int, ...]


@dataclass(frozen=True)
class PU:
    id: int  # Linux CPU number
    core: int
    package: int | None
    numa_node: int | None
    online: bool = True


@dataclass(frozen=True)
class Machine:
    """A whole machine: what exists, plus what this process may use."""

    name: str
    source: str  # where the picture came from: "sysfs:/", "hwloc:FILE", "machine:NAME"
    packages: tuple[Package, ...]
    numa_nodes: tuple[NumaNode, ...]
    caches: tuple[Cache, ...]
    cores: tuple[Core, ...]
    pus: tuple[PU, ...]
    # CPUs and memory nodes this process is allowed to use (cpuset / container);
    # None means "everything online".
    allowed_cpus: tuple[int, ...] | None = None
    allowed_mems: tuple[int, ...] | None = None
    total_memory_bytes: int | None = None

    # ---- derived views -------------------------------------------------
    def cpu_ids(self) -> tuple[int, ...]:
        """Online CPUs this process may use, ascending."""
        allowed = None if self.allowed_cpus is None else set(self.allowed_cpus)
        return tuple(
            pu.id for pu in self.pus if pu.online and (allowed is None or pu.id in allowed)
        )

    def restricted(self) -> "Machine":
        """The machine as this process may use it: disallowed PUs and NUMA nodes left out.

        hwloc's tools show a topology this way by default (an export made inside a
        container or a restricted cpuset); ``--whole-system`` keeps everything, with the
        allowed sets marking what may be used."""
        if self.allowed_cpus is None and self.allowed_mems is None:
            return self
        cpus = set(self.cpu_ids())
        nodes = None if self.allowed_mems is None else set(self.allowed_mems)

        def keep(ids: tuple[int, ...]) -> tuple[int, ...]:
            return tuple(c for c in ids if c in cpus)

        kept_nodes = tuple(
            replace(n, cpus=keep(n.cpus), distances={k: v for k, v in n.distances.items()
                                                     if nodes is None or k in nodes})
            for n in self.numa_nodes if nodes is None or n.id in nodes)
        node_ids = {n.id for n in kept_nodes}
        return replace(
            self,
            packages=tuple(replace(p, cpus=keep(p.cpus)) for p in self.packages if keep(p.cpus)),
            numa_nodes=kept_nodes,
            caches=tuple(replace(c, cpus=keep(c.cpus)) for c in self.caches if keep(c.cpus)),
            cores=tuple(replace(c, id=min(keep(c.pus)), pus=keep(c.pus)) for c in self.cores if keep(c.pus)),
            pus=tuple(replace(pu, numa_node=pu.numa_node if pu.numa_node in node_ids else None)
                      for pu in self.pus if pu.id in cpus),
            allowed_cpus=None,
            allowed_mems=None,
            total_memory_bytes=(sum(n.memory_bytes for n in kept_nodes if n.memory_bytes is not None)
                                or self.total_memory_bytes),
        )

    def node_of_cpu(self) -> dict[int, int | None]:
        return {pu.id: pu.numa_node for pu in self.pus}

    def l3_caches(self) -> tuple[Cache, ...]:
        return tuple(c for c in self.caches if c.level == 3 and c.type in ("unified", "data"))

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape of `cod facts --format json` (documented in docs/skb-schema.md)."""
        return {
            "name": self.name,
            "source": self.source,
            "total_memory_bytes": self.total_memory_bytes,
            "allowed_cpus": list(self.allowed_cpus) if self.allowed_cpus is not None else None,
            "allowed_mems": list(self.allowed_mems) if self.allowed_mems is not None else None,
            "packages": [{"id": p.id, "cpus": list(p.cpus)} for p in self.packages],
            "numa_nodes": [
                {
                    "id": n.id,
                    "cpus": list(n.cpus),
                    "memory_bytes": n.memory_bytes,
                    "free_bytes": n.free_bytes,
                    "distances": {str(k): v for k, v in sorted(n.distances.items())},
                    "bandwidth_bytes_per_s": n.bandwidth_bytes_per_s,
                }
                for n in self.numa_nodes
            ],
            "caches": [
                {"level": c.level, "type": c.type, "size_bytes": c.size_bytes, "cpus": list(c.cpus)}
                for c in self.caches
            ],
            "cores": [
                {"id": c.id, "package": c.package, "numa_node": c.numa_node, "pus": list(c.pus)}
                for c in self.cores
            ],
            "pus": [
                {
                    "id": p.id,
                    "core": p.core,
                    "package": p.package,
                    "numa_node": p.numa_node,
                    "online": p.online,
                }
                for p in self.pus
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Machine":
        """Inverse of :meth:`to_dict`; used for the reference machines in facts/machines/."""

        def opt_tuple(v: Any) -> tuple[int, ...] | None:
            return None if v is None else tuple(int(x) for x in v)

        return cls(
            name=str(data["name"]),
            source=str(data.get("source", "dict")),
            total_memory_bytes=data.get("total_memory_bytes"),
            allowed_cpus=opt_tuple(data.get("allowed_cpus")),
            allowed_mems=opt_tuple(data.get("allowed_mems")),
            packages=tuple(Package(int(p["id"]), tuple(p["cpus"])) for p in data["packages"]),
            numa_nodes=tuple(
                NumaNode(
                    id=int(n["id"]),
                    cpus=tuple(n["cpus"]),
                    memory_bytes=n.get("memory_bytes"),
                    free_bytes=n.get("free_bytes"),
                    distances={int(k): int(v) for k, v in (n.get("distances") or {}).items()},
                    bandwidth_bytes_per_s=(None if n.get("bandwidth_bytes_per_s") is None
                                           else int(n["bandwidth_bytes_per_s"])),
                )
                for n in data["numa_nodes"]
            ),
            caches=tuple(
                Cache(int(c["level"]), str(c["type"]), c.get("size_bytes"), tuple(c["cpus"]))
                for c in data["caches"]
            ),
            cores=tuple(
                Core(int(c["id"]), c.get("package"), c.get("numa_node"), tuple(c["pus"]))
                for c in data["cores"]
            ),
            pus=tuple(
                PU(
                    int(p["id"]),
                    int(p["core"]),
                    p.get("package"),
                    p.get("numa_node"),
                    bool(p.get("online", True)),
                )
                for p in data["pus"]
            ),
        )


class FactsError(CodError):
    """Discovery or import failed; the message names the file and what was wrong."""

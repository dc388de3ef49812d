"""Task and result types of the global allocator.

The unit of allocation is the hardware thread: every "core" below is a Linux
CPU number (a PU of :mod:`cod.facts.model`).  These types are plain immutable
data shared by the RM daemon, ``cod plan`` and the solvers.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from cod.protocol.errors import CodError

BOUNDS = ("cpu", "memory")
SENSITIVITIES = ("numa", "cache")
LOCALITIES = ("strong", "moderate", "weak")  # MCC-DB's locality strengths (cod.rm.allocator.locality)
STATUSES = ("optimal", "feasible", "fallback", "infeasible")
SOLVERS = ("cpsat", "naive", "greedy")


class TaskSpecError(CodError, ValueError):
    """A task description is invalid; the message names the task and the key."""


class RepairError(CodError, RuntimeError):
    """The incremental repair of the last allocation failed: a bug, not bad input; the full
    solve can still answer (the daemon's allocator runner does so)."""


@dataclass(frozen=True)
class TaskSpec:
    """What one task asks for.  Every field but ``name`` has a default.

    * ``min_cores``: CPUs the task must get or it is not admitted (>= 1).
    * ``max_cores``: CPUs it can use at most; None = as many as the machine has.
    * ``working_set_bytes``: memory per CPU, placed on the NUMA node of that CPU.
    * ``bound``: "cpu" or "memory"; carried for the RM (memory policy); the
      placement itself does not depend on it.
    * ``sensitive``: subset of {"numa", "cache"}: spread over as few NUMA nodes /
      L3 domains as possible, and ("cache") never share an L3 domain with a
      task that ``pollutes_cache``.
    * ``exclusive``: no other task on its CPUs.  Non-exclusive tasks may share
      CPUs with each other, never with exclusive ones.
    * ``priority``: higher priorities get their cores up to ``max_cores`` first.
    * ``allow_smt_sharing``: for an exclusive task, whether the SMT siblings of
      its CPUs may go to other tasks (default: they stay idle).
    * ``locality``: None or MCC-DB's strength of its cache locality, "strong",
      "moderate" or "weak"; the allocator keeps weak ones off the L3 domains of
      the others when it can (SLS, :mod:`.locality`), and sizes cache partitions
      by it where resctrl exists (MLS, :mod:`.cachepart`).
    """

    name: str
    min_cores: int = 1
    max_cores: int | None = None
    working_set_bytes: int = 0
    bound: str = "cpu"
    sensitive: frozenset[str] = frozenset()
    exclusive: bool = True
    priority: int = 0
    pollutes_cache: bool = False
    allow_smt_sharing: bool = False
    locality: str | None = None

    def __post_init__(self) -> None:
        def bad(key: str, why: str) -> TaskSpecError:
            return TaskSpecError(f"task {self.name!r}: {key}: {why}")

        if not isinstance(self.name, str) or not self.name:
            raise TaskSpecError(f"task {self.name!r}: name: must be a non-empty string")
        if not _is_int(self.min_cores) or self.min_cores < 1:
            raise bad("min_cores", f"must be an integer >= 1, got {self.min_cores!r}")
        if self.max_cores is not None:
            if not _is_int(self.max_cores) or self.max_cores < 1:
                raise bad("max_cores", f"must be an integer >= 1 or null, got {self.max_cores!r}")
            if self.max_cores < self.min_cores:
                raise bad("max_cores", f"{self.max_cores} is below min_cores {self.min_cores}")
        if not _is_int(self.working_set_bytes) or self.working_set_bytes < 0:
            raise bad("working_set_bytes", f"must be an integer >= 0, got {self.working_set_bytes!r}")
        if self.bound not in BOUNDS:
            raise bad("bound", f"must be one of {', '.join(BOUNDS)}, got {self.bound!r}")
        if not isinstance(self.sensitive, frozenset):
            object.__setattr__(self, "sensitive", frozenset(self.sensitive))
        unknown = sorted(str(s) for s in self.sensitive if s not in SENSITIVITIES)
        if unknown:
            raise bad("sensitive", f"unknown {', '.join(unknown)}; allowed: {', '.join(SENSITIVITIES)}")
        for key in ("exclusive", "pollutes_cache", "allow_smt_sharing"):
            if not isinstance(getattr(self, key), bool):
                raise bad(key, f"must be true or false, got {getattr(self, key)!r}")
        if not _is_int(self.priority):
            raise bad("priority", f"must be an integer, got {self.priority!r}")
        if self.locality is not None and self.locality not in LOCALITIES:
            raise bad("locality", f"must be one of {', '.join(LOCALITIES)}, got {self.locality!r}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TaskSpec":
        """Strict: unknown keys or bad values raise TaskSpecError naming task and key."""
        if not isinstance(d, dict):
            raise TaskSpecError(f"task: must be a table/object, got {type(d).__name__}")
        name = d.get("name")
        if not isinstance(name, str) or not name:
            raise TaskSpecError(f"task {name!r}: name: required, a non-empty string")
        known = {f.name for f in fields(cls)}
        unknown = sorted(k for k in d if k not in known)
        if unknown:
            raise TaskSpecError(
                f"task {name!r}: unknown key {unknown[0]!r}; known keys: {', '.join(sorted(known))}"
            )
        args = dict(d)
        if "sensitive" in args:
            sens = args["sensitive"]
            if isinstance(sens, str) or not isinstance(sens, (list, tuple, set, frozenset)):
                raise TaskSpecError(f"task {name!r}: sensitive: must be a list, got {sens!r}")
            if not all(isinstance(s, str) for s in sens):
                raise TaskSpecError(f"task {name!r}: sensitive: must be a list of strings")
            args["sensitive"] = frozenset(sens)
        return cls(**args)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["sensitive"] = sorted(self.sensitive)
        if d.get("locality", 0) is None:
            del d["locality"]  # absent, as before the property existed
        return d


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _cpu_tuple(name: str, key: str, v: Any) -> tuple[int, ...]:
    if isinstance(v, (str, bytes)) or not isinstance(v, (list, tuple, set, frozenset)) \
            or not all(_is_int(c) and c >= 0 for c in v):
        raise TaskSpecError(f"other {name!r}: {key}: must be a list of CPU numbers, got {v!r}")
    return tuple(sorted(set(v)))


@dataclass(frozen=True)
class OtherDemand:
    """An unregistered busy process (a "newcomer") the allocator keeps CPUs for.

    * ``name``: how results and explanations name it, e.g. ``"other.1234"``.
    * ``cores``: CPUs it keeps busy (>= 1); it gets them exclusively.
    * ``cpus``: the CPUs it runs on now (moving it elsewhere costs, but less
      than moving a registered task).
    * ``allowed``: the CPUs it may be confined to (None: any).  Counted per
      core: a core some of whose PUs are not allowed is not offered to it.
    """

    name: str
    cores: int = 1
    cpus: tuple[int, ...] = ()
    allowed: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise TaskSpecError(f"other {self.name!r}: name: must be a non-empty string")
        if not _is_int(self.cores) or self.cores < 1:
            raise TaskSpecError(f"other {self.name!r}: cores: must be an integer >= 1, got {self.cores!r}")
        object.__setattr__(self, "cpus", _cpu_tuple(self.name, "cpus", self.cpus))
        if self.allowed is not None:
            object.__setattr__(self, "allowed", _cpu_tuple(self.name, "allowed", self.allowed))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "OtherDemand":
        """Strict: unknown keys or bad values raise TaskSpecError naming the process and key."""
        if not isinstance(d, dict):
            raise TaskSpecError(f"other: must be a table/object, got {type(d).__name__}")
        name = d.get("name")
        if not isinstance(name, str) or not name:
            raise TaskSpecError(f"other {name!r}: name: required, a non-empty string")
        known = {f.name for f in fields(cls)}
        unknown = sorted(k for k in d if k not in known)
        if unknown:
            raise TaskSpecError(
                f"other {name!r}: unknown key {unknown[0]!r}; known keys: {', '.join(sorted(known))}")
        return cls(**d)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "cores": self.cores, "cpus": list(self.cpus),
                "allowed": None if self.allowed is None else list(self.allowed)}


@dataclass(frozen=True)
class TaskAllocation:
    name: str
    cores: tuple[int, ...]  # CPU numbers, ascending
    numa_nodes: tuple[int, ...]  # NUMA nodes of those CPUs, ascending
    binding: tuple[str, ...]  # constraints that limited this task, e.g. "max", "memory of node 3"
    # unregistered processes (OtherDemand names) that took CPUs this task held
    # in the current allocation: the reason of its upcall
    displaced_by: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = {
            "name": self.name,
            "cores": list(self.cores),
            "numa_nodes": list(self.numa_nodes),
            "binding": list(self.binding),
        }
        if self.displaced_by:
            d["displaced_by"] = list(self.displaced_by)
        return d


@dataclass(frozen=True)
class Reservation:
    """CPUs kept for one unregistered busy process (an :class:`OtherDemand`)."""

    name: str
    cpus: tuple[int, ...]  # ascending; fewer than ``wanted`` when registered tasks' min_cores need the rest
    wanted: int
    moved: bool  # it does not run on all of these now: confine it there
    binding: tuple[str, ...]  # why it got fewer or different CPUs, e.g. "min_cores of T"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "cpus": list(self.cpus), "wanted": self.wanted, "moved": self.moved,
                "binding": list(self.binding)}


@dataclass(frozen=True)
class AllocationResult:
    status: str  # "optimal" | "feasible" | "fallback" | "infeasible"
    solver: str  # "cpsat" | "naive" | "greedy": the one that produced the tasks
    solve_ms: float  # model build plus solve
    tasks: tuple[TaskAllocation, ...]
    reason: str | None = None  # for infeasible: which task and why
    # for "feasible": the solver's relative gap on the objective term it was
    # still improving when the time limit hit (see cod.rm.allocator.cpsat)
    gap: float | None = None
    # CPUs kept for unregistered busy processes (the ``others`` of allocate)
    reservations: tuple[Reservation, ...] = ()
    # how the answer was found and proven, e.g. "packing = relaxation bound"
    # (for benchmarks and debugging; not part of to_dict)
    via: str = ""
    # what the allocator did about cache locality, and why (SLS, cod.rm.allocator.locality)
    cache_policy: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = {
            "status": self.status,
            "solver": self.solver,
            "solve_ms": round(self.solve_ms, 3),
            "tasks": [t.to_dict() for t in self.tasks],
            "reason": self.reason,
        }
        if self.gap is not None:
            d["gap"] = round(self.gap, 6)
        if self.reservations:
            d["reservations"] = [r.to_dict() for r in self.reservations]
        if self.cache_policy:
            d["cache_policy"] = self.cache_policy
        return d

    def reserved_cpus(self) -> tuple[int, ...]:
        """Every CPU kept for unregistered processes, ascending."""
        return tuple(sorted({c for r in self.reservations for c in r.cpus}))

    def cores_of(self, name: str) -> tuple[int, ...]:
        for t in self.tasks:
            if t.name == name:
                return t.cores
        raise KeyError(f"no task named {name!r} in this allocation")

    def as_mapping(self) -> dict[str, tuple[int, ...]]:
        """{task: cpus}: the shape ``allocate(current=...)`` takes back."""
        return {t.name: t.cores for t in self.tasks}

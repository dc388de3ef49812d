"""Import of hwloc XML topology exports (v1 and v2 formats) into a Machine.

What we take from the file, all keyed by OS numbers (``os_index``), never by
hwloc's logical indexes:

* PUs (os_index), Cores (named by their lowest PU), Packages (os_index, or the
  lowest PU when the file has none), L1-L5 CPU caches (MemCache is a memory-side
  cache and is not a CPU cache);
* NUMA nodes: a tree level in v1, memory children in v2 (possibly under a
  MemCache); a node's CPUs are its ``cpuset``; memory from ``local_memory``
  (None when absent);
* the NUMA latency matrix: v1 ``<distances>`` (objects at ``relative_depth``
  below the holder, in document order, times ``latency_base``) or v2
  ``<distances2 type="NUMANode">`` indexed by os or gp index.

I/O objects (Bridge, PCIDev, OSDev) and Misc are skipped.  Everything else the
file says (info strings, memattrs, cpukinds) is not needed by the planner.

The file is a user's input (docs/security.md): read up to
:data:`~cod.facts.user_input.MAX_INPUT_BYTES`, parsed by defusedxml (no entity
declarations, no external references) down to
:data:`~cod.facts.user_input.MAX_NESTING` elements, and its numbers are held to
what hwloc writes: os_index an unsigned 32-bit number (0xffffffff: none), unique
among the PUs, the packages and the NUMA nodes; sizes and indexes unsigned 64-bit.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import DefusedXMLParser

from .cpulist import parse_hwloc_bitmap
from .model import PU, Cache, Core, FactsError, Machine, NumaNode, Package
from .user_input import MAX_NESTING, InputError, read_bytes

_SKIPPED_TYPES = {"Bridge", "PCIDev", "OSDev", "Misc"}
_V1_CACHE_TYPES = {0: "unified", 1: "data", 2: "instruction"}
_UNKNOWN_OS_INDEX = {4294967295, -1}  # hwloc's (unsigned)-1 for "no OS number"
# The largest value of each integer attribute we read: hwloc writes them unsigned, os_index in 32 bits.
_INT_MAX = {"os_index": (1 << 32) - 1}
_U64_MAX = (1 << 64) - 1


@dataclass(slots=True)
class _Obj:
    type: str
    attrs: dict[str, str]  # the element's own attribute dict (not copied)
    depth: int  # depth in the normal tree (v1 relative_depth counts this)
    children: list["_Obj"] = field(default_factory=list)
    pus: set[int] = field(default_factory=set)  # PU os indexes below (filled bottom-up)
    element: ET.Element | None = None


class _Reader:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.objects: list[_Obj] = []
        self.pu_ids: set[int] = set()

    def error(self, what: str) -> FactsError:
        return FactsError(f"{self.path}: {what}")

    @staticmethod
    def named(obj: _Obj) -> str:
        """``NUMANode object (os_index 3)``: the object, by its os_index where it has a plain one."""
        os_index = obj.attrs.get("os_index", "")
        plain = os_index.isascii() and os_index.isdigit() and len(os_index) <= 10
        return f"{obj.type} object" + (f" (os_index {os_index})" if plain else "")

    def int_attr(self, obj: _Obj, name: str) -> int | None:
        raw = obj.attrs.get(name)
        if raw is None:
            return None
        try:
            value = int(raw)
        except ValueError:
            raise self.error(f"{obj.type} object: attribute {name}={raw!r} is not an integer") \
                from None
        if value in _UNKNOWN_OS_INDEX and name == "os_index":
            return None
        if value < 0:
            raise self.error(f"{self.named(obj)}: attribute {name}={raw!r} is negative")
        if value > _INT_MAX.get(name, _U64_MAX):
            raise self.error(f"{self.named(obj)}: attribute {name}={raw!r} is out of range "
                             f"(at most {_INT_MAX.get(name, _U64_MAX)})")
        return value

    def bitmap_attr(self, obj: _Obj, name: str) -> tuple[set[int], bool] | None:
        raw = obj.attrs.get(name)
        if raw is None:
            return None
        try:
            bits, infinite = parse_hwloc_bitmap(raw)
        except ValueError as err:
            raise self.error(f"{obj.type} object: attribute {name}: {err}") from None
        return set(bits), infinite

    # ---- the object tree ---------------------------------------------------------
    def build(self, element: ET.Element, depth: int) -> _Obj:
        kind = element.get("type")
        if kind is None:
            raise self.error("<object> without a type attribute")
        obj = _Obj(kind, element.attrib, depth, element=element)
        self.objects.append(obj)  # document order, for one flat pass later
        for child in element:
            if child.tag != "object" or child.get("type") in _SKIPPED_TYPES:
                continue
            # Depth only matters in v1, where every object is a tree level
            # (I/O and Misc are skipped above, as hwloc's levels skip them).
            sub = self.build(child, depth + 1)
            obj.children.append(sub)
            if sub.pus:
                obj.pus |= sub.pus
        if kind == "PU":
            os_index = self.int_attr(obj, "os_index")
            if os_index is None:
                raise self.error("PU object without os_index")
            if os_index in self.pu_ids:
                raise self.error(f"two PU objects with os_index {os_index}")
            self.pu_ids.add(os_index)
            obj.pus.add(os_index)
        return obj

    v1 = False
    topology: ET.Element | None = None



def _walk(obj: _Obj):
    """``obj`` and everything below it, in document order."""
    stack = [obj]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(reversed(current.children))


# hwloc's CPU cache types: level, and "instruction" for the L*i ones (None: read cache_type).
_CACHE_NAMES: dict[str, tuple[int, str | None]] = {
    **{f"L{level}Cache": (level, None) for level in range(1, 6)},
    **{f"L{level}iCache": (level, "instruction") for level in range(1, 4)},
}


def _cache_kind(reader: _Reader, obj: _Obj) -> tuple[int, str] | None:
    """(level, type) for a CPU cache object, None for anything else."""
    if obj.type == "Cache":  # v1: one type, level in depth, kind in cache_type
        level = reader.int_attr(obj, "depth")
        if level is None:
            raise reader.error("Cache object without depth (cache level)")
    else:
        known = _CACHE_NAMES.get(obj.type)
        if known is None:
            return None
        level, fixed = known
        if fixed is not None:
            return level, fixed
    code = reader.int_attr(obj, "cache_type") or 0
    kind = _V1_CACHE_TYPES.get(code)
    if kind is None:
        raise reader.error(f"{obj.type} object: unknown cache_type {code}")
    return level, kind


def load(path: str | Path) -> Machine:
    """Read an hwloc XML export (v1 or v2) into a Machine."""
    path = Path(path)
    reader = _Reader(path)
    top = _topology_element(path)
    version = top.get("version")
    reader.v1 = version is None or version.startswith("1.")
    reader.topology = top
    machine_el = next((c for c in top if c.tag == "object"), None)
    if machine_el is None:
        raise FactsError(f"{path}: <topology> holds no <object>: empty or truncated export")
    root = reader.build(machine_el, 0)
    if not root.pus:
        raise FactsError(f"{path}: topology has no PU object")
    all_pus = root.pus
    found = _sort_objects(reader, all_pus)

    # Cores: Core objects; a PU without one is its own core (one id space either way).
    core_of: dict[int, int] = {}
    for pus in found.core_sets:
        for pu in pus:
            core_of[pu] = min(pus)
    for pu in all_pus:
        core_of.setdefault(pu, pu)

    nodes = _numa_nodes(reader, root, found.node_objs, all_pus)
    node_of: dict[int, int] = {}
    for node in sorted(nodes, key=lambda n: n.id):
        for cpu in node.cpus:
            node_of.setdefault(cpu, node.id)

    core_pus: dict[int, list[int]] = {}
    for pu in sorted(all_pus):
        core_pus.setdefault(core_of[pu], []).append(pu)

    allowed_cpus, allowed_mems = _allowed_sets(reader, root, all_pus, {n.id for n in nodes})
    memories = [n.memory_bytes for n in nodes]
    total = sum(m for m in memories if m is not None) if memories and None not in memories \
        else reader.int_attr(root, "local_memory")
    pkg_of = found.pkg_of
    return Machine(
        name=path.name.removesuffix(".xml"),
        source=f"hwloc:{path}",
        packages=tuple(Package(p, tuple(sorted(c))) for p, c in sorted(found.packages.items())),
        numa_nodes=tuple(sorted(nodes, key=lambda n: n.id)),
        caches=tuple(sorted(found.caches, key=lambda c: (c.level, c.type, c.cpus))),
        cores=tuple(Core(cid, pkg_of.get(pus[0]), node_of.get(pus[0]), tuple(pus))
                    for cid, pus in sorted(core_pus.items())),
        pus=tuple(PU(pu, core_of[pu], pkg_of.get(pu), node_of.get(pu)) for pu in sorted(all_pus)),
        allowed_cpus=allowed_cpus,
        allowed_mems=allowed_mems,
        total_memory_bytes=total,
    )


class _DepthBoundTree(ET.TreeBuilder):
    """ElementTree's tree builder, refusing elements nested deeper than MAX_NESTING (the
    object tree is read recursively)."""

    depth = 0

    def start(self, tag: str, attrs: dict[str, str]) -> ET.Element:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise InputError(f"elements nested deeper than {MAX_NESTING} levels")
        return super().start(tag, attrs)

    def end(self, tag: str) -> ET.Element:
        self.depth -= 1
        return super().end(tag)


def _topology_element(path: Path) -> ET.Element:
    """The export's <topology> element; a FactsError that names the file for anything else."""
    try:
        data = read_bytes(path)
        parser = DefusedXMLParser(target=_DepthBoundTree())
        parser.feed(data)
        top = parser.close()
    except FileNotFoundError:
        raise FactsError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise FactsError(f"{path}: is a directory, not an hwloc XML file") from None
    except OSError as err:
        raise FactsError(f"{path}: cannot read: {err.strerror or err}") from None
    except InputError as err:
        raise FactsError(f"{path}: {err}") from None
    except DefusedXmlException as err:
        raise FactsError(f"{path}: refused: {err}: an hwloc export declares no entities "
                         "and refers to no other file") from None
    except ET.ParseError as err:
        raise FactsError(f"{path}: not well-formed XML ({err})") from None
    if top.tag != "topology":
        raise FactsError(f"{path}: not an hwloc topology: root element is <{top.tag}>, "
                         "expected <topology>")
    return top


@dataclass
class _Found:
    """The objects of an export that make up a Machine, sorted by kind."""

    packages: dict[int, set[int]] = field(default_factory=dict)  # package id -> its PUs
    pkg_of: dict[int, int] = field(default_factory=dict)  # PU -> package id
    core_sets: list[set[int]] = field(default_factory=list)  # the PUs of each Core object
    caches: list[Cache] = field(default_factory=list)
    node_objs: list[_Obj] = field(default_factory=list)


def _sort_objects(reader: _Reader, all_pus: set[int]) -> _Found:
    found = _Found()
    package_ids: set[int] = set()
    for obj in reader.objects:
        if obj.type in ("Package", "Socket"):
            os_index = reader.int_attr(obj, "os_index")
            if os_index is not None and os_index in package_ids:
                raise reader.error(f"two {obj.type} objects with os_index {os_index}")
            if os_index is not None:
                package_ids.add(os_index)
            pid = os_index if os_index is not None else min(obj.pus, default=-1)
            if obj.pus:
                found.packages.setdefault(pid, set()).update(obj.pus)
                for pu in obj.pus:
                    found.pkg_of[pu] = pid
        elif obj.type == "Core":
            if obj.pus:
                found.core_sets.append(obj.pus)
        elif obj.type == "NUMANode":
            found.node_objs.append(obj)
        else:
            kind = _cache_kind(reader, obj)
            if kind is not None:
                # A CPU cache's CPUs are the PUs below it (cheaper than its cpuset).
                cpus = sorted(obj.pus) if obj.pus else _cpus_of(reader, obj, all_pus)
                if cpus:
                    found.caches.append(Cache(kind[0], kind[1],
                                              reader.int_attr(obj, "cache_size"), tuple(cpus)))
    return found


def _allowed_sets(reader: _Reader, root: _Obj, all_pus: set[int],
                  node_ids: set[int]) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """The CPUs and nodes the export's allowed sets keep, None for a set that keeps them all."""
    allowed = reader.bitmap_attr(root, "allowed_cpuset")
    allowed_cpus = None
    if allowed is not None and not allowed[1] and not all_pus <= allowed[0]:
        allowed_cpus = tuple(sorted(allowed[0] & all_pus))
    allowed_nodes = reader.bitmap_attr(root, "allowed_nodeset")
    allowed_mems = None
    if allowed_nodes is not None and not allowed_nodes[1] and not node_ids <= allowed_nodes[0]:
        allowed_mems = tuple(sorted(allowed_nodes[0] & node_ids))
    return allowed_cpus, allowed_mems


def _cpus_of(reader: _Reader, obj: _Obj, all_pus: set[int]) -> list[int]:
    """An object's CPUs: its cpuset (NUMA nodes have no PU children), else PUs below."""
    bitmap = reader.bitmap_attr(obj, "cpuset")
    if bitmap is None:
        return sorted(obj.pus)
    bits, infinite = bitmap
    return sorted(all_pus if infinite and not bits else bits & all_pus)


def _numa_nodes(reader: _Reader, root: _Obj, node_objs: list[_Obj],
                all_pus: set[int]) -> list[NumaNode]:
    if not node_objs:
        # A v1 export of a non-NUMA machine: hwloc imports it as one node 0.
        return [NumaNode(0, tuple(sorted(all_pus)), reader.int_attr(root, "local_memory"),
                         None, {0: 10})]
    ids: list[int] = []
    by_gp: dict[int, int] = {}
    result: list[NumaNode] = []
    for obj in node_objs:
        node = reader.int_attr(obj, "os_index")
        if node is None:
            raise reader.error("NUMANode object without os_index")
        if node in ids:
            raise reader.error(f"two NUMANode objects with os_index {node}")
        ids.append(node)
        gp = reader.int_attr(obj, "gp_index")
        if gp is not None:
            by_gp[gp] = node
    matrix = _distances_v1(reader, root, node_objs) if reader.v1 else \
        _distances_v2(reader, by_gp, set(ids))
    for obj, node in zip(node_objs, ids):
        result.append(NumaNode(
            id=node,
            cpus=tuple(_cpus_of(reader, obj, all_pus)),
            memory_bytes=reader.int_attr(obj, "local_memory"),
            free_bytes=None,
            distances=matrix.get(node, {}),
        ))
    return result


def _distances_v1(reader: _Reader, root: _Obj,
                  node_objs: list[_Obj]) -> dict[int, dict[int, int]]:
    """v1: ``<distances>`` in some object; pick the one whose objects are NUMA nodes."""
    for holder in _walk(root):
        assert holder.element is not None
        for el in holder.element.findall("distances"):
            try:
                n = int(el.get("nbobjs", ""))
                rel = int(el.get("relative_depth", ""))
                base = float(el.get("latency_base", "1"))
                values = [float(lat.get("value", "")) for lat in el.findall("latency")]
            except ValueError:
                raise reader.error("<distances> with a non-numeric attribute or value") from None
            targets = [o for o in _walk(holder) if o.depth == holder.depth + rel]
            if not targets or any(o.type != "NUMANode" for o in targets):
                continue  # a matrix between packages, cores or PUs: not ours
            if not all(math.isfinite(v) and v >= 0 for v in [base, *values]):
                raise reader.error("<distances>: a latency that is negative or not a finite number")
            if len(targets) != n or len(values) != n * n:
                raise reader.error(f"<distances nbobjs={n}> holds {len(values)} values for "
                                   f"{len(targets)} NUMA nodes")
            os_ids = [reader.int_attr(o, "os_index") for o in targets]
            return {a: {b: round(values[i * n + j] * base) for j, b in enumerate(os_ids)}
                    for i, a in enumerate(os_ids) if a is not None}
    return {}


def _distances_v2(reader: _Reader, by_gp: dict[int, int],
                  node_ids: set[int]) -> dict[int, dict[int, int]]:
    """v2: the first ``<distances2 type="NUMANode">`` latency matrix."""
    assert reader.topology is not None
    for el in reader.topology.findall("distances2"):
        if el.get("type") != "NUMANode":
            continue
        try:
            kind = int(el.get("kind", "0"))
            n = int(el.get("nbobjs", ""))
        except ValueError:
            raise reader.error("<distances2> with a non-numeric kind or nbobjs") from None
        if kind & 8 and not kind & 4:
            continue  # a bandwidth matrix, not latency
        try:
            indexes = [int(v) for part in el.findall("indexes") for v in (part.text or "").split()]
            values = [int(v) for part in el.findall("u64values")
                      for v in (part.text or "").split()]
        except ValueError:
            raise reader.error("<distances2 type=\"NUMANode\">: non-integer index or value") \
                from None
        if any(v < 0 for v in indexes + values):
            raise reader.error("<distances2 type=\"NUMANode\">: a negative index or value")
        if len(indexes) != n or len(values) != n * n:
            raise reader.error(f"<distances2 type=\"NUMANode\" nbobjs={n}>: {len(indexes)} "
                               f"indexes and {len(values)} values")
        if el.get("indexing", "os") == "gp":
            try:
                indexes = [by_gp[g] for g in indexes]
            except KeyError as err:
                raise reader.error(f"<distances2>: gp_index {err} is no NUMA node") from None
        unknown = set(indexes) - node_ids
        if unknown:
            raise reader.error(f"<distances2>: NUMA node(s) {sorted(unknown)} not in the "
                               "topology")
        return {a: {b: values[i * n + j] for j, b in enumerate(indexes)}
                for i, a in enumerate(indexes)}
    return {}

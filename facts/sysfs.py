"""Discovery of a machine from Linux sysfs and procfs.

Reads only below a root directory, so the same code reads this machine
(root ``/``) and a copied tree (hwloc-gather-topology snapshots, tests):

* ``sys/devices/system/cpu``: which CPUs exist and are online, their topology
  (package, core, thread siblings) and their caches (``cpuN/cache/index*``);
* ``sys/devices/system/node``: NUMA nodes, their CPUs, memory and distances;
* ``proc/meminfo``: total memory (and the one node of a non-NUMA kernel);
* ``proc/self/status``: the CPUs and memory nodes this process may use
  (``Cpus_allowed_list``/``Mems_allowed_list``), so a daemon in a cpuset or a
  container sees what it may use, not what the host has.

Missing files give a smaller picture (no caches, one node, no package ids);
files with garbage raise :class:`FactsError` naming the file.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

from .cpulist import parse_cpulist, parse_cpumask
from .model import PU, Cache, Core, FactsError, Machine, NumaNode, Package

_CPU_DIR = re.compile(r"^cpu(\d+)$")
_NODE_DIR = re.compile(r"^node(\d+)$")
_INDEX_DIR = re.compile(r"^index(\d+)$")
_CACHE_TYPES = {"unified": "unified", "data": "data", "instruction": "instruction"}
_SIZE = re.compile(r"^(\d+)\s*([KMG]?)$")
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


class _Path(str):
    """A path as a plain string: pathlib's joins cost more than the reads on a
    384-CPU tree (thousands of small files), and this is the hot loop."""

    __slots__ = ()

    def __truediv__(self, name: str) -> "_Path":
        return _Path(f"{self}{name}" if self.endswith("/") else f"{self}/{name}")


# ---- small readers: None when the file is absent, FactsError when it is garbage ----

def _read(path: _Path) -> str | None:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as err:
        raise FactsError(f"{path}: cannot read: {err.strerror or err}") from err
    try:
        # Snapshot tools pad some files with NUL bytes; the kernel never writes them.
        return data.rstrip(b"\x00").decode("ascii")
    except UnicodeDecodeError as err:
        raise FactsError(f"{path}: not text: {err}") from err


def _read_int(path: _Path) -> int | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        raise FactsError(f"{path}: expected an integer, found {text.strip()[:40]!r}") from None


def _read_cpulist(path: _Path) -> tuple[int, ...] | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return parse_cpulist(text)
    except ValueError as err:
        raise FactsError(f"{path}: {err}") from None


def _read_cpumask(path: _Path) -> tuple[int, ...] | None:
    text = _read(path)
    if text is None:
        return None
    try:
        return parse_cpumask(text)
    except ValueError as err:
        raise FactsError(f"{path}: {err}") from None


def _read_set(directory: _Path, list_name: str, mask_name: str) -> tuple[int, ...] | None:
    """A CPU set given as ``<list_name>`` (cpulist) or, on older kernels, ``<mask_name>``."""
    cpus = _read_cpulist(directory / list_name)
    return cpus if cpus is not None else _read_cpumask(directory / mask_name)


def parse_meminfo(text: str) -> dict[str, int]:
    """The one parser of meminfo files: ``Key: 123 kB`` lines of /proc/meminfo, or of a node's
    meminfo with its ``Node N`` prefix, as bytes (a figure without a unit, such as
    ``HugePages_Total``, as it is).  A line of another shape is skipped."""
    found: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        words, fields = name.split(), rest.split()
        if not (sep and words and fields and fields[0].isdigit()):
            continue
        unit = fields[1].lower() if len(fields) > 1 else ""
        found[words[-1]] = int(fields[0]) * (1024 if unit == "kb" else 1)
    return found


def _read_kv_kib(path: _Path, keys: tuple[str, ...]) -> dict[str, int]:
    """``keys`` of a meminfo file, in bytes; a line that names one but holds no figure is an error."""
    text = _read(path)
    if text is None:
        return {}
    table = parse_meminfo(text)
    for line in text.splitlines():
        name = line.partition(":")[0].split()
        if name and name[-1] in keys and name[-1] not in table:
            raise FactsError(f"{path}: bad {name[-1]} line {line.strip()!r}")
    return {key: table[key] for key in keys if key in table}


def _numbered_dirs(directory: _Path, pattern: re.Pattern[str]) -> list[int]:
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as err:
        raise FactsError(f"{directory}: cannot list: {err.strerror or err}") from err
    return sorted(int(m.group(1)) for n in names if (m := pattern.match(n)))


# ---- the pieces ---------------------------------------------------------------------

@dataclass(frozen=True)
class _CpuTopology:
    package: int | None  # physical_package_id; None when unknown (-1 or absent)
    package_cpus: tuple[int, ...] | None
    thread_siblings: tuple[int, ...] | None


def _online_cpus(cpu_dir: _Path, present: list[int]) -> set[int]:
    online = _read_cpulist(cpu_dir / "online")
    if online is not None:
        return set(online) & set(present)
    # No global list (old or odd kernels): each CPU's own flag, online if absent.
    result = set()
    for cpu in present:
        flag = _read_int(cpu_dir / f"cpu{cpu}" / "online")
        if flag is None or flag != 0:
            result.add(cpu)
    return result


def _cpu_topology(cpu_dir: _Path, cpu: int) -> _CpuTopology:
    topo = cpu_dir / f"cpu{cpu}" / "topology"
    package = _read_int(topo / "physical_package_id")
    return _CpuTopology(
        package=package if package is not None and package >= 0 else None,
        package_cpus=(_read_set(topo, "package_cpus_list", "package_cpus")
                      or _read_set(topo, "core_siblings_list", "core_siblings")),
        thread_siblings=(_read_set(topo, "thread_siblings_list", "thread_siblings")
                         or _read_set(topo, "core_cpus_list", "core_cpus")),
    )


def _cache_size(path: _Path) -> int | None:
    text = _read(path)
    if text is None:
        return None
    m = _SIZE.match(text.strip())
    if m is None:
        raise FactsError(f"{path}: expected a size like 512K, found {text.strip()[:40]!r}")
    return int(m.group(1)) * _SIZE_UNITS[m.group(2)]


def _caches(cpu_dir: _Path, online: set[int]) -> tuple[Cache, ...]:
    seen: dict[tuple[int, str, tuple[int, ...]], Cache] = {}
    # CPUs already described by cache indexN of a sibling: a shared cache is read
    # once, not once per CPU sharing it (384 CPUs x 4 indexes add up).
    covered: dict[int, set[int]] = {}
    for cpu in sorted(online):
        cache_dir = cpu_dir / f"cpu{cpu}" / "cache"
        for index in _numbered_dirs(cache_dir, _INDEX_DIR):
            if cpu in covered.get(index, ()):
                continue
            d = cache_dir / f"index{index}"
            level = _read_int(d / "level")
            kind_text = _read(d / "type")
            if level is None or kind_text is None:
                continue
            kind = _CACHE_TYPES.get(kind_text.strip().lower())
            if kind is None:
                continue  # "Unknown" caches: hwloc ignores them too
            shared = _read_set(d, "shared_cpu_list", "shared_cpu_map")
            cpus = tuple(sorted((set(shared) & online) | {cpu})) if shared else (cpu,)
            key = (level, kind, cpus)
            covered.setdefault(index, set()).update(cpus)
            if key not in seen:
                seen[key] = Cache(level, kind, _cache_size(d / "size"), cpus)
    return tuple(sorted(seen.values(), key=lambda c: (c.level, c.type, c.cpus)))


def _nodes(node_dir: _Path, online: set[int], proc: _Path) -> list[NumaNode]:
    node_ids = _numbered_dirs(node_dir, _NODE_DIR)
    listed = _read_cpulist(node_dir / "online")
    if listed is not None and node_ids:
        node_ids = [n for n in node_ids if n in set(listed)]
    if not node_ids:
        # Non-NUMA kernel: one node 0 with every CPU and all memory.
        mem = _read_kv_kib(proc / "meminfo", ("MemTotal", "MemFree"))
        return [NumaNode(0, tuple(sorted(online)), mem.get("MemTotal"), mem.get("MemFree"),
                         {0: 10})]
    nodes = []
    for node in node_ids:
        d = node_dir / f"node{node}"
        cpus = _read_set(d, "cpulist", "cpumap") or ()
        mem = _read_kv_kib(d / "meminfo", ("MemTotal", "MemFree"))
        distances: dict[int, int] = {}
        text = _read(d / "distance")
        if text is not None:
            try:
                values = [int(v) for v in text.split()]
            except ValueError:
                raise FactsError(f"{d / 'distance'}: expected integers, "
                                 f"found {text.strip()[:60]!r}") from None
            # The kernel lists distances to every online node in ascending id order.
            if len(values) != len(node_ids):
                raise FactsError(f"{d / 'distance'}: {len(values)} distances for "
                                 f"{len(node_ids)} nodes {node_ids}")
            distances = dict(zip(node_ids, values))
        nodes.append(NumaNode(node, tuple(sorted(set(cpus) & online)), mem.get("MemTotal"),
                              mem.get("MemFree"), distances))
    return nodes


def _one_node_holds_all(nodes: list[NumaNode], meminfo: dict[str, int]) -> list[NumaNode]:
    """On a one-node machine all memory is that node's: when /proc/meminfo counts more than the
    node's own meminfo, the node gets /proc/meminfo's MemTotal and MemFree.

    The node's figures are the sums of its zones' *managed* pages; a kernel that brings memory into
    its zones lazily (seen in a Firecracker VM: zone Normal with 21 GiB present and 4 GiB managed,
    the managed count growing as the guest used memory; node0 said 7.0 GiB, then 10.7 and 11.3, while
    MemTotal said 23.6 GiB and MemAvailable 23 GB) under-counts the node until it has used its
    memory once.  Both files agree on the memory in use, so the node's lower figures are the stale
    ones (docs/design-facts.md, "Memory").  With several nodes there is no telling which node the
    missing memory belongs to: the figures stay the kernel's, and ``cod facts`` says they differ."""
    total = meminfo.get("MemTotal")
    if len(nodes) != 1 or total is None or nodes[0].memory_bytes is None or total <= nodes[0].memory_bytes:
        return nodes
    return [replace(nodes[0], memory_bytes=total, free_bytes=meminfo.get("MemFree", nodes[0].free_bytes))]


def _allowed(proc: _Path, key: str) -> tuple[int, ...] | None:
    path = proc / "self" / "status"
    text = _read(path)
    if text is None:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == key:
            try:
                return parse_cpulist(value)
            except ValueError as err:
                raise FactsError(f"{path}: {key}: {err}") from None
    return None


def _machine_name(root: _Path, proc: _Path) -> str:
    for path in (proc / "sys" / "kernel" / "hostname", root / "etc" / "hostname"):
        text = _read(path)
        if text and text.strip():
            return text.strip()
    return Path(root).resolve().name or "localhost"


# ---- the whole machine --------------------------------------------------------------

def discover(root: str | Path = "/", *, proc_root: str | Path | None = None) -> Machine:
    """The machine seen under ``root`` (``/`` is this machine).

    ``proc_root`` defaults to ``root/proc``; on the real machine that makes the
    allowed CPUs and memory nodes those of this process.
    """
    root = _Path(os.fspath(root))
    proc = _Path(os.fspath(proc_root)) if proc_root is not None else root / "proc"
    cpu_dir = root / "sys" / "devices" / "system" / "cpu"
    present = _numbered_dirs(cpu_dir, _CPU_DIR)
    if not present:
        raise FactsError(f"{cpu_dir}: no cpuN directories: not a Linux sysfs tree")
    online = _online_cpus(cpu_dir, present)
    if not online:
        raise FactsError(f"{cpu_dir}: no online CPU")

    # SMT siblings share package and siblings: read one CPU per core, not all of them.
    topo: dict[int, _CpuTopology] = {}
    for cpu in sorted(online):
        if cpu not in topo:
            t = _cpu_topology(cpu_dir, cpu)
            for sibling in set(t.thread_siblings or ()) & online:
                topo[sibling] = t
            topo[cpu] = t

    # Packages: the physical id; where Linux has none (-1, e.g. POWER) the set of
    # package siblings, named by its lowest CPU, as hwloc does.
    pkg_of: dict[int, int | None] = {}
    for cpu, t in topo.items():
        if t.package is not None:
            pkg_of[cpu] = t.package
        elif t.package_cpus:
            pkg_of[cpu] = min(set(t.package_cpus) & online, default=cpu)
        else:
            pkg_of[cpu] = None
    packages = _group(pkg_of)

    # Cores: the thread siblings, named by the lowest CPU (one id space with PUs).
    core_of: dict[int, int] = {}
    for cpu, t in topo.items():
        siblings = set(t.thread_siblings or ()) & online
        core_of[cpu] = min(siblings | {cpu})

    nodes = _nodes(root / "sys" / "devices" / "system" / "node", online, proc)
    node_of: dict[int, int] = {}
    for node in nodes:
        for cpu in node.cpus:
            node_of.setdefault(cpu, node.id)

    pus = [PU(cpu, core_of[cpu], pkg_of[cpu], node_of.get(cpu)) for cpu in sorted(online)]
    pus += [PU(cpu, cpu, None, None, online=False) for cpu in present if cpu not in online]
    pus.sort(key=lambda p: p.id)

    core_pus = _group({cpu: core_of[cpu] for cpu in online})
    cores = tuple(Core(core, pkg_of[cpus[0]], node_of.get(cpus[0]), cpus)
                  for core, cpus in sorted(core_pus.items()))

    allowed_cpus = _allowed(proc, "Cpus_allowed_list")
    allowed_mems = _allowed(proc, "Mems_allowed_list")
    node_ids = {n.id for n in nodes}
    meminfo = _read_kv_kib(proc / "meminfo", ("MemTotal", "MemFree"))
    mem_total = meminfo.get("MemTotal")
    nodes = _one_node_holds_all(nodes, meminfo)
    if mem_total is None and all(n.memory_bytes is not None for n in nodes):
        mem_total = sum(n.memory_bytes or 0 for n in nodes)

    return Machine(
        name=_machine_name(root, proc),
        source=f"sysfs:{root}",
        packages=tuple(Package(p, cpus) for p, cpus in sorted(packages.items()) if p is not None),
        numa_nodes=tuple(nodes),
        caches=_caches(cpu_dir, online),
        cores=cores,
        pus=tuple(pus),
        allowed_cpus=None if allowed_cpus is None
        else tuple(c for c in allowed_cpus if c in online),
        allowed_mems=None if allowed_mems is None
        else tuple(n for n in allowed_mems if n in node_ids),
        total_memory_bytes=mem_total,
    )


def _group(owner: dict[int, int | None]) -> dict[int | None, tuple[int, ...]]:
    groups: dict[int | None, list[int]] = {}
    for cpu, key in owner.items():
        groups.setdefault(key, []).append(cpu)
    return {k: tuple(sorted(v)) for k, v in groups.items()}

"""What a resctrl mount offers, read from its ``info/`` directory and root ``schemata``.

A pure reader (through `ResctrlFS`): no policy.  The allocator's cache partition
(`cod.rm.allocator.cachepart`) takes a `ResctrlInfo` as its machine description,
the backend (`cod.rm.enforce.resctrl`) formats ``schemata`` lines with it.

Files read (Documentation/filesystems/resctrl.rst):

* ``info/L3/cbm_mask`` (hex, all ways), ``min_cbm_bits``, ``num_closids``,
  ``sparse_masks`` (1 where non-contiguous masks are allowed: AMD; absent on
  older kernels, read as 0); with CDP ``info/L3CODE`` and ``info/L3DATA``
  instead of ``info/L3``;
* ``info/MB/min_bandwidth``, ``bandwidth_gran``, ``num_closids``; its maximum
  is the root group's value (100 % on Intel, 2048 x 1/8 GB/s on AMD);
* ``info/L3_MON/num_rmids``, ``mon_features`` (``llc_occupancy``,
  ``mbm_total_bytes``, ...);
* the root ``schemata``: the domain ids of each resource and their defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import EnforceError
from .resctrlfs import ResctrlFS

CACHE_RESOURCES = ("L3", "L3CODE", "L3DATA", "L2", "L2CODE", "L2DATA")


@dataclass(frozen=True)
class CacheResource:
    name: str
    cbm_len: int          # ways (bits of cbm_mask)
    min_cbm_bits: int
    num_closids: int
    sparse: bool          # non-contiguous masks accepted (AMD)
    domains: tuple[int, ...]

    @property
    def full_mask(self) -> int:
        return (1 << self.cbm_len) - 1


@dataclass(frozen=True)
class BandwidthResource:
    name: str
    min_bandwidth: int
    granularity: int
    max_bandwidth: int     # the root group's value: 100 (%) on Intel, 2048 (1/8 GB/s) on AMD
    num_closids: int
    domains: tuple[int, ...]


@dataclass(frozen=True)
class ResctrlInfo:
    caches: dict[str, CacheResource] = field(default_factory=dict)
    bandwidth: BandwidthResource | None = None
    num_rmids: int = 0
    mon_features: tuple[str, ...] = ()

    @property
    def num_closids(self) -> int:
        """CLOSIDs usable by every resource at once; the default group holds one of them."""
        counts = [r.num_closids for r in self.caches.values()]
        if self.bandwidth is not None:
            counts.append(self.bandwidth.num_closids)
        return min(counts) if counts else 0

    @property
    def cdp(self) -> bool:
        return "L3CODE" in self.caches

    @property
    def l3(self) -> CacheResource | None:
        """The L3 resource (with CDP: its data half, whose masks the code half copies)."""
        return self.caches.get("L3") or self.caches.get("L3DATA")

    def describe(self) -> str:
        parts = []
        l3 = self.l3
        if l3 is not None:
            parts.append(f"L3 {l3.cbm_len} ways x {len(l3.domains)} domains, min {l3.min_cbm_bits} bits"
                         f"{', sparse masks' if l3.sparse else ''}{', CDP' if self.cdp else ''}")
        if self.bandwidth is not None:
            parts.append(f"MB {self.bandwidth.min_bandwidth}..{self.bandwidth.max_bandwidth}"
                         f" step {self.bandwidth.granularity}")
        parts.append(f"{self.num_closids} CLOSIDs")
        if self.mon_features:
            parts.append(f"monitoring {','.join(self.mon_features)}")
        return "; ".join(parts)


def parse_schemata(text: str) -> dict[str, dict[int, str]]:
    """``"L3:0=fffff;1=fffff\\nMB:0=100"`` -> {"L3": {0: "fffff", 1: "fffff"}, "MB": {0: "100"}}."""
    out: dict[str, dict[int, str]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        name, sep, rest = line.partition(":")
        if not sep:
            raise EnforceError(f"resctrl schemata line {line!r} has no ':'")
        doms: dict[int, str] = {}
        for item in rest.split(";"):
            dom, eq, val = item.strip().partition("=")
            if not eq or not dom.strip().isdigit():
                raise EnforceError(f"resctrl schemata line {line!r}: {item!r} is not DOMAIN=VALUE")
            doms[int(dom)] = val.strip()
        out[name.strip()] = doms
    return out


def format_line(resource: str, values: dict[int, int], hexa: bool) -> str:
    """One ``schemata`` line, domains in order: masks in hex, bandwidths in decimal."""
    items = ";".join(f"{d}={v:x}" if hexa else f"{d}={v}" for d, v in sorted(values.items()))
    return f"{resource}:{items}\n"


def _int(fs: ResctrlFS, rel: str, base: int = 10, default: int | None = None) -> int:
    if default is not None and not fs.exists(rel):
        return default
    text = fs.read(rel).strip()
    try:
        return int(text, base)
    except ValueError:
        raise EnforceError(f"resctrl {fs.path(rel)}: {text!r} is not a number") from None


def read_info(fs: ResctrlFS) -> ResctrlInfo:
    """The resources of the mount at ``fs.root``; EnforceError when it is no resctrl mount."""
    if not fs.mounted():
        raise EnforceError(f"{fs.root} is not a resctrl mount (no info/ and schemata)")
    root = parse_schemata(fs.read("schemata"))
    caches = {}
    for name in CACHE_RESOURCES:
        base = f"info/{name}"
        if not fs.isdir(base) or name not in root:
            continue
        mask = _int(fs, f"{base}/cbm_mask", 16)
        caches[name] = CacheResource(name=name, cbm_len=mask.bit_length(),
                                     min_cbm_bits=_int(fs, f"{base}/min_cbm_bits"),
                                     num_closids=_int(fs, f"{base}/num_closids"),
                                     sparse=_int(fs, f"{base}/sparse_masks", default=0) == 1,
                                     domains=tuple(sorted(root[name])))
    bandwidth = None
    if fs.isdir("info/MB") and "MB" in root:
        bandwidth = BandwidthResource(name="MB", min_bandwidth=_int(fs, "info/MB/min_bandwidth"),
                                      granularity=max(1, _int(fs, "info/MB/bandwidth_gran")),
                                      max_bandwidth=max(int(v) for v in root["MB"].values()),
                                      num_closids=_int(fs, "info/MB/num_closids"),
                                      domains=tuple(sorted(root["MB"])))
    rmids, features = 0, ()
    if fs.isdir("info/L3_MON"):
        rmids = _int(fs, "info/L3_MON/num_rmids")
        features = tuple(fs.read("info/L3_MON/mon_features").split())
    return ResctrlInfo(caches=caches, bandwidth=bandwidth, num_rmids=rmids, mon_features=features)


def snapshot(fs: ResctrlFS) -> dict:
    """What a resctrl mount holds now, for `cod facts` and the shell: its resources, and per
    control group its schemata, task count and monitoring counters per L3 domain."""
    info = read_info(fs)
    groups = []
    for name in ["", *fs.listdir("")]:
        if name and (name in ("info", "mon_data", "mon_groups") or not fs.isdir(name)):
            continue
        base = f"{name}/" if name else ""
        mon: dict[str, dict[str, int]] = {}
        for dom in fs.listdir(f"{base}mon_data"):
            for feat in ("llc_occupancy", "mbm_total_bytes"):
                rel = f"{base}mon_data/{dom}/{feat}"
                if fs.exists(rel):
                    text = fs.read(rel).strip()
                    if text.isdigit():
                        mon.setdefault(dom.rpartition("_")[2].lstrip("0") or "0", {})[feat] = int(text)
        groups.append({"group": name or "(default)", "schemata": parse_schemata(fs.read(f"{base}schemata")),
                       "tasks": len(fs.read(f"{base}tasks").split()), "monitoring": mon})
    return {"root": fs.root, "resources": info.describe(), "groups": groups}


def render_snapshot(snap: dict) -> str:
    """The snapshot as the text `cod facts` prints."""
    lines = [f"resctrl {snap['root']}: {snap['resources']}"]
    for g in snap["groups"]:
        sch = " ".join(f"{r}:" + ";".join(f"{d}={v}" for d, v in sorted(doms.items()))
                       for r, doms in g["schemata"].items())
        mon = "".join(f"  L3 {d}: {v.get('llc_occupancy', 0) / 1048576:.1f} MiB occupied"
                      for d, v in sorted(g["monitoring"].items()))
        lines.append(f"  group {g['group']}: {sch}  {g['tasks']} tasks{mon}")
    return "\n".join(lines) + "\n"

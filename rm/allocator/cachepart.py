"""MLS: partitioning each shared L3 so weak-locality tasks cannot pollute it (a pure function).

MCC-DB's scheduling *with* partitioning: co-run mixed strengths and cap the weak
one's share of the cache (its index join kept its speed with 0.5 of 4 MB: one
eighth), sizing the others to their working sets.  Here the cache is divided in
ways, through resctrl's capacity bit masks (CAT); `partition` turns the plan's
placement and the tasks' locality into control groups and masks:

  P1  a domain is *mixed* when a weak task and a strong or moderate one both
      run on it (after SLS, only where co-location was unavoidable); on other
      domains every group keeps all ways;
  P2  on a mixed domain the weak group gets the lowest ``weak_ways`` ways:
      ``max(min_cbm_bits, 1, round(ways x WEAK_SHARE))`` (WEAK_SHARE = 1/8);
  P3  each strong/moderate group gets ``ceil(working set / bytes per way)`` ways
      (at least ``max(min_cbm_bits, 1)``; no working set: an equal share) in
      disjoint contiguous ranges above the weak ones; when they do not fit they are
      scaled down in proportion, and when even the minimum does not fit they all
      share the ways above the weak group; ways left over go to the last range;
      a strong/moderate group not running on the domain gets all the ways above
      the weak ones (it may move there with the next plan);
  P4  groups: ``weak`` (every weak task), and one per strong/moderate task,
      ``task_NAME``; when that exceeds the CLOS budget (``num_closids`` - 1: the default
      group keeps one) the strong/moderate tasks share one group ``clean``;
      tasks without a locality stay in the default group (all ways);
  P5  every mask is contiguous (valid on Intel and AMD alike) and has at least
      ``min_cbm_bits`` bits; a cache too small for two such masks is not
      partitioned (and the result says so).

The backend (`cod.rm.enforce.resctrl`) writes the groups; the tests check every
mask against a fake kernel's rules over many random task sets.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .model import TaskSpec

WEAK_SHARE = 1 / 8
CLEAN = ("strong", "moderate")


@dataclass(frozen=True)
class Geometry:
    """One machine's cache partitioning: from resctrl's info (cod.rm.enforce.resctrl_info)."""

    ways: int                       # bits of cbm_mask
    min_cbm_bits: int
    num_closids: int
    domains: tuple[int, ...]        # resctrl L3 domain ids
    way_bytes: int = 0              # cache bytes per way (0: unknown, working sets are not used)

    @property
    def full(self) -> int:
        return (1 << self.ways) - 1


@dataclass(frozen=True)
class CacheTask:
    name: str
    locality: str | None
    working_set_bytes: int
    domains: frozenset[int]         # L3 domains its CPUs are in


@dataclass(frozen=True)
class Group:
    name: str
    masks: dict[int, int]           # every domain of the geometry -> mask
    tasks: tuple[str, ...]


@dataclass(frozen=True)
class Partition:
    groups: tuple[Group, ...] = ()
    mixed: tuple[int, ...] = ()     # domains partitioned (P1)
    text: str = ""
    notes: tuple[str, ...] = field(default=())


def group_name(task: str) -> str:
    """A strong/moderate task's own group: ``task_NAME``, or a digest for names a directory cannot hold."""
    if re.fullmatch(r"[A-Za-z0-9_.-]{1,50}", task):
        return "task_" + task
    return "task_" + hashlib.sha256(task.encode()).hexdigest()[:16]


def _range(lo: int, n: int) -> int:
    return ((1 << n) - 1) << lo


def weak_ways(geo: Geometry) -> int:
    """P2."""
    return max(geo.min_cbm_bits, 1, round(geo.ways * WEAK_SHARE))


def _sizes(geo: Geometry, need: Sequence[int], room: int) -> list[int] | None:
    """P3: ways per group out of ``room``; None when even the minimum does not fit."""
    least = max(geo.min_cbm_bits, 1)
    if least * len(need) > room:
        return None
    want = [max(least, n) for n in need]
    if sum(want) <= room:
        return want
    extra = room - least * len(want)  # scale the part above the minimum
    above = [w - least for w in want]
    total = sum(above)
    sizes = [least + (a * extra // total if total else 0) for a in above]
    return sizes


def _needs(geo: Geometry, tasks: Sequence[CacheTask], room: int) -> list[int]:
    if geo.way_bytes <= 0 or not any(t.working_set_bytes for t in tasks):
        return [room // max(1, len(tasks))] * len(tasks)
    return [math.ceil(t.working_set_bytes / geo.way_bytes) if t.working_set_bytes else room // len(tasks)
            for t in tasks]


def _masks_on(geo: Geometry, clean: Sequence[CacheTask]) -> tuple[int, dict[str, int]]:
    """(weak mask, clean task -> mask) on one mixed domain."""
    w = weak_ways(geo)
    room = geo.ways - w
    sizes = _sizes(geo, _needs(geo, clean, room), room)
    if sizes is None:
        return _range(0, w), {t.name: _range(w, room) for t in clean}
    out, lo = {}, w
    for i, (t, n) in enumerate(zip(clean, sizes)):
        if i == len(clean) - 1:
            n = geo.ways - lo  # leftovers to the last range
        out[t.name] = _range(lo, n)
        lo += n
    return _range(0, w), out


def partition(geo: Geometry, tasks: Sequence[CacheTask]) -> Partition:
    """Groups and masks for ``tasks`` placed as they are (P1-P5)."""
    weak = [t for t in tasks if t.locality == "weak"]
    clean = sorted((t for t in tasks if t.locality in CLEAN), key=lambda t: t.name)
    if not weak or not clean:
        return Partition(text="MLS: no mixed localities, the cache is not partitioned")
    least = max(geo.min_cbm_bits, 1)
    if geo.ways < 2 * least or geo.num_closids < 3:
        return Partition(text=f"MLS not possible: {geo.ways} ways with masks of at least {least} bits and "
                              f"{geo.num_closids} CLOSIDs leave no room for two partitions")
    weak_doms = set().union(*(t.domains for t in weak))
    mixed = sorted(d for d in geo.domains if d in weak_doms and any(d in t.domains for t in clean))
    if not mixed:
        return Partition(text="MLS: weak-locality tasks share no L3 domain with strong or moderate ones")
    budget = geo.num_closids - 1
    merged = 1 + len(clean) > budget
    if merged:
        clean_groups = [CacheTask("clean", "moderate", sum(t.working_set_bytes for t in clean),
                                  frozenset().union(*(t.domains for t in clean)))]
    else:
        clean_groups = clean
    masks: dict[str, dict[int, int]] = {"weak": {d: geo.full for d in geo.domains}}
    for g in clean_groups:
        masks[g.name] = {d: geo.full for d in geo.domains}
    for d in mixed:
        here = [g for g in clean_groups if d in g.domains]
        wmask, cmasks = _masks_on(geo, here)
        masks["weak"][d] = wmask
        for g in clean_groups:  # one not running here keeps off the weak ways too, should it move here
            masks[g.name][d] = cmasks.get(g.name, _range(weak_ways(geo), geo.ways - weak_ways(geo)))
    members = {"weak": tuple(t.name for t in sorted(weak, key=lambda t: t.name))}
    for g in clean_groups:
        members[g.name] = tuple(t.name for t in clean) if merged else (g.name,)
    names = {g.name: "clean" if merged else group_name(g.name) for g in clean_groups}
    groups = (Group("weak", masks["weak"], members["weak"]),
              *(Group(names[g.name], masks[g.name], members[g.name]) for g in clean_groups))
    share = f"{weak_ways(geo)} of {geo.ways} ways"
    text = (f"MLS: weak-locality {', '.join(members['weak'])} capped at {share} on L3 domain(s) "
            f"{', '.join(map(str, mixed))}; strong/moderate sized to their working sets"
            + (f" in one group (the CLOS budget is {budget} groups)" if merged else ""))
    return Partition(groups, tuple(mixed), text)


def cache_tasks(specs: Sequence[TaskSpec], domains_of: Mapping[str, frozenset[int]]) -> list[CacheTask]:
    """The tasks with a locality, placed on the L3 domains ``domains_of`` gives them."""
    return [CacheTask(s.name, s.locality, s.working_set_bytes, domains_of.get(s.name, frozenset()))
            for s in specs if s.locality is not None]

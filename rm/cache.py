"""The daemon's cache partitioning: after every published plan, MLS groups into resctrl, and
their occupancy into the SKB.

Policy is :mod:`cod.rm.allocator.cachepart` (a pure function of the placement and the
tasks' ``locality``); mechanism is :mod:`cod.rm.enforce.resctrl`.  This module joins
them: which L3 domain each CPU is in (the machine's L3 caches in CPU order, paired
with resctrl's domain ids in order: resctrl numbers L3 domains by cache id, which
follows the packages/dies the same way), which pids each group holds, and the
facts (docs/skb-schema.md):

* ``cache_partition(Group, Domain, Mask)``: a group's way mask on an L3 domain;
* ``cache_group_task(Group, Task)``: a task in a group;
* ``cache_occupancy(Group, Domain, Bytes)``, ``cache_mbm_total(Group, Domain, Bytes)``:
  the group's ``llc_occupancy`` and ``mbm_total_bytes`` where monitoring exists;
* ``cache_policy(Text)``: what MLS did and why.
"""

from __future__ import annotations

import logging
from typing import Any

from cod.facts.model import Machine
from cod.protocol.prolog_text import ANY

from .allocator.cachepart import Geometry, Partition, cache_tasks, partition
from .enforce.resctrl import GroupPlan, ResctrlEnforcer
from .system_facts import (cache_group_task_fact, cache_mbm_total_fact, cache_occupancy_fact,
                           cache_partition_fact, cache_policy_fact)

log = logging.getLogger("cod.rm")


def domain_map(machine: Machine, domains: tuple[int, ...]) -> dict[int, int] | None:
    """CPU -> resctrl L3 domain id; None when the machine's L3 caches and resctrl's domains differ in number."""
    l3 = sorted(machine.l3_caches(), key=lambda c: min(c.cpus) if c.cpus else -1)
    if len(l3) != len(domains):
        return None
    return {cpu: dom for cache, dom in zip(l3, sorted(domains)) for cpu in cache.cpus}


def geometry(enforcer: ResctrlEnforcer, machine: Machine) -> Geometry | None:
    res = enforcer.info.l3
    if res is None:
        return None
    sizes = [c.size_bytes for c in machine.l3_caches() if c.size_bytes]
    way_bytes = min(sizes) // res.cbm_len if sizes else 0
    return Geometry(ways=res.cbm_len, min_cbm_bits=res.min_cbm_bits, num_closids=enforcer.info.num_closids,
                    domains=res.domains, way_bytes=way_bytes)


class CachePartitioning:
    """Keeps the resctrl groups in step with the plan; owned by the daemon."""

    def __init__(self, enforcer: ResctrlEnforcer, machine: Machine, rm: Any) -> None:
        self.enforcer = enforcer
        self.rm = rm
        self.geo = geometry(enforcer, machine)
        self.domain_of = domain_map(machine, self.geo.domains) if self.geo else None
        self.last = Partition(text="MLS: no plan yet")
        if self.geo is None or self.domain_of is None:
            log.warning("cache partitioning off: resctrl has %s L3 domains, the machine %d L3 caches",
                        len(self.geo.domains) if self.geo else "no", len(machine.l3_caches()))

    def refresh(self) -> None:
        """After a publication: the partition of the plan now held, applied; its facts written."""
        if self.geo is None or self.domain_of is None:
            return
        tasks = {t.name: t for t in self.rm.registry.tasks.values()}
        held = self.rm.publisher.holdings()
        doms = {n: frozenset(self.domain_of[c] for c in held.get(n, ()) if c in self.domain_of) for n in tasks}
        part = partition(self.geo, cache_tasks([t.spec for t in tasks.values()], doms))
        plans = [GroupPlan(g.name, g.masks, tuple(p for n in g.tasks if n in tasks for p in tasks[n].pids()))
                 for g in part.groups]
        self.enforcer.apply(plans)
        if part.text != self.last.text:
            log.info("%s", part.text)
        self.last = part
        self.rm.publisher.write(self.facts(part), "writing cache partition facts")

    def facts(self, part: Partition) -> dict[str, list]:
        mon = self.enforcer.monitoring()
        return {
            cache_partition_fact(ANY, ANY, ANY): [cache_partition_fact(g.name, d, m)
                                                  for g in part.groups for d, m in sorted(g.masks.items())],
            cache_group_task_fact(ANY, ANY): [cache_group_task_fact(g.name, t) for g in part.groups for t in g.tasks],
            cache_occupancy_fact(ANY, ANY, ANY): [cache_occupancy_fact(g, d, v["llc_occupancy"])
                                                  for g, ds in sorted(mon.items()) for d, v in sorted(ds.items())
                                                  if "llc_occupancy" in v],
            cache_mbm_total_fact(ANY, ANY, ANY): [cache_mbm_total_fact(g, d, v["mbm_total_bytes"])
                                                  for g, ds in sorted(mon.items()) for d, v in sorted(ds.items())
                                                  if "mbm_total_bytes" in v],
            cache_policy_fact(ANY): [cache_policy_fact(part.text)],
        }

    def sample(self) -> None:
        """Occupancy and bandwidth now (the monitor's refresh period)."""
        if self.geo is not None and self.domain_of is not None and self.last.groups:
            self.rm.publisher.write(self.facts(self.last), "writing cache occupancy facts")

    def listing(self) -> dict[str, Any]:
        """For ``cod facts`` / the shell: the groups, their masks and occupancy."""
        mon = self.enforcer.monitoring()
        return {"resctrl": self.enforcer.describe(), "policy": self.last.text,
                "groups": [{"group": g.name, "tasks": list(g.tasks),
                            "masks": {str(d): f"{m:x}" for d, m in sorted(g.masks.items())},
                            "occupancy": {str(d): v for d, v in sorted(mon.get(g.name, {}).items())}}
                           for g in self.last.groups]}

    def close(self) -> None:
        self.enforcer.close()

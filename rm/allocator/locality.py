"""SLS: tasks of weak cache locality off the L3 domains of strong and moderate ones, when avoidable.

MCC-DB (the seed 003, Lee et al., VLDB 2009) classes a query plan's locality as
strong (a small, hot working set), moderate (about the cache's size) or weak
(a large volume of one-time accesses: an index join, a scan).  A weak plan
*pollutes* a shared cache: co-run with a hash join it raised the join's time by
56 % while itself barely slowing.  Its scheduling without partitioning, SLS,
co-schedules plans of the same strength only.

Here SLS is the existing constraint C5 fed by the locality property (a pure
rewrite of the task list before any solver runs, so cpsat/naive/greedy all
obey it):

  L1  weak tasks get ``pollutes_cache``; strong and moderate ones
      ``sensitive: cache`` (C5 then keeps them apart per L3 domain);
  L2  only when the machine has a choice: a split of the L3 domains exists whose
      "weak" side holds every weak task's ``min_cores`` and whose other side holds
      the strong and moderate ones' (a subset sum over domain sizes, `sls_split`),
      and every task fits on the machine at all;
  L3  if the solver still finds no allocation with L1 (memory per node, allowed
      sets or SMT rules the split ignores), the plan is solved again without it
      (:mod:`.request`), and says so.

Where co-location is unavoidable (one L3 domain, or no split), the plan says so;
the cache partition (MLS, :mod:`.cachepart`) then caps the weak tasks' ways where
resctrl exists.  Demand is counted as exclusive CPUs (``min_cores`` each): shared
tasks are over-counted, so SLS may give up where sharing would have made room.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from .model import TaskSpec
from .topology import View

CLEAN = ("strong", "moderate")


@dataclass(frozen=True)
class CachePolicy:
    """What the allocator did about locality, and why (shown by ``explain``)."""

    mode: str                          # "none" | "sls" | "co-located"
    weak_domains: tuple[int, ...] = ()  # a split that works (L2's evidence), view domain indices
    text: str = ""


def domain_sizes(view: View) -> list[int]:
    sizes = [0] * view.n_domains
    for cpu in view.cpus:
        sizes[view.domain_of[cpu]] += 1
    return sizes


def sls_split(sizes: Sequence[int], weak: int, clean: int, neutral: int = 0) -> tuple[int, ...] | None:
    """Domains (indices) for the weak side: they hold ``weak`` CPUs, the rest ``clean``, and all
    together ``weak + clean + neutral``; None when no split exists (L2).  Subset sum, O(n x CPUs)."""
    total = sum(sizes)
    if weak + clean + neutral > total:
        return None
    # reach[s] = the subset (as a tuple) first found with size sum s
    reach: dict[int, tuple[int, ...]] = {0: ()}
    for i, size in enumerate(sizes):
        if size == 0:
            continue
        for s, subset in list(reach.items()):
            reach.setdefault(s + size, subset + (i,))
    fits = [s for s in reach if weak <= s <= total - clean]
    if not fits:
        return None
    return reach[min(fits)]  # the smallest weak side leaves the most room to the others


def _fmt(names: list[str]) -> str:
    return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def apply_sls(view: View, tasks: Sequence[TaskSpec]) -> tuple[list[TaskSpec], CachePolicy]:
    """The task list with L1 applied when L2 allows it, and the decision."""
    weak = [t for t in tasks if t.locality == "weak"]
    clean = [t for t in tasks if t.locality in CLEAN]
    if not weak or not clean:
        return list(tasks), CachePolicy("none")
    sizes = domain_sizes(view)
    neutral = sum(t.min_cores for t in tasks if t.locality is None)
    split = sls_split(sizes, sum(t.min_cores for t in weak), sum(t.min_cores for t in clean), neutral) \
        if view.n_domains > 1 else None
    wn, cn = [t.name for t in weak], [t.name for t in clean]
    if split is None:
        why = "the machine has one L3 domain" if view.n_domains <= 1 else \
            "no split of the L3 domains holds the weak tasks on one side and the others on the other"
        return list(tasks), CachePolicy("co-located", (), f"SLS not possible ({why}): weak-locality {_fmt(wn)} "
                                        f"may share an L3 domain with {_fmt(cn)}; MLS caps their cache where "
                                        "resctrl exists")
    out = []
    for t in tasks:
        if t.locality == "weak" and not t.pollutes_cache:
            t = replace(t, pollutes_cache=True)
        elif t.locality in CLEAN and "cache" not in t.sensitive:
            t = replace(t, sensitive=t.sensitive | {"cache"})
        out.append(t)
    labels = [view.domain_labels[d] for d in split]
    return out, CachePolicy("sls", split, f"SLS: weak-locality {_fmt(wn)} kept off the L3 domains of "
                                          f"{_fmt(cn)} (C5; e.g. weak on {_fmt(labels)})")


def without_sls(original: Sequence[TaskSpec], policy: CachePolicy, by: str | None = None) -> CachePolicy:
    """L3: the decision when the solver found no allocation with SLS (or, ``by`` the greedy
    solver, which treats C5 as a preference, one that breaks it)."""
    weak = [t.name for t in original if t.locality == "weak"]
    why = f"the {by} solver did not keep weak-locality {_fmt(weak)} apart" if by else \
        f"the solver found no allocation keeping weak-locality {_fmt(weak)} apart; solved without it"
    return CachePolicy("co-located", (), f"SLS not possible ({why}); MLS caps their cache where resctrl exists")

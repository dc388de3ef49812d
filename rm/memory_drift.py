"""Pages that drift off a task's memory nodes: when the RM says so (policy, no I/O).

The live state reads each task's resident pages per node (``task_numa_pages/3``).  A task's
pages belong on its memory nodes (the nodes of its CPUs): the RM moves them there when the task
moves (docs/design-enforce.md).  They drift away when the kernel's automatic NUMA balancing
moves them toward a thread running elsewhere, when the task allocates on a node it was not
given (its own policy, affinity mode without the client's call), or when pages could not be
moved.  `DriftWatch` turns the samples into one log line when a task starts drifting (more than
``share`` of its pages and at least ``min_pages`` off its nodes) and one when it is back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

DRIFT_SHARE = 0.05   # more than 5 % of a task's resident pages off its nodes ...
DRIFT_MIN_PAGES = 256  # ... and at least 1 MiB of them: a few library pages are no drift
PAGE = 4096


@dataclass(frozen=True)
class Drift:
    task: str
    nodes: tuple[int, ...]       # the task's memory nodes
    off: dict[int, int]          # node -> pages on it, for nodes that are not the task's
    total: int                   # resident pages

    @property
    def off_pages(self) -> int:
        return sum(self.off.values())

    def text(self) -> str:
        where = ", ".join(f"node {n}: {p * PAGE >> 20} MiB" for n, p in sorted(self.off.items()))
        return (f"task {self.task}: {self.off_pages / self.total:.0%} of its resident pages are off its memory "
                f"nodes {','.join(map(str, self.nodes))} ({where}); automatic NUMA balancing, memory it "
                f"allocated elsewhere, or pages that could not be moved")


def drift_of(task: str, pages: Mapping[int, int], nodes: Iterable[int],
             share: float = DRIFT_SHARE, min_pages: int = DRIFT_MIN_PAGES) -> Drift | None:
    """The task's drift when it is over both thresholds; None otherwise (or when it has no nodes)."""
    nodes = tuple(sorted(set(nodes)))
    total = sum(pages.values())
    if not nodes or not total:
        return None
    off = {n: p for n, p in pages.items() if n not in nodes and p}
    moved_off = sum(off.values())
    if moved_off < min_pages or moved_off <= share * total:
        return None
    return Drift(task, nodes, off, total)


class DriftWatch:
    """Which tasks drift; `observe` says what changed since the last sample of that task."""

    def __init__(self, share: float = DRIFT_SHARE, min_pages: int = DRIFT_MIN_PAGES) -> None:
        self.share = share
        self.min_pages = min_pages
        self.drifting: dict[str, Drift] = {}

    def observe(self, task: str, pages: Mapping[int, int], nodes: Iterable[int]) -> tuple[str, str] | None:
        """("drift", text) when the task starts drifting, ("back", text) when it stops, else None."""
        now = drift_of(task, pages, nodes, self.share, self.min_pages)
        was = self.drifting.pop(task, None)
        if now is not None:
            self.drifting[task] = now
            if was is None or was.nodes != now.nodes:
                return "drift", now.text()
            return None
        if was is not None:
            return "back", f"task {task}: its pages are back on its memory nodes {','.join(map(str, was.nodes))}"
        return None

    def forget(self, keep: Iterable[str]) -> None:
        """Drop the tasks that are gone."""
        keep = set(keep)
        for task in [t for t in self.drifting if t not in keep]:
            del self.drifting[task]

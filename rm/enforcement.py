"""The hook through which the RM applies allocations to processes (the mechanism lives in cod.rm.enforce).

The RM calls `apply` whenever the cores a task may use change and `release` when
the task leaves.  The daemon passes `cod.rm.enforce.EnforcerHook` over the backend
that `--enforce` chose; `NoEnforcement` is what a `--no-enforce` or planning-only
daemon (`--machine`, `--hwloc`) uses.
"""

from __future__ import annotations

from typing import Protocol


class EnforcementHook(Protocol):
    def apply(self, task: str, pid: int, cpus: tuple[int, ...], mems: tuple[int, ...]) -> None:
        """Confine `pid` to `cpus` and memory nodes `mems`; raise to report failure (it is logged)."""

    def release(self, task: str, pid: int) -> None:
        """Give `pid` back the whole machine (or leave it alone if it is gone)."""


class NoEnforcement:
    """Plans only: nothing is pinned, the allocation is reported to clients and written to the SKB."""

    def apply(self, task: str, pid: int, cpus: tuple[int, ...], mems: tuple[int, ...]) -> None:
        return None

    def release(self, task: str, pid: int) -> None:
        return None

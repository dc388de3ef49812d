"""Enforcement mechanisms of the RM: pinning, cpusets, process events, busy-process
detection and the machine's live state.  Policy lives elsewhere (cod.rm).

The names below are loaded on first use: a command that needs one submodule (`cod facts`
reads the resctrl mount) does not load every backend (~0.1 s of its start)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .affinity import AffinityEnforcer
    from .backend import Enforcer, NullEnforcer, default_state_dir, detect
    from .modes import MODES
    from .cpuset import CpusetV1Enforcer, CpusetV2Enforcer
    from .errors import EnforceError

_HOME = {
    "MODES": "modes", "Enforcer": "backend", "NullEnforcer": "backend", "default_state_dir": "backend",
    "detect": "backend", "AffinityEnforcer": "affinity", "CpusetV1Enforcer": "cpuset",
    "CpusetV2Enforcer": "cpuset", "EnforceError": "errors",
}
__all__ = list(_HOME)


def __getattr__(name: str) -> object:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)

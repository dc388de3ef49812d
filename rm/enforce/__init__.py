"""Enforcement mechanisms of the RM: pinning, cpusets, process events, busy-process
detection and the machine's live state.  Policy lives elsewhere (cod.rm)."""

from .backend import MODES, Enforcer, NullEnforcer, default_state_dir, detect
from .affinity import AffinityEnforcer
from .cpuset import CpusetV1Enforcer, CpusetV2Enforcer
from .errors import EnforceError

__all__ = [
    "MODES", "Enforcer", "NullEnforcer", "default_state_dir", "detect", "AffinityEnforcer",
    "CpusetV1Enforcer", "CpusetV2Enforcer", "EnforceError",
]

"""Guest-only tests: collected only inside the guest that tests/vm/vmrun.py boots.

The runner names the topology it gave qemu in COD_VM_TOPOLOGY; on the host (no such variable)
these files are not collected at all, so the host suite neither runs nor skips them.
"""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/: the shared helpers package
sys.path.insert(0, HERE)

from topologies import ENV, Topology, topology  # noqa: E402

collect_ignore_glob = [] if os.environ.get(ENV) else ["test_*.py"]
# The scheduler's tests run on the sched_ext kernel alone (vmrun.py --kernel scx names it).
if os.environ.get("COD_VM_KERNEL") != "scx":
    collect_ignore_glob.append("test_scx.py")


@pytest.fixture(scope="session")
def topo() -> Topology:
    """What qemu was given."""
    return topology(os.environ[ENV])

"""Where the tests' data lives: in the repository, never on a particular machine."""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"
TOPOLOGIES = DATA / "topologies"
HWLOC_DIR = TOPOLOGIES / "hwloc"  # hwloc's own test exports (BSD, COPYING-hwloc beside them)
SYSFS_DIR = TOPOLOGIES / "linux-sysfs"  # hwloc-gather-topology tarballs and lstopo's output for each

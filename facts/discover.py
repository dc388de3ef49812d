"""Where a command's machine comes from: this machine, a sysfs tree, an hwloc file
or a named reference machine.  Every command that takes a machine calls
:func:`from_args` so they all accept the same three options.
"""

from __future__ import annotations

from pathlib import Path

from . import hwloc_xml, machines, sysfs
from .model import FactsError, Machine


def from_args(sysfs_root: str | Path | None = None, hwloc: str | Path | None = None,
              machine: str | None = None, *, whole_system: bool = False) -> Machine:
    """The machine named by at most one source; none given means this machine.

    An hwloc export is shown as hwloc's tools show it: what its allowed cpuset and
    nodeset leave out is left out, unless ``whole_system`` (then it is marked)."""
    given = [name for name, value in (("sysfs_root", sysfs_root), ("hwloc", hwloc),
                                      ("machine", machine)) if value is not None]
    if len(given) > 1:
        raise FactsError(f"give at most one machine source, not {' and '.join(given)}")
    if hwloc is not None:
        loaded = hwloc_xml.load(hwloc)
        return loaded if whole_system else loaded.restricted()
    if machine is not None:
        return machines.load(machine)
    if sysfs_root is not None:
        root = Path(sysfs_root)
        if not root.is_dir():
            raise FactsError(f"{root}: no such directory")
        return sysfs.discover(root)
    return sysfs.discover("/")

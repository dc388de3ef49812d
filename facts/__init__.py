"""Hardware facts: the machine model and the readers that build it.

``from_args`` picks the source (this machine, a sysfs tree, an hwloc XML file
or a reference machine); ``to_prolog`` turns a machine into SKB facts.
"""

from .discover import from_args
from .model import FactsError, Machine
from .prolog import to_prolog

__all__ = ["FactsError", "Machine", "from_args", "to_prolog"]

"""One exception hierarchy for enforcement, in the manner of psutil's.

Raw OS errors are turned into these with ``raise ... from err`` so the caller
sees what COD was doing (which task, which pid, which file) and the cause.
"""

from __future__ import annotations

from cod.protocol.errors import CodError


class EnforceError(CodError):
    """Enforcement failed: a pin, a cgroup write, the state file, the event socket."""

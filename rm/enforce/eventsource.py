"""Which source of process events the RM reads: the best one that opens on this kernel.

BPF programs on the process tracepoints (:mod:`.bpfevents`), else the proc connector, else
polling /proc (both in :mod:`.procevents`).  A module of its own because the BPF source is built
on the connector's event type: the chooser imports both, neither imports it.
"""

from __future__ import annotations

import logging
from typing import Any

from .bpfevents import BpfSource
from .errors import EnforceError
from .procevents import ConnectorSource, PollingSource

log = logging.getLogger("cod.rm.enforce")

EventSource = Any  # BpfSource | ConnectorSource | PollingSource: fileno(), read_events(), close(), kind


def open_source(prefer_connector: bool = True, poll_interval: float = 0.1, *,
                prefer_bpf: bool = True) -> EventSource:
    """The best source that opens, logged (once): BPF programs on the process tracepoints
    (`cod.rm.enforce.bpfevents`), else the proc connector, else the poller.  Both kernel
    sources need root: ``prefer_connector`` False (not root) goes straight to polling."""
    if prefer_connector and prefer_bpf:
        try:
            bpf = BpfSource()
            log.info("process events: BPF (tp_btf on sched_process_fork/exec/exit, task_rename; ring buffer)")
            return bpf
        except EnforceError as err:
            log.info("process events: BPF unavailable (%s); trying the proc connector", err)
    if prefer_connector:
        try:
            src: ConnectorSource | PollingSource = ConnectorSource()
            log.info("process events: proc connector (netlink)")
            return src
        except EnforceError as err:
            log.warning("process events: %s; falling back to polling /proc every %.3f s", err, poll_interval)
    else:
        log.info("process events: polling /proc every %.3f s", poll_interval)
    return PollingSource(poll_interval)

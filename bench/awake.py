"""Keep every CPU from halting while a measurement runs: one ``nice 19`` spinner pinned to each.

On a machine whose idle CPUs halt (a VM without a cpuidle driver, or bare metal in a deep
C-state), waking a thread on a halted CPU costs far more than the work a short round trip does:
this host's BPF events had a p99 of 266-322 us with idle CPUs and 75-90 us with spinners beside
them (docs/design-enforce.md).  A nice-19 spinner gets about 1.5 % of a CPU beside one
nice-0 thread and keeps the CPU out of the idle loop.  SCHED_IDLE spinners were tried first and
made the BPF tail worse, not better (p99 412.6 us against 94.6 us with nice 19, the same run
length, one after the other), so they are not used.  The benches report such figures as a column
of their own, beside the idle machine's: the targets are judged on the idle machine.
"""

from __future__ import annotations

import os
import subprocess
import sys

SPIN = """
import os
os.nice(19)
while True:
    pass
"""


class AwakeCpus:
    """``with AwakeCpus(): ...``: every CPU this process may use has a nice-19 spinner."""

    def __init__(self, cpus: set[int] | None = None) -> None:
        self.cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> "AwakeCpus":
        for cpu in self.cpus:
            proc = subprocess.Popen([sys.executable, "-c", SPIN], preexec_fn=lambda c=cpu: os.sched_setaffinity(0, {c}))
            self.procs.append(proc)
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait()
        self.procs = []

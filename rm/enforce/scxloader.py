"""Start and stop scx_cod's loader, the program that attaches the sched_ext scheduler
(kernel_patches/scx_cod/scx_cod.c).

The loader prints ``READY`` (then where its maps are pinned) once the scheduler is attached,
and detaches it on SIGTERM.  The daemon never starts it: an administrator runs it
(kernel_patches/README.md).  The sched_ext guest tests and exp3's ``--enforce sched_ext`` runs
start it through :class:`ScxLoader`, so that its path in a checkout and its start-up line have
one home.
"""

from __future__ import annotations

import signal
import subprocess
import tempfile
from pathlib import Path

from .errors import EnforceError
from .scxmaps import SCHED_EXT, scheduler_state

READY = "scx_cod: running"
IN_CHECKOUT = Path("kernel_patches", "scx_cod", "build", "scx_cod")  # where build_scx_cod.sh puts it
STOP_WAIT_S = 60.0  # detaching waits for the kernel to move every task back to its own scheduler


def built_loader(checkout: Path) -> Path:
    """The loader built in the source tree ``checkout`` (kernel_patches/build_scx_cod.sh)."""
    return checkout / IN_CHECKOUT


class ScxLoader:
    """A running loader: started by the constructor, which returns once the scheduler runs."""

    def __init__(self, path: Path, sched_ext: str = SCHED_EXT) -> None:
        if not path.exists():
            raise EnforceError(f"{path} is not built (kernel_patches/build_scx_cod.sh; it runs on a kernel "
                               "with sched_ext: make vm-test VM_KERNEL=scx)")
        self._stopped: tuple[int, str] | None = None
        # Its standard error goes to a file read at stop: a pipe nobody reads while it runs would
        # stop the loader once 64 KB of libbpf's messages filled it.
        self._stderr = tempfile.TemporaryFile(mode="w+", prefix="scx_cod-stderr-")
        self.proc = subprocess.Popen([str(path)], stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        why = scheduler_state(sched_ext) if line.startswith(READY) else f"it printed {line!r}"
        if why is not None:
            _, err = self.stop(signal.SIGKILL)
            raise EnforceError(f"scx_cod did not start: {why} {err.strip()}".rstrip())

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, str]:
        """Send ``sig`` (unless it has exited) and wait: its exit status and standard error.  Once
        stopped, the same answer again."""
        if self._stopped is not None:
            return self._stopped
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.proc.wait(STOP_WAIT_S)
        self._stderr.seek(0)
        err = self._stderr.read()
        self._stderr.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stopped = (self.proc.returncode, err)
        return self._stopped

    def __enter__(self) -> ScxLoader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

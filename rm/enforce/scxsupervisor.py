"""The scx_cod loader the daemon runs for ``--enforce sched_ext`` (issue 48).

Asked for sched_ext, the daemon does not serve on something else without being told to: where
no scx_cod runs, it starts the loader it ships (`find_loader`), waits until the kernel reports the
scheduler enabled (`ScxLoader`), stops it when it stops, and restarts it when it exits while the
daemon serves (the kernel's watchdog can eject a scheduler).  A scx_cod someone else started is
used and left running.

`ScxSupervisor.restart()` runs on a thread of its own: starting a loader takes a second or more
(much more under qemu TCG), which the event loop must not wait for.  `ScxEnforcer.check()` asks
for the restart and sees the scheduler back on a later tick.
"""

from __future__ import annotations

import logging
import shutil
import sys
import threading
import time
from pathlib import Path

from .errors import EnforceError
from .scxloader import ScxLoader, built_loader
from .scxmaps import OPS_NAME, SCHED_EXT, read_state, scheduler_state

log = logging.getLogger("cod.rm.enforce")

# Where an install keeps the loader: PREFIX/libexec/cod/scx_cod (kernel_patches/README.md).
INSTALLED = Path("libexec", "cod", "scx_cod")
# Restarts within RESTART_WINDOW_S before the supervisor gives up and the fallback stays in force.
MAX_RESTARTS = 3
RESTART_WINDOW_S = 600.0
RESTART_BACKOFF_S = 2.0  # a failed start is tried again after this long, not on every tick


def checkout_root() -> Path:
    """The source tree this module runs from (an editable install or the checkout itself)."""
    return Path(__file__).resolve().parents[2]


def find_loader(explicit: str | None = None, *, checkout: Path | None = None,
                prefix: Path | None = None) -> Path | None:
    """The scx_cod loader to run: ``explicit`` (``--scx-loader``), else the one built in the
    checkout, else PREFIX/libexec/cod/scx_cod, else ``scx_cod`` on PATH; None when none exists."""
    if explicit:
        return Path(explicit)
    for candidate in (built_loader(checkout or checkout_root()), Path(prefix or sys.prefix) / INSTALLED):
        if candidate.is_file():
            return candidate
    found = shutil.which("scx_cod")
    return Path(found) if found else None


def why_it_cannot_run(loader: Path | None, sched_ext: str = SCHED_EXT,
                      root: bool = True) -> tuple[str, str] | None:
    """None when the daemon may start ``loader``; else why it cannot and what to do about it,
    for the start-up error (or, where a fallback was asked for, the warning)."""
    state, ops = read_state(sched_ext)
    if state is None:
        return (str(scheduler_state(sched_ext)),
                "run on a kernel with sched_ext (kernel_patches/README.md), or choose --enforce sched_ext,cpuset "
                "to serve on cpusets where it is missing")
    if ops is not None and ops != OPS_NAME:
        return str(scheduler_state(sched_ext)), "stop it first, or choose --enforce cpuset"
    if not root:
        return "starting scx_cod needs root (it loads a BPF scheduler)", "run the daemon as root"
    if loader is None:
        return ("scx_cod is not built",
                f"build it with kernel_patches/build_scx_cod.sh, install it as PREFIX/{INSTALLED}, "
                "or name it with --scx-loader PATH")
    if not loader.is_file():
        return f"the loader {loader} does not exist", "name the built scx_cod with --scx-loader PATH"
    return None


class ScxSupervisor:
    """The loader the daemon started, restarted when it exits, stopped with the daemon."""

    def __init__(self, path: Path, sched_ext: str = SCHED_EXT, *, max_restarts: int = MAX_RESTARTS,
                 window_s: float = RESTART_WINDOW_S) -> None:
        self.path = path
        self.sched_ext = sched_ext
        self.max_restarts = max_restarts
        self.window_s = window_s
        self.loader: ScxLoader | None = None
        self.restarts: list[float] = []  # monotonic times of the restarts within the window
        self.gave_up: str | None = None  # why it stopped restarting, once it has
        self._lock = threading.Lock()
        self._restarting: threading.Thread | None = None
        self._closed = False

    def start(self) -> None:
        """Start the loader; returns once the kernel reports the scheduler enabled (EnforceError
        with the loader's own words when it does not)."""
        self.loader = ScxLoader(self.path, self.sched_ext)
        log.info("sched_ext: started %s (pid %d); the kernel reports it enabled", self.path, self.loader.proc.pid)

    def exited(self) -> str:
        """What became of the loader, for the log line of a scheduler that went away."""
        if self.loader is None:
            return "it was not running"
        if self.loader.proc.poll() is None:
            return f"its loader (pid {self.loader.proc.pid}) still runs"
        rc, err = self.loader.stop()
        tail = err.strip().splitlines()[-1] if err.strip() else "nothing on stderr"
        return f"its loader exited with status {rc} ({tail})"

    def restart(self) -> bool:
        """Restart the loader in the background; False (and `gave_up` set) when it exited more
        than `max_restarts` times within the window, or when the daemon is stopping."""
        with self._lock:
            if self._closed or self.gave_up is not None:
                return False
            now = time.monotonic()
            if self._restarting is not None and (self._restarting.is_alive()
                                                 or now - self.restarts[-1] < RESTART_BACKOFF_S):
                return True
            self.restarts = [t for t in self.restarts if now - t < self.window_s] + [now]
            if len(self.restarts) > self.max_restarts:
                self.gave_up = (f"scx_cod exited {len(self.restarts)} times within {self.window_s:g} s; "
                                "not restarted again")
                log.error("sched_ext: %s", self.gave_up)
                return False
            log.error("sched_ext: restarting %s (restart %d of at most %d within %g s)", self.path,
                      len(self.restarts), self.max_restarts, self.window_s)
            self._restarting = threading.Thread(target=self._start_quietly, name="scx-restart", daemon=True)
            self._restarting.start()
            return True

    def _start_quietly(self) -> None:
        if self.loader is not None:
            self.loader.stop()
        try:
            self.start()
        except EnforceError as err:
            log.error("sched_ext: restarting scx_cod failed: %s", err)

    def wait_restart(self, timeout: float | None = None) -> None:
        """Wait for a restart under way (tests, close)."""
        thread = self._restarting
        if thread is not None:
            thread.join(timeout)

    def stop(self) -> None:
        """Stop the loader (the kernel then reports the scheduler disabled); idempotent."""
        with self._lock:
            self._closed = True
        self.wait_restart()
        if self.loader is not None:
            rc, _ = self.loader.stop()
            log.info("sched_ext: stopped %s (status %d)", self.path, rc)

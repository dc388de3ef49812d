"""The engine's standard error in the daemon's log: prefixed, cut and rate-limited.

Application code cannot write to the engine's standard error (cod_server.pl
binds it to a null stream), but SWI-Prolog itself can (a FATAL error, a
"print_message/2: recursive call" under memory pressure), and an application
may be able to provoke that at will.  So what the engine writes never
reaches the daemon's log raw: each line is cut to :data:`MAX_LINE_CHARS`,
made printable, prefixed with the engine's pid, and at most ``burst`` lines
are logged per ``window_s``; the lines dropped are counted and said once
the window ends.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import IO

MAX_LINE_CHARS = 300
BURST = 20
WINDOW_S = 60.0


class RateLimit:
    """At most ``burst`` events per ``window_s``; how many were refused in the window that ended."""

    def __init__(self, burst: int = BURST, window_s: float = WINDOW_S) -> None:
        self.burst, self.window_s = burst, window_s
        self._start = -float("inf")
        self._used = 0
        self.dropped = 0

    def admit(self, now: float) -> tuple[bool, int]:
        """(log this event?, events dropped in the previous window, to report now)."""
        reported = 0
        if now - self._start >= self.window_s:
            reported, self.dropped = self.dropped, 0
            self._start, self._used = now, 0
        if self._used < self.burst:
            self._used += 1
            return True, reported
        self.dropped += 1
        return False, reported


def printable(raw: bytes, limit: int = MAX_LINE_CHARS) -> str:
    """One line of engine output as the log shows it: decoded, no control characters, cut."""
    text = raw.decode("utf-8", "replace").rstrip("\r\n")
    text = "".join(c if c.isprintable() else "?" for c in text[: limit + 1])
    return text if len(text) <= limit else text[:limit] + " [cut]"


class StderrLog:
    """Relays one engine process's standard error to ``log`` from a thread of its own."""

    def __init__(self, log: logging.Logger, pid: int, limit: RateLimit | None = None) -> None:
        self.log, self.pid = log, pid
        self.limit = limit or RateLimit()

    def line(self, raw: bytes, now: float) -> None:
        ok, dropped = self.limit.admit(now)
        if dropped:
            self.log.warning("SKB engine %d: %d more lines of its standard error were not logged", self.pid, dropped)
        if ok:
            self.log.warning("SKB engine %d: %s", self.pid, printable(raw))

    def relay(self, stream: IO[bytes]) -> threading.Thread:
        def run() -> None:
            try:
                while True:
                    raw = stream.readline(4 * MAX_LINE_CHARS)  # a longer line goes on as further lines
                    if not raw:
                        break
                    self.line(raw, time.monotonic())
            except (OSError, ValueError):  # the pipe was closed under us: the engine is gone
                pass
            finally:
                if self.limit.dropped:
                    self.log.warning("SKB engine %d: %d more lines of its standard error were not logged",
                                     self.pid, self.limit.dropped)
                try:
                    stream.close()
                except OSError:
                    pass

        thread = threading.Thread(target=run, name=f"skb-stderr-{self.pid}", daemon=True)
        thread.start()
        return thread

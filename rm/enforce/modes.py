"""The enforcement modes ``--enforce`` takes, in one place (the config checks them, `detect`
carries them out).  Light to import: the CLI and the config read it before any backend loads."""

from __future__ import annotations

# sched_ext alone: the daemon runs scx_cod (or refuses to start); the cpuset or affinity
# backend holds the tasks only while it restarts the scheduler, and says so loudly.
# sched_ext,cpuset / sched_ext,affinity: where the scheduler cannot run, serve on that backend
# (a warning, not a refusal).
MODES = ("affinity", "cpuset", "sched_ext", "sched_ext,cpuset", "sched_ext,affinity", "none")
AUTO = "auto"  # sched_ext where scx_cod already runs, else cpuset as root when mounted, else affinity


def split_mode(mode: str) -> tuple[str, str | None]:
    """``sched_ext,cpuset`` -> (``sched_ext``, ``cpuset``): the backend and the fallback the
    user asked for (None: none asked)."""
    primary, _, fallback = mode.partition(",")
    return primary, fallback or None

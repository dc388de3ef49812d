"""The RM's settings: defaults, a TOML file (`--config`) and command-line flags, in that order of precedence."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from .allocator.model import SOLVERS


class ConfigError(Exception):
    """A setting is wrong; the message names the file or flag and the setting."""


def default_socket_path() -> str:
    """`$COD_SOCKET`, else /run/cod/rm.sock for root, else `$XDG_RUNTIME_DIR/cod/rm.sock`."""
    env = os.environ.get("COD_SOCKET")
    if env:
        return env
    if os.geteuid() == 0:
        return "/run/cod/rm.sock"
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/cod-{os.geteuid()}"
    return os.path.join(runtime, "cod", "rm.sock")


@dataclass(frozen=True)
class RMConfig:
    socket: str | None = None            # None: default_socket_path()
    machine: str | None = None           # a reference machine name: planning-only daemon
    hwloc: str | None = None             # an hwloc XML file: planning-only daemon
    enforce: bool = True                 # apply allocations to processes (off for --machine/--hwloc)
    log_level: str = "info"
    socket_owner: str | None = None      # user name or uid for the socket file
    socket_group: str | None = None      # group name or gid for the socket file
    socket_mode: int = 0o666             # every request is checked against the peer's credentials
    revoke_deadline_s: float = 2.0       # grace time a task gets to give cores back
    query_timeout_s: float = 5.0         # upper bound on one execute_query
    max_frame_bytes: int = 1 << 20
    max_connections: int = 4096
    max_inflight_per_connection: int = 32
    max_output_buffer_bytes: int = 8 << 20  # a peer that does not read its upcalls is dropped
    max_buffered_input_bytes: int = 64 << 20  # incomplete frames of all peers together
    # ---- enforcement and monitoring (issue #6) ----
    enforce_mode: str = "auto"           # auto (cpuset as root when mounted, else affinity) | affinity | cpuset | none
    state_dir: str | None = None         # records of what was pinned, for crash cleanup; None: /run/cod as root
    cgroup_parent: str = "cod"           # the cpuset cgroup under which each task gets its own
    memory_migrate: bool = False         # move a task's pages when its memory nodes change (costly; see docs)
    events_poll_interval_s: float = 0.1  # /proc polling when the proc connector is unavailable (not root)
    busy_detect: bool = True             # notice unregistered CPU hogs and keep tasks' cores away from them
    busy_interval_s: float = 0.1         # busy sampling period
    busy_threshold: float = 0.5          # cores a process must use ...
    busy_window: int = 3                 # ... over this many consecutive samples to count as a hog
    confine_others: bool | None = None   # put hogs on the cores left over; None: on when root
    refresh_interval_s: float = 1.0      # live state (load, free memory, task CPU use and pages) into the SKB
    solver: str = "cpsat"                # cpsat (greedy fallback on time limit) | greedy | naive
    solver_time_limit_s: float = 1.0

    def socket_path(self) -> str:
        return self.socket or default_socket_path()

    def planning_only(self) -> bool:
        return self.machine is not None or self.hwloc is not None

    def wants_confinement(self, root: bool) -> bool:
        return root if self.confine_others is None else self.confine_others


ENFORCE_MODES = ("auto", "affinity", "cpuset", "none")


_TYPES = {f.name: f.type for f in fields(RMConfig)}


def _coerce(name: str, value: Any, origin: str) -> Any:
    kind = _TYPES[name]
    if name == "socket_mode":
        if isinstance(value, str):
            try:
                return int(value, 8)
            except ValueError:
                raise ConfigError(f"{origin}: socket_mode must be an octal string like \"0660\"") from None
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{origin}: socket_mode must be an octal string like \"0660\"")
    if kind in ("bool", "bool | None"):
        if not isinstance(value, bool):
            raise ConfigError(f"{origin}: {name} must be true or false")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{origin}: {name} must be a positive integer")
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"{origin}: {name} must be a positive number (seconds)")
        return float(value)
    if name in ("socket_owner", "socket_group") and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise ConfigError(f"{origin}: {name} must be a string")
    return value


def load_toml(path: str | Path) -> dict[str, Any]:
    """Settings from a TOML file: top-level keys, or the same keys under an `[rm]` table."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as err:
        raise ConfigError(f"{path}: cannot read config file: {err.strerror}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None
    if isinstance(data.get("rm"), dict):
        data = data["rm"]
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = key.replace("-", "_")
        if name not in _TYPES:
            raise ConfigError(f"{path}: unknown setting {key!r}; known: {', '.join(sorted(_TYPES))}")
        out[name] = _coerce(name, value, str(path))
    return out


def build_config(file: str | Path | None = None, **overrides: Any) -> RMConfig:
    """Defaults, then the TOML file, then the non-None overrides (the command-line flags)."""
    settings: dict[str, Any] = load_toml(file) if file else {}
    for name, value in overrides.items():
        if value is not None:
            settings[name] = _coerce(name, value, f"--{name.replace('_', '-')}")
    cfg = replace(RMConfig(), **settings)
    if cfg.machine and cfg.hwloc:
        raise ConfigError("give either a machine name or an hwloc file, not both")
    if cfg.log_level.lower() not in ("debug", "info", "warning", "error", "critical"):
        raise ConfigError(f"log level {cfg.log_level!r} is not one of debug, info, warning, error, critical")
    if cfg.enforce_mode not in ENFORCE_MODES:
        raise ConfigError(f"enforce mode {cfg.enforce_mode!r} is not one of {', '.join(ENFORCE_MODES)}")
    if cfg.solver not in SOLVERS:
        raise ConfigError(f"solver {cfg.solver!r} is not one of {', '.join(SOLVERS)}")
    if cfg.enforce_mode == "none":
        cfg = replace(cfg, enforce=False)
    if cfg.planning_only() and cfg.enforce:
        cfg = replace(cfg, enforce=False)  # planning for other hardware: nothing here to enforce
    if not cfg.enforce:
        cfg = replace(cfg, enforce_mode="none")
    return cfg

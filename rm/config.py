"""The RM's settings: defaults, a TOML file (`--config`) and command-line flags, in that order of precedence."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from cod.facts.user_input import InputError, loads_toml, read_bytes
from cod.protocol.errors import CodError
from cod.protocol.paths import default_socket_path
from cod.skb.session import EngineConfig

# A task's priority lies in this range (higher: its cores up to max_cores come first).
PRIORITY_MIN = -1000
PRIORITY_MAX = 1000


class ConfigError(CodError):
    """A setting is wrong; the message names the file or flag and the setting."""


@dataclass(frozen=True)
class RMConfig:
    socket: str | None = None            # None: default_socket_path()
    machine: str | None = None           # a reference machine name: planning-only daemon
    hwloc: str | None = None             # an hwloc XML file: planning-only daemon
    whole_system: bool = False           # with hwloc: keep what its allowed sets leave out
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
    # ---- every client is bounded (docs/security.md, "The threat model") ----
    hello_timeout_s: float = 5.0         # a connection that has not said hello by then is closed
    frame_timeout_s: float = 10.0        # once a frame has begun, the rest must arrive within this
    write_timeout_s: float = 10.0        # a peer that reads nothing of what is sent for this long is closed
    max_connections_per_uid: int = 64
    reserved_privileged_connections: int = 64  # of max_connections, only for root and the daemon's user
    max_subscriptions_per_connection: int = 1024
    max_subscriptions_per_uid: int = 4096  # over all connections of an unprivileged uid (its tasks' own included)
    max_batch_calls: int = 256
    # ---- write outcomes (docs/protocol.md, "Write outcomes") ----
    write_keys_per_connection: int = 256  # outcomes of keyed writes a connection's retries can learn ...
    write_key_bytes_per_connection: int = 256 << 10  # ... and their size (the oldest go first)
    write_key_ttl_s: float = 600.0       # how long one is kept
    write_outcome_wait_s: float = 60.0   # a write the SKB did not answer in time is followed this long more
    max_unsettled_writes_per_uid: int = 16  # writes of a uid answered OUTCOME_UNKNOWN and still under way
    max_tasks_per_uid: int = 256
    max_apps_per_uid: int = 64          # application names a uid may hold, persistent ones included
    app_max_facts: int = 100_000         # per application ...
    app_max_fact_bytes: int = 16 << 20   # ... characters of fact text
    app_max_clauses: int = 10_000
    app_max_clause_bytes: int = 4 << 20
    uid_max_facts: int = 200_000         # per uid, over all its applications
    uid_max_fact_bytes: int = 32 << 20
    uid_max_clauses: int = 20_000
    uid_max_clause_bytes: int = 8 << 20
    unprivileged_max_priority: int = 0   # highest task priority an unprivileged uid may give
    unprivileged_max_cores: int = 0      # most min_cores over a uid's tasks; 0: all CPUs but one
    # ---- the SKB server: defaults are the engine's own (skb/session.py, EngineConfig) ----
    direct_channel: bool = True          # offer clients a direct query socket to the SKB
    skb_memory_limit_bytes: int = EngineConfig.memory_limit_bytes  # the whole engine (RLIMIT_AS); it restarts when hit
    skb_thread_stack_bytes: int = EngineConfig.thread_stack_bytes  # the engine's writer (the daemon's changes)
    skb_query_stack_bytes: int = EngineConfig.query_stack_bytes  # a query's stacks, or, holding one of
    skb_large_stack_bytes: int = EngineConfig.large_stack_bytes  # skb_large_stacks grants, this
    skb_large_stacks: int = EngineConfig.large_stacks  # (docs/security.md, "Memory across the running queries")
    skb_app_slots: int = EngineConfig.app_slots  # queries of one application running at once
    skb_max_threads: int = EngineConfig.max_threads
    skb_worker_idle_s: float = EngineConfig.worker_idle_s
    skb_journal_compact_at: int = EngineConfig.journal_compact_at  # replay journal entries before it is compacted
    skb_user: str = EngineConfig.user    # the engine's unprivileged user when the daemon is root (else nobody)
    skb_uid_threads: int = EngineConfig.uid_threads  # queries of one unprivileged uid at once, both channels
    skb_reserved_privileged_threads: int = EngineConfig.reserved_privileged_threads  # for root and the daemon
    direct_idle_timeout_s: float = EngineConfig.direct_idle_timeout_s  # a silent direct connection is closed
    direct_max_connections: int = EngineConfig.direct_max_connections
    direct_max_connections_per_uid: int = EngineConfig.direct_max_connections_per_uid
    direct_reserved_privileged_connections: int = EngineConfig.direct_reserved_privileged_connections
    direct_max_pending: int = EngineConfig.direct_max_pending  # waiting for hello; a new one closes the oldest
    # ---- enforcement and monitoring (issue #6) ----
    enforce_mode: str = "auto"           # auto (sched_ext where scx_cod runs, else cpuset as root when mounted, else affinity) | affinity | cpuset | sched_ext | sched_ext,cpuset | sched_ext,affinity | none (rm/enforce/modes.py)
    scx_loader: str | None = None        # --enforce sched_ext: the scx_cod loader to run (None: the checkout's, PREFIX/libexec/cod/scx_cod, PATH)
    state_dir: str | None = None         # records of what was pinned, for crash cleanup; None: /run/cod as root
    cgroup_parent: str = "cod"           # the cpuset cgroup under which each task gets its own
    resctrl_root: str = "/sys/fs/resctrl"  # cache partitioning (MLS); no resctrl mount there: off (logged)
    memory_migrate: bool = True          # move a task's resident pages to its nodes, in bounded batches (issue 26)
    events_poll_interval_s: float = 0.1  # /proc polling when the proc connector is unavailable (not root)
    event_loop_rt_priority: int = 0      # 0: the event loop asks for the shortest slice; 1-99: SCHED_FIFO at
                                         # this priority (root; requests then run real-time too: enforce/slice.py)
    busy_detect: bool = True             # notice unregistered CPU hogs and keep tasks' cores away from them
    busy_interval_s: float = 0.1         # busy sampling period
    busy_threshold: float = 0.5          # cores a process must use ...
    busy_window: int = 3                 # ... over this many consecutive samples to count as a hog
    confine_others: bool | None = None   # put hogs on the cores left over; None: on when root
    busy_quiet_window: int = 20          # samples a hog must stay quiet before it is forgotten
    busy_scope: str = "all"              # which processes may be reported and confined: all | uids:0,1000 |
                                         # cgroup:/path | descendants:PID
    never_confine: str = "systemd,sshd,init,cod"  # comms (comma separated) never confined
    recompute_interval_s: float = 0.0    # periodic recomputation; 0: only on changes
    condition_timeout_s: float = 0.05    # time limit of one evaluation of a condition or derived property
    condition_round_s: float = 0.5       # an application's round of them in the SKB: none starts after it
    refresh_interval_s: float = 1.0      # live state (load, free memory, task CPU use and pages) into the SKB
    elastic_facts_refresh_s: float = 10.0  # a steady elastic group's facts are rewritten at most this often ...
    elastic_facts_load_step: float = 5.0  # ... unless its load moved by this many points (cores, state, transitions: at once)
    solver: str = "cpsat"                # cpsat (greedy fallback on time limit) | greedy | naive
    solver_time_limit_s: float = 1.0
    deploy_time_limit_s: float = 0.5     # deploy_plan: each exact search (CP-SAT) of the plan deployment
    # ---- deploy_plan is bounded (docs/security.md, "deploy_plan") ----
    deploy_max_operators: int = 2048     # operators in one graph ...
    deploy_max_edges: int = 8192         # ... edges ...
    deploy_max_graph_bytes: int = 512 << 10  # ... and bytes of it as compact JSON (more: -32031)
    deploy_plan_timeout_s: float = 10.0  # a planner process's whole run, start-up included (then killed: -32071)
    deploy_memory_limit_bytes: int = 1 << 30  # a planner process's address space (RLIMIT_AS; reached: -32031)
    deploy_plans_per_uid: int = 1        # plans one unprivileged uid may have in the making at once (more: -32070)
    deploy_max_planners: int = 2         # planner processes at once, all uids together (more: -32070)

    def socket_path(self) -> str:
        return self.socket or default_socket_path()

    def planning_only(self) -> bool:
        return self.machine is not None or self.hwloc is not None

    def wants_confinement(self, root: bool) -> bool:
        return root if self.confine_others is None else self.confine_others


from .enforce.modes import AUTO, MODES  # noqa: E402  (one list of enforcement modes)

ENFORCE_MODES = (AUTO, *MODES)
from .allocator.model import SOLVERS  # noqa: E402  (one list of solvers)
from .enforce.slice import RT_PRIORITY_MAX  # noqa: E402


_TYPES = {f.name: f.type for f in fields(RMConfig)}
_MAY_BE_ZERO = frozenset({"unprivileged_max_cores", "recompute_interval_s", "unprivileged_max_priority",
                          "event_loop_rt_priority"})


def _flag_value(kind: str, text: str) -> Any:
    """A --set value as the type its setting has (a TOML file gives typed values itself)."""
    if kind in ("bool", "bool | None") and text.lower() in ("true", "false", "yes", "no", "on", "off"):
        return text.lower() in ("true", "yes", "on")
    if kind == "int" and text.lstrip("-").isdigit():
        return int(text)
    if kind == "float":
        try:
            return float(text)
        except ValueError:
            return text
    return text


def parse_assignments(items: list[str] | None) -> dict[str, Any]:
    """``--set KEY=VALUE`` flags as settings (KEY as in the TOML file)."""
    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        name = key.strip().replace("-", "_")
        if not sep or name not in _TYPES:
            raise ConfigError(f"--set {item!r}: use KEY=VALUE with KEY one of {', '.join(sorted(_TYPES))}")
        # A mode is octal text ("0660"), never a decimal integer.
        text = value.strip()
        out[name] = _coerce(name, text if name == "socket_mode" else _flag_value(_TYPES[name], text), f"--set {key}")
    return out


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
        if isinstance(value, bool) or not isinstance(value, int) or value < (
                -PRIORITY_MAX if name == "unprivileged_max_priority" else 0 if name in _MAY_BE_ZERO else 1):
            raise ConfigError(f"{origin}: {name} must be a positive integer")
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value \
                or value == float("inf") or value < 0 or (value == 0 and name not in _MAY_BE_ZERO):
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
        data = loads_toml(read_bytes(path).decode("utf-8"))  # within user_input's size and depth
    except OSError as err:
        raise ConfigError(f"{path}: cannot read config file: {err.strerror}") from None
    except InputError as err:
        raise ConfigError(f"{path}: config file {err}") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: config file is not UTF-8 text: {err}") from None
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


def build_config(file: str | Path | None = None, sets: list[str] | None = None, **overrides: Any) -> RMConfig:
    """Defaults, then the TOML file, then ``--set KEY=VALUE`` flags, then the non-None overrides
    (the other command-line flags)."""
    settings: dict[str, Any] = load_toml(file) if file else {}
    settings.update(parse_assignments(sets))
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
    if cfg.event_loop_rt_priority > RT_PRIORITY_MAX:
        raise ConfigError(f"event_loop_rt_priority {cfg.event_loop_rt_priority} is above {RT_PRIORITY_MAX} "
                          "(0: no real-time priority; 1-99: SCHED_FIFO)")
    from .scope import ProcessScope

    try:
        ProcessScope.parse(cfg.busy_scope)
    except ValueError as err:
        raise ConfigError(f"busy_scope: {err}") from None
    if cfg.enforce_mode == "none":
        cfg = replace(cfg, enforce=False)
    if cfg.planning_only() and cfg.enforce:
        cfg = replace(cfg, enforce=False)  # planning for other hardware: nothing here to enforce
    if not cfg.enforce:
        cfg = replace(cfg, enforce_mode="none")
    return cfg

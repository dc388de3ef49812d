"""`cod rm`: start the SKB, load the machine, serve the socket until SIGTERM/SIGINT, then close cleanly."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

import uvloop

from cod.facts.text import count_noun
from cod.protocol.errors import CodError
from cod.protocol.jsonrpc import SHUTDOWN_EVENT, Request, notification

from .config import RMConfig
from .handlers import IMMEDIATE, dispatch
from .registry import Connection
from .service import ResourceManager
from .transport import Transport, apply_socket_permissions

if TYPE_CHECKING:
    from cod.skb import EngineConfig

log = logging.getLogger("cod.rm")


class StartupError(CodError):
    """The daemon cannot start; the message says why (socket in use, bad machine file, no SKB)."""


class MachineUnreadable(StartupError):
    """The machine the settings name cannot be read: an unknown name, a bad hwloc file (the user's
    input, where the rest of StartupError is the system's)."""


def setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger("cod")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def load_machine(cfg: RMConfig) -> Any:
    from cod.facts import FactsError, from_args

    try:
        return from_args(hwloc=cfg.hwloc, machine=cfg.machine, whole_system=cfg.whole_system)
    except FactsError as err:
        raise MachineUnreadable(str(err)) from None


def open_enforcer(cfg: RMConfig, root: bool) -> Any:
    """The enforcement backend `cfg` asks for (cod.rm.enforce.Enforcer), after undoing what a
    crashed previous run left behind (its cgroups, the affinity of processes it pinned)."""
    from .enforce import EnforceError, default_state_dir, detect
    from .enforce.cgroupfs import find_cpuset_mount
    from .enforce.scxmaps import scheduler_state

    mode = cfg.enforce_mode if cfg.enforce else "none"
    if mode == "auto" and root and scheduler_state() is None:
        mode = "sched_ext,cpuset"  # scx_cod runs: the scheduler carries out the allocation
    elif mode == "auto":
        mode = "cpuset" if root and find_cpuset_mount() is not None else "affinity"
    state_dir = cfg.state_dir or default_state_dir()
    supervisor = None
    try:
        supervisor = _start_scheduler(cfg, mode, root)
        enforcer = detect(mode, state_dir, root=root, cgroup_parent=cfg.cgroup_parent,
                          memory_migrate=cfg.memory_migrate, supervisor=supervisor)
        enforcer.cleanup_stale()
    except EnforceError as err:
        if supervisor is not None:
            supervisor.stop()
        raise StartupError(f"enforcement ({mode}): {err}") from None
    except OSError as err:  # e.g. a full file system: one line naming the directory, not a traceback
        if supervisor is not None:
            supervisor.stop()
        raise StartupError(f"enforcement ({mode}): cannot write to the state directory {state_dir}: "
                           f"{err.strerror or err} (free space there, or choose another with --state-dir)") from None
    return enforcer


def _start_scheduler(cfg: RMConfig, mode: str, root: bool) -> Any:
    """For ``--enforce sched_ext``: the scx_cod loader the daemon starts (a ScxSupervisor), or
    None when scx_cod already runs (someone else's: used, left running) or the mode names a
    fallback and the scheduler cannot run (a warning).  Refused with the reason otherwise."""
    from .enforce.modes import split_mode
    from .enforce.scxmaps import scheduler_state
    from .enforce.scxsupervisor import ScxSupervisor, find_loader, why_it_cannot_run

    primary, asked = split_mode(mode)
    if primary != "sched_ext" or scheduler_state() is None:
        return None
    loader = find_loader(cfg.scx_loader)
    why = why_it_cannot_run(loader, root=root)
    if why is not None and asked is not None:
        log.warning("enforcement: --enforce %s: scx_cod cannot run (%s); serving on %s", mode, why[0], asked)
        return None
    if why is not None:
        raise StartupError(f"--enforce sched_ext: {why[0]}: {why[1]}")
    assert loader is not None
    supervisor = ScxSupervisor(loader)
    supervisor.start()
    return supervisor


class Daemon:
    """One running RM: the SKB, the ResourceManager and its socket; usable in-process by tests.

    `enforcer` is a cod.rm.enforce.Enforcer; by default the daemon opens the one the
    config asks for (`--enforce`); a planning-only or --no-enforce daemon pins nothing."""

    def __init__(self, cfg: RMConfig, enforcer: Any = None, machine: Any = None, *,
                 root: bool | None = None) -> None:
        self.cfg = cfg
        # What the daemon may do (cgroups, proc connector, confining others); tests pass False
        # to run the unprivileged path as root.
        self.root = os.geteuid() == 0 if root is None else root
        self.machine = machine
        self.enforcer = enforcer
        self.monitor: Any = None
        self.cache: Any = None  # cod.rm.cache.CachePartitioning where resctrl is mounted
        self.rm: ResourceManager | None = None
        self.transport: Transport | None = None
        self._skb: Any = None
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        from .transport import SocketInUse, claim_socket_path

        try:
            claim_socket_path(self.cfg.socket_path())  # fail fast, before the SKB starts
        except SocketInUse as err:
            raise StartupError(str(err)) from None
        if self.machine is None:
            self.machine = load_machine(self.cfg)
        root = self.root
        watching = self.cfg.enforce  # a planning-only or --no-enforce daemon does not watch this machine
        if watching:
            if not root:
                log.warning("not root: no proc connector and no cgroups; process events by polling /proc "
                            "every %g s, enforcement by affinity only, busy processes not confined",
                            self.cfg.events_poll_interval_s)
            if self.enforcer is None:
                self.enforcer = open_enforcer(self.cfg, root)
        from cod.skb import AsyncSKB, native_libs

        from .enforce import NullEnforcer

        missing_helpers = native_libs.startup_warning()  # once, here: the engine restarts say nothing
        if missing_helpers:
            log.warning("%s", missing_helpers)

        enforcer = self.enforcer if self.enforcer is not None else NullEnforcer()
        engine = self._engine_config()
        direct = engine.direct_socket
        try:
            self._skb = await AsyncSKB.start(engine)
            await self._skb.load_machine(self.machine)
        except Exception as err:
            if self._skb is not None:
                await self._skb.close()
            self._close_enforcer()
            raise StartupError(f"cannot start the SKB: {err}") from None
        self.rm = ResourceManager(self.cfg, self.machine, self._skb, enforcer, direct_socket=direct)
        rm = self.rm
        if watching:
            from .monitor import Monitor

            skb = self._skb
            self.monitor = Monitor(rm, self.cfg, enforcer, root=root, skb_pid=lambda: skb.pid)
            self.monitor.start()
            # Elastic groups need the process events and the pinning of an enforcing daemon.
            from .elastic_groups import ElasticGroups

            rm.demands.elastic = ElasticGroups(rm, enforcer)
            self._open_cache(rm)

        async def handle(conn: Connection, req: Request) -> Any:
            return await dispatch(rm, conn, req)

        self.transport = Transport(
            self.cfg,
            new_connection=rm.sessions.new_connection,
            handle=handle,
            immediate=IMMEDIATE,
            connection_lost=rm.sessions.connection_lost,
            refusal=rm.sessions.connection_refusal,
        )
        try:
            await self.transport.start()
        except Exception as err:
            if self.monitor is not None:
                self.monitor.close()
            await self._skb.close()
            self._close_enforcer()
            raise StartupError(str(err)) from None
        log.info(
            "serving machine %s (%s, %s), enforcement %s, allocator %s (time limit %g s)",
            self.machine.name, count_noun(len(self.machine.cpu_ids()), "CPU"),
            count_noun(len(self.machine.numa_nodes), "NUMA node"),
            self.enforcer.describe() if self.enforcer is not None else "off (planning only)",
            self.cfg.solver, self.cfg.solver_time_limit_s,
        )

    def _engine_config(self) -> EngineConfig:
        """How the SKB engine is started: its user, its private directory and the daemon's limits."""
        from cod.skb import EngineConfig

        cfg = self.cfg
        # The engine's private directory (the only one it may write) holds the direct socket.
        private = f"{cfg.socket_path()}.skb.d"
        return EngineConfig(
            user=cfg.skb_user, private_dir=private,
            socket_permissions=lambda path: apply_socket_permissions(path, cfg),
            query_timeout_s=cfg.query_timeout_s, thread_stack_bytes=cfg.skb_thread_stack_bytes,
            query_stack_bytes=cfg.skb_query_stack_bytes, large_stack_bytes=cfg.skb_large_stack_bytes,
            large_stacks=cfg.skb_large_stacks,
            memory_limit_bytes=cfg.skb_memory_limit_bytes, app_slots=cfg.skb_app_slots,
            max_threads=cfg.skb_max_threads, worker_idle_s=cfg.skb_worker_idle_s,
            journal_compact_at=cfg.skb_journal_compact_at,
            uid_threads=cfg.skb_uid_threads, reserved_privileged_threads=cfg.skb_reserved_privileged_threads,
            direct_idle_timeout_s=cfg.direct_idle_timeout_s, direct_max_connections=cfg.direct_max_connections,
            direct_max_connections_per_uid=cfg.direct_max_connections_per_uid,
            direct_reserved_privileged_connections=cfg.direct_reserved_privileged_connections,
            direct_max_pending=cfg.direct_max_pending, direct_write_timeout_s=cfg.write_timeout_s,
            direct_socket=os.path.join(private, "direct.sock") if cfg.direct_channel else None,
            max_frame_bytes=cfg.max_frame_bytes,
            # An answer must fit in one of our frames, with room for the reply around it.
            max_reply_bytes=cfg.max_frame_bytes - 1024)

    def _open_cache(self, rm: ResourceManager) -> None:
        """Cache partitioning (MLS) where ``resctrl_root`` is a resctrl mount, after removing what a
        crashed run left there; off (logged) otherwise."""
        from .cache import CachePartitioning
        from .enforce import default_state_dir
        from .enforce.resctrl import open_resctrl

        try:
            backend = open_resctrl(self.cfg.resctrl_root, self.cfg.state_dir or default_state_dir())
        except Exception as err:  # EnforceError, OSError: CPU enforcement goes on without it
            log.warning("cache partitioning off: %s", err)
            return
        if backend is not None:
            self.cache = CachePartitioning(backend, self.machine, rm)
            rm.publisher.on_published.append(self.cache.refresh)
            rm.publisher.cache_partition = lambda: self.cache.last.text if self.cache else ""
            rm.cache = self.cache
            self._cache_sampler = asyncio.get_running_loop().create_task(self._sample_cache())

    async def _sample_cache(self) -> None:
        """llc_occupancy and mbm_total_bytes into the SKB every refresh period."""
        while self.cache is not None:
            await asyncio.sleep(self.cfg.refresh_interval_s)
            try:
                if self.cache is not None:
                    self.cache.sample()
            except Exception as err:
                log.warning("reading cache occupancy: %s", err)

    def _close_cache(self) -> None:
        if getattr(self, "_cache_sampler", None) is not None:
            self._cache_sampler.cancel()
        if self.cache is None:
            return
        try:
            self.cache.close()
        except Exception as err:
            log.warning("closing the cache partitioning: %s", err)
        self.cache = None

    def _close_enforcer(self) -> None:
        """Give every pinned process its original affinity back and remove our cgroups."""
        self._close_cache()
        if self.enforcer is None:
            return
        try:
            self.enforcer.close()
        except Exception as err:
            log.warning("closing the enforcement backend: %s", err)
        self.enforcer = None

    def request_stop(self, reason: str = "stopping") -> None:
        log.info("%s: shutting down", reason)
        self._stop_reason = reason
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def close(self) -> None:
        reason = getattr(self, "_stop_reason", "stopping")
        if self.monitor is not None:
            self.monitor.close()
        if self.rm is not None and self.rm.demands.elastic is not None:
            self.rm.demands.elastic.close()
        if self.rm is not None:
            await self.rm.close()
        self._close_enforcer()
        if self.transport is not None:
            await self.transport.close(notification(SHUTDOWN_EVENT, {"event": SHUTDOWN_EVENT, "reason": reason}))
        if self._skb is not None:
            try:
                await self._skb.close()
            except Exception as err:
                log.warning("closing the SKB: %s", err)
        log.info("stopped")


async def serve(cfg: RMConfig, enforcer: Any = None) -> None:
    daemon = Daemon(cfg, enforcer)
    # Before the start, not after it: a SIGTERM that came while the engine started, or just after the
    # socket began to accept, took the default action and killed the daemon without closing anything
    # (a test that stopped a daemon as soon as it could connect got -15 on a busy machine).
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.request_stop, signal.Signals(sig).name)
    await daemon.start()
    try:
        await daemon.wait_stopped()
    finally:
        await daemon.close()


def run(cfg: RMConfig, enforcer: Any = None) -> int:
    setup_logging(cfg.log_level)
    # Answers may hold integers of up to 100,000 digits (the SKB refuses larger ones):
    # the daemon re-encodes them for its clients.
    sys.set_int_max_str_digits(0)
    # uvloop: the same asyncio API at a fraction of the cost per wake-up,
    # which is most of a query's round trip (docs/design.md).
    uvloop.run(serve(cfg, enforcer))  # StartupError reaches the caller (`cod rm` prints it)
    return 0

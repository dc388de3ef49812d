"""`cod rm`: start the SKB, load the machine, serve the socket until SIGTERM/SIGINT, then close cleanly."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from dataclasses import replace
from typing import Any

from .config import RMConfig
from .enforcement import EnforcementHook, NoEnforcement
from .handlers import IMMEDIATE, dispatch
from .jsonrpc import Request, notification
from .server import Transport
from .service import ResourceManager
from .state import Connection

log = logging.getLogger("cod.rm")


class StartupError(Exception):
    """The daemon cannot start; the message says why (socket in use, bad machine file, no SKB)."""


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
        return from_args(hwloc=cfg.hwloc, machine=cfg.machine)
    except FactsError as err:
        raise StartupError(str(err)) from None


class Daemon:
    """One running RM: the SKB, the ResourceManager and its socket; usable in-process by tests."""

    def __init__(self, cfg: RMConfig, enforcer: EnforcementHook | None = None, machine: Any = None) -> None:
        if cfg.enforce and enforcer is None:
            log.warning("no enforcement backend is wired in yet: planning only, as with --no-enforce")
            cfg = replace(cfg, enforce=False)
        self.cfg = cfg
        self.machine = machine
        self.enforcer = enforcer or NoEnforcement()
        self.rm: ResourceManager | None = None
        self.transport: Transport | None = None
        self._skb: Any = None
        self._stopped = asyncio.Event()

    async def start(self) -> None:
        from .server import SocketInUse, claim_socket_path

        try:
            claim_socket_path(self.cfg.socket_path())  # fail fast, before the SKB starts
        except SocketInUse as err:
            raise StartupError(str(err)) from None
        if self.machine is None:
            self.machine = load_machine(self.cfg)
        from cod.skb import AsyncSKB

        try:
            self._skb = await AsyncSKB.start(query_timeout_s=self.cfg.query_timeout_s)
            await self._skb.load_machine(self.machine)
        except Exception as err:
            if self._skb is not None:
                await self._skb.close()
            raise StartupError(f"cannot start the SKB: {err}") from None
        self.rm = ResourceManager(self.cfg, self.machine, self._skb, self.enforcer)
        rm = self.rm

        async def handle(conn: Connection, req: Request) -> Any:
            return await dispatch(rm, conn, req)

        self.transport = Transport(
            self.cfg,
            new_connection=rm.new_connection,
            handle=handle,
            immediate=IMMEDIATE,
            connection_lost=rm.connection_lost,
        )
        try:
            await self.transport.start()
        except Exception as err:
            await self._skb.close()
            raise StartupError(str(err)) from None
        log.info(
            "serving machine %s (%d CPUs, %d NUMA nodes), enforcement %s",
            self.machine.name, len(self.machine.cpu_ids()), len(self.machine.numa_nodes),
            "on" if self.cfg.enforce else "off",
        )

    def request_stop(self, reason: str = "stopping") -> None:
        log.info("%s: shutting down", reason)
        self._stop_reason = reason
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def close(self) -> None:
        reason = getattr(self, "_stop_reason", "stopping")
        if self.rm is not None:
            await self.rm.close()
        if self.transport is not None:
            await self.transport.close(notification("shutdown", {"event": "shutdown", "reason": reason}))
        if self._skb is not None:
            try:
                await self._skb.close()
            except Exception as err:
                log.warning("closing the SKB: %s", err)
        log.info("stopped")


async def serve(cfg: RMConfig, enforcer: EnforcementHook | None = None) -> None:
    daemon = Daemon(cfg, enforcer)
    await daemon.start()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, daemon.request_stop, signal.Signals(sig).name)
    try:
        await daemon.wait_stopped()
    finally:
        await daemon.close()


def run(cfg: RMConfig, enforcer: EnforcementHook | None = None) -> int:
    setup_logging(cfg.log_level)
    asyncio.run(serve(cfg, enforcer))  # StartupError reaches the caller (`cod rm` prints it)
    return 0

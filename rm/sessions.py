"""Connections and the application names they use: who may connect, ``hello``, and what a
connection leaves behind when it goes.

Whose a name is (:class:`~.registry.Registry`'s ownership rules) and what a
uid may hold (:mod:`.quotas`) are decided elsewhere; this module applies them
when a connection arrives, says hello and leaves.
"""

from __future__ import annotations

import logging
import os
import secrets
from typing import Any, Awaitable, Callable

from cod.protocol import jsonrpc as rpc
from cod.protocol.jsonrpc import RpcError
from cod.skb import SKBError

from . import quotas
from .confusables import LOOK_ALIKE_RULE
from .config import RMConfig
from .knowledge import Knowledge, query_tag, skb_quietly
from .registry import Connection, Peer, Registry, Task, Usage, default_app_name

log = logging.getLogger("cod.rm")


class Sessions:
    def __init__(self, cfg: RMConfig, skb: Any, registry: Registry, knowledge: Knowledge,
                 direct_socket: str | None) -> None:
        self.cfg = cfg
        self.skb = skb
        self.registry = registry
        self.knowledge = knowledge
        self.direct_socket = direct_socket
        self.daemon_uid = os.geteuid()
        self.closing = False
        self.forget_task: Callable[[Task, str], Awaitable[None]] | None = None  # cod.rm.admission
        self.schedule: Callable[[str], int] = lambda reason: 0

    def privileged_uid(self, uid: int) -> bool:
        return uid in (0, self.daemon_uid)

    def new_connection(self, peer: Peer) -> Connection:
        return self.registry.add_connection(peer, self.privileged_uid(peer.uid))

    def connection_refusal(self, peer: Peer, open_connections: int) -> str | None:
        """Why a new connection from ``peer`` is refused (None: accepted)."""
        if self.privileged_uid(peer.uid):
            return None if open_connections < self.cfg.max_connections else "too many connections"
        if open_connections >= self.cfg.max_connections - self.cfg.reserved_privileged_connections:
            return "too many connections (the rest are reserved for root)"
        if self.registry.uid_connections(peer.uid) >= self.cfg.max_connections_per_uid:
            return f"uid {peer.uid} already has {self.cfg.max_connections_per_uid} connections (max_connections_per_uid)"
        return None

    def subscription_refusal(self, conn: Connection) -> str | None:
        """Why ``conn`` may not make one more subscription (None: it may)."""
        return quotas.subscription_refusal(self.cfg, self.registry, conn)

    def name_refusal(self, conn: Connection, app: str) -> str | None:
        """Why ``conn`` may not use (or read) application ``app`` (None: it may)."""
        return self.registry.name_refusal(conn.peer.uid, app, conn.privileged)

    async def hello(self, conn: Connection, app: str | None) -> dict[str, Any]:
        if app is None:
            app = conn.app or default_app_name(conn.peer.uid, conn.peer.pid)
        refusal = self.name_refusal(conn, app)
        if refusal is not None:
            raise RpcError(rpc.PERMISSION_DENIED, refusal)
        if conn.app is not None and conn.app != app:
            raise RpcError(rpc.INVALID_PARAMS, f"hello: this connection already uses application {conn.app!r}")
        alike = self.registry.app_look_alike(app)
        if alike is not None:
            raise RpcError(rpc.ALREADY_EXISTS, f"hello: application name {app!r} looks like {alike!r}, an application "
                                               f"already in use ({LOOK_ALIKE_RULE}); choose one that does not",
                           {"looks_like": alike})
        too_many = quotas.app_name_refusal(self.cfg, self.registry, conn.peer.uid, conn.privileged, app)
        if too_many is not None:
            raise RpcError(rpc.QUOTA_EXCEEDED, f"hello: {too_many}")
        self.registry.claim_app(conn, app)
        conn.hello = True
        direct = None
        if self.direct_socket is not None:
            if conn.token is None:
                conn.token = secrets.token_hex(16)
                try:
                    await self.skb.grant(conn.token, app, (conn.peer.uid, conn.privileged))
                except SKBError as err:
                    log.warning("no direct channel for connection %d: %s", conn.id, err)
                    conn.token = None
            if conn.token is not None:
                direct = {"socket": self.direct_socket, "token": conn.token, "protocol": rpc.PROTOCOL_VERSION}
        return {"app": app, "skb": direct}

    async def connection_lost(self, conn: Connection) -> None:
        gone, _ = self.registry.remove_connection(conn.id)
        self.knowledge.forget_connection(conn.id)
        if self.closing:  # close() has released every task and the SKB goes away next
            return
        # Its queries still queued in the engine are answered without running: nobody reads them.
        await skb_quietly(self.skb.abandon(query_tag(conn)), f"abandoning the queries of connection {conn.id}")
        if conn.token is not None:
            await skb_quietly(self.skb.revoke(conn.token), f"revoking the capability of connection {conn.id}")
        for task in gone:
            if self.forget_task is not None:
                await self.forget_task(task, "client disconnected")
        app = conn.app
        if app is not None:
            # Under the uid's write lock: a registration into the same application by a new connection
            # of that uid (a client that reconnects) must not be evaluated while the engine releases
            # the application (it saw the namespace half released: "the query has no solution").
            async with self.knowledge.uid_lock(conn.peer.uid):
                await self._leave_app(app, conn.id)
        if gone:
            self.schedule(f"task {gone[0].name} left" if len(gone) == 1 else f"{len(gone)} tasks left")

    async def _leave_app(self, app: str, conn_id: int) -> None:
        reply = await skb_quietly(self.skb.drop_owner(app, conn_id), f"dropping the facts of connection {conn_id}")
        if reply is not None:
            self.registry.usage[app] = Usage.from_reply(reply.get("usage"))
        if not self.registry.app_connections(app):
            reply = await skb_quietly(self.skb.release_app(app), f"releasing application {app}")
            if reply is not None:
                self.registry.usage[app] = Usage.from_reply(reply.get("usage"))
            self.registry.release_name(app)

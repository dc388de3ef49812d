"""Transport: the Unix socket, peer credentials, framing, per-connection request order, and time limits.

One asyncio task reads each connection and feeds a bounded queue; a second task
runs that connection's requests in order (so a client may pipeline
`add_facts` then `execute_query`).  The queue bound is the backpressure: a peer
that floods requests stops being read, so the daemon's memory stays bounded.

Every peer is bounded in time as well (docs/security.md, "The threat model"): it
must say hello within ``hello_timeout_s``; once a frame has begun, its bytes
must arrive within ``frame_timeout_s``; what the daemon sends must be read
within ``write_timeout_s``.  A peer that does not is disconnected, with a
reason when it can still read one.  What is sent (replies and upcalls alike)
goes through one door, :meth:`Transport.write`, under one bound: a peer for
which the daemon holds more than ``max_output_buffer_bytes``, or bytes that
waited ``write_timeout_s`` (:class:`Backlog`), is disconnected, and its
state is cleaned up as when it leaves.  Who may connect at all (per-uid caps,
the share kept for root) is asked of the ResourceManager.
Everything about what a request *means* lives in `cod.rm.handlers`.
"""

from __future__ import annotations

import asyncio
import errno
import grp
import logging
import os
import pwd
import socket
import stat
import struct
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from cod.protocol.errors import CodError
from cod.protocol.framing import FrameDecoder, FrameError, encode
from cod.protocol.jsonrpc import (
    HELLO_REQUIRED,
    INTERNAL_ERROR,
    INVALID_REQUEST,
    TIMED_OUT,
    TOO_BUSY,
    RpcError,
    Request,
    error_response,
    parse_request,
    response,
)

from . import quotas, shown
from .config import RMConfig
from .registry import Connection, Peer

log = logging.getLogger("cod.rm.transport")

_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
# The mode of each directory of the socket path that the daemon creates (claim_socket_path).
SOCKET_DIR_MODE = 0o755
READ_CHUNK = 256 << 10
# Messages queued within this time of each other count as queued at the first one's time: a
# peer's backlog keeps a few marks per second, not one per message.
BACKLOG_GRAIN_S = 0.05


class SocketInUse(CodError):
    """Another daemon answers on the socket path."""


def peer_credentials(sock: socket.socket) -> Peer:
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    pid, uid, gid = _PEERCRED.unpack(raw)
    return Peer(pid=pid, uid=uid, gid=gid)


def _make_socket_dirs(directory: str) -> None:
    # 0755, not the umask's: clients of any user must reach the socket, whose own mode and owner
    # (socket_mode, socket_owner) say who may connect.
    missing: list[str] = []
    while directory and not os.path.isdir(directory):
        missing.append(directory)
        directory = os.path.dirname(directory.rstrip("/"))
    for created in reversed(missing):
        os.makedirs(created, exist_ok=True)
        os.chmod(created, SOCKET_DIR_MODE)


def claim_socket_path(path: str) -> None:
    """Make `path` free to bind: create its missing directories (mode 0755, whatever the umask),
    remove a stale socket left by a crash, refuse a live one."""
    _make_socket_dirs(os.path.dirname(path) or ".")
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketInUse(f"{path} exists and is not a socket; remove it or choose another --socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(path)
    except OSError as err:
        if err.errno in (errno.ECONNREFUSED, errno.ENOENT):
            log.warning("removing stale socket %s left by a daemon that is gone", path)
            os.unlink(path)
            return
        raise SocketInUse(f"cannot probe existing socket {path}: {err.strerror}") from None
    finally:
        probe.close()
    raise SocketInUse(f"another COD RM is already serving on {path}")


def apply_socket_permissions(path: str, cfg: RMConfig) -> None:
    uid = gid = -1
    if cfg.socket_owner is not None:
        uid = int(cfg.socket_owner) if cfg.socket_owner.isdigit() else pwd.getpwnam(cfg.socket_owner).pw_uid
    if cfg.socket_group is not None:
        gid = int(cfg.socket_group) if cfg.socket_group.isdigit() else grp.getgrnam(cfg.socket_group).gr_gid
    if uid != -1 or gid != -1:
        os.chown(path, uid, gid)
    os.chmod(path, cfg.socket_mode)


class Backlog:
    """How long the bytes queued for one peer have waited to be taken by the kernel (no I/O: the
    transport says how many it still holds).  Only what did not go out at once is remembered."""

    def __init__(self) -> None:
        self._queued = 0  # bytes queued since the connection began
        self._marks: deque[tuple[int, float]] = deque()  # (bytes queued up to, when), oldest first

    def queued(self, nbytes: int, unsent: int, now: float) -> None:
        """``nbytes`` more were queued at ``now``; ``unsent`` bytes are held after it."""
        self._queued += nbytes
        if not unsent:
            return
        if self._marks and now - self._marks[-1][1] < BACKLOG_GRAIN_S:
            self._marks[-1] = (self._queued, self._marks[-1][1])  # counted as older: never cut off later
        else:
            self._marks.append((self._queued, now))

    def oldest(self, unsent: int) -> float | None:
        """When the oldest of the ``unsent`` bytes still held was queued (None: nothing waits)."""
        taken = self._queued - unsent
        while self._marks and self._marks[0][0] <= taken:
            self._marks.popleft()
        return self._marks[0][1] if self._marks else None


@dataclass
class _Output:
    """What the transport keeps of one peer's output."""

    peer: Peer
    backlog: Backlog = field(default_factory=Backlog)
    timer: asyncio.TimerHandle | None = None  # when its backlog is next due


# A request handler: (connection, request) -> result, raising RpcError for error replies.
Handler = Callable[[Connection, Request], Awaitable[Any]]


class Transport:
    def __init__(
        self,
        cfg: RMConfig,
        *,
        new_connection: Callable[[Peer], Connection],
        handle: Handler,
        immediate: frozenset[str],
        connection_lost: Callable[[Connection], Awaitable[None]],
        refusal: Callable[[Peer, int], str | None] = lambda peer, n: None,
    ) -> None:
        self.cfg = cfg
        self._new_connection = new_connection
        self._handle = handle
        self._immediate = immediate  # methods answered at once, ahead of the connection's queue
        self._connection_lost = connection_lost
        self._refusal = refusal  # (peer, connections open) -> why it may not connect, or None
        self._server: asyncio.base_events.Server | None = None
        self._writers: dict[int, asyncio.StreamWriter] = {}
        self._outputs: dict[int, _Output] = {}  # by connection id, as _writers
        self._conn_tasks: set[asyncio.Task[None]] = set()
        self._buffered_input = 0  # bytes of incomplete frames held for all connections
        self.path = cfg.socket_path()

    async def start(self) -> None:
        claim_socket_path(self.path)
        self._server = await asyncio.start_unix_server(
            self._on_connect, path=self.path, limit=READ_CHUNK, backlog=1024
        )
        apply_socket_permissions(self.path, self.cfg)
        log.info("listening on %s", self.path)

    @property
    def connection_count(self) -> int:
        return len(self._writers)

    # ---- output ----------------------------------------------------------------------------
    def send(self, conn: Connection, message: dict[str, Any]) -> None:
        """Queue one message (a reply or an upcall) for ``conn``."""
        if conn.id not in self._writers:
            return
        try:
            frame = encode(message, self.cfg.max_frame_bytes)
        except FrameError as err:
            frame = encode(error_response(message.get("id"), RpcError(INTERNAL_ERROR, f"reply too large: {err}")))
        self.write(conn.id, frame)

    def write(self, conn_id: int, frames: bytes) -> None:
        """Queue encoded frames: every byte for a peer goes this way, under the peer's output bound."""
        writer = self._writers.get(conn_id)
        if writer is None or writer.is_closing():
            return
        writer.write(frames)
        self._outputs[conn_id].backlog.queued(len(frames), writer.transport.get_write_buffer_size(),
                                              asyncio.get_running_loop().time())
        self._check_output(conn_id)

    def _check_output(self, conn_id: int) -> None:
        """Disconnect a peer over its output bound; else watch the bytes it has yet to take."""
        writer = self._writers.get(conn_id)
        if writer is None or writer.is_closing():
            return
        loop = asyncio.get_running_loop()
        out = self._outputs[conn_id]
        unsent = writer.transport.get_write_buffer_size()
        oldest = out.backlog.oldest(unsent)
        why = quotas.output_refusal(self.cfg, unsent, None if oldest is None else loop.time() - oldest)
        if why is not None:
            self._cut_off(conn_id, why)
        elif oldest is not None and out.timer is None:
            out.timer = loop.call_at(oldest + self.cfg.write_timeout_s, self._output_due, conn_id)

    def _output_due(self, conn_id: int) -> None:
        out = self._outputs.get(conn_id)
        if out is not None:
            out.timer = None
            self._check_output(conn_id)

    def _cut_off(self, conn_id: int, why: str) -> None:
        """Disconnect a peer that does not read (once; it cannot read a reason): its reader sees the
        end of the stream and the connection is cleaned up as when a client leaves."""
        writer = self._writers.get(conn_id)
        if writer is None or writer.is_closing():
            return
        peer = self._outputs[conn_id].peer
        log.warning("connection %d (pid %d uid %d) does not read what is sent: %s (%d bytes unread); closing it",
                    conn_id, peer.pid, peer.uid, why, writer.transport.get_write_buffer_size())
        writer.transport.abort()

    # ---- input -----------------------------------------------------------------------------
    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conn_tasks.add(task)
        try:
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            pass  # the daemon is closing; the connection is closed below
        finally:
            self._conn_tasks.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        peer = peer_credentials(sock)
        why = self._refusal(peer, len(self._writers))
        if why is not None:
            writer.write(encode(error_response(None, RpcError(TOO_BUSY, why))))
            writer.close()
            return
        conn = self._new_connection(peer)
        self._writers[conn.id] = writer
        self._outputs[conn.id] = _Output(peer)
        conn.send = lambda msg, _c=conn: self.send(_c, msg)
        conn.write = lambda frames, _id=conn.id: self.write(_id, frames)
        log.debug("connection %d from pid %d uid %d", conn.id, peer.pid, peer.uid)
        queue: asyncio.Queue[Request | None] = asyncio.Queue(self.cfg.max_inflight_per_connection)
        worker = asyncio.create_task(self._run_queue(conn, queue, writer))
        decoder = FrameDecoder(self.cfg.max_frame_bytes)
        held = 0  # this connection's share of self._buffered_input
        loop = asyncio.get_running_loop()
        hello_by = loop.time() + self.cfg.hello_timeout_s
        try:
            while True:
                # How long this peer may stay silent: until its hello is due, or (inside a
                # frame) until the frame is due; between frames of a greeted peer, for ever.
                if not conn.hello:
                    wait = hello_by - loop.time()
                    late = RpcError(HELLO_REQUIRED, f"no hello within {self.cfg.hello_timeout_s:g} s; closing")
                elif decoder.pending_bytes:
                    wait = self.cfg.frame_timeout_s
                    late = RpcError(TIMED_OUT, f"a frame was not completed within {self.cfg.frame_timeout_s:g} s; closing")
                else:
                    wait, late = None, None
                try:
                    data = await asyncio.wait_for(reader.read(READ_CHUNK), wait) if wait is not None \
                        else await reader.read(READ_CHUNK)
                except TimeoutError:
                    assert late is not None
                    if conn.hello and not decoder.pending_bytes:
                        continue  # its hello was answered meanwhile: it may be silent now
                    self.send(conn, error_response(None, late))
                    log.info("connection %d (pid %d uid %d): %s", conn.id, peer.pid, peer.uid, late.message)
                    break
                if not data:
                    if decoder.pending_bytes:
                        log.info("connection %d closed in the middle of a frame", conn.id)
                    break
                try:
                    bodies = decoder.feed(data)
                except FrameError as err:
                    # The stream cannot be resynchronised: say why, then hang up.
                    self.send(conn, error_response(None, RpcError(INVALID_REQUEST, str(err))))
                    log.info("connection %d: %s; closing", conn.id, err)
                    break
                self._buffered_input += decoder.pending_bytes - held
                held = decoder.pending_bytes
                if held and self._buffered_input > self.cfg.max_buffered_input_bytes:
                    # Many peers each holding a large half-sent frame: refuse the one that adds more.
                    self.send(conn, error_response(None, RpcError(
                        TOO_BUSY, "the daemon holds too many incomplete frames; send whole frames")))
                    log.warning("connection %d: input budget exhausted; closing", conn.id)
                    break
                await self._requests(conn, bodies, queue)
        except (ConnectionError, OSError):
            pass
        except asyncio.CancelledError:
            pass
        finally:
            self._buffered_input -= held
            await self._stop_worker(queue, worker)
            self._writers.pop(conn.id, None)
            out = self._outputs.pop(conn.id, None)
            if out is not None and out.timer is not None:
                out.timer.cancel()
            try:
                await self._connection_lost(conn)
            except Exception:  # never let one client's cleanup kill the daemon
                log.exception("cleaning up connection %d failed", conn.id)
            writer.close()

    async def _requests(self, conn: Connection, bodies: list[bytes], queue: asyncio.Queue[Request | None]) -> None:
        """Answer the frames' requests: a bad one at once, an immediate one now, the others in order."""
        for body in bodies:
            try:
                req = parse_request(body)
            except RpcError as err:
                rid = (err.data or {}).get("id")
                err.data = None
                self.send(conn, error_response(None if shown.request_id_problem(rid) else rid, err))
                continue
            too_big = shown.request_id_problem(req.id)
            if too_big is not None:  # not echoed: the reply carries id null (JSON-RPC 2.0, section 5)
                self.send(conn, error_response(None, RpcError(INVALID_REQUEST, too_big)))
                continue
            if req.method in self._immediate:
                await self._answer(conn, req)
            else:
                await queue.put(req)

    async def _stop_worker(self, queue: asyncio.Queue[Request | None], worker: asyncio.Task[None]) -> None:
        """Stop a connection's worker once the request it is running is done; drop the ones not begun.

        Cancelling it instead could interrupt an SKB exchange: the engine's reply would then be
        read as the answer to the next request of another client (seen when a client was killed
        right after registering).  A request cannot run longer than the query time limit."""
        while not queue.empty():
            queue.get_nowait()
        queue.put_nowait(None)
        try:
            await asyncio.wait_for(asyncio.shield(worker), self.cfg.query_timeout_s + 2.0)
        except TimeoutError:
            worker.cancel()
        except asyncio.CancelledError:
            pass  # the daemon is closing: the worker finishes on its own (or the SKB closes under it)
        except Exception:
            pass

    async def _run_queue(
        self, conn: Connection, queue: asyncio.Queue[Request | None], writer: asyncio.StreamWriter
    ) -> None:
        gone = False  # the peer is cut off: what it still asked for is dropped, never left blocking _serve
        while True:
            req = await queue.get()
            if req is None:
                return
            if gone:
                continue
            await self._answer(conn, req)
            try:
                # Backpressure: the next request waits until this reply is on its way.
                await asyncio.wait_for(writer.drain(), self.cfg.write_timeout_s)
            except TimeoutError:
                self._cut_off(conn.id, f"a reply was not read within {self.cfg.write_timeout_s:g} s (write_timeout_s)")
                gone = True
            except (ConnectionError, OSError):
                gone = True

    async def _answer(self, conn: Connection, req: Request) -> None:
        try:
            result = await self._handle(conn, req)
            reply = response(req.id, result)
        except RpcError as err:
            # Bounded, whatever the request held (a 5,000-digit number is not sent back whole).
            err.message = shown.message(err.message)
            if err.data:
                err.data = {k: shown.datum(v) for k, v in err.data.items()}
            reply = error_response(req.id, err)
        except asyncio.CancelledError:
            raise
        except Exception as err:
            log.exception("internal error in %s", req.method)
            reply = error_response(req.id, RpcError(INTERNAL_ERROR, f"internal error: {type(err).__name__}: {err}"))
        if req.id is not None:
            self.send(conn, reply)

    # ---- shutdown --------------------------------------------------------------------------
    async def close(self, farewell: dict[str, Any] | None) -> None:
        """Stop accepting, tell every client, close every connection and remove the socket file."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers.values()):
            if farewell is not None and not writer.is_closing():
                try:
                    writer.write(encode(farewell))
                except Exception:
                    pass
        for writer in list(self._writers.values()):
            try:
                await asyncio.wait_for(writer.drain(), 0.5)
            except Exception:
                pass
            writer.close()
        for task in list(self._conn_tasks):
            task.cancel()
        if self._conn_tasks:
            await asyncio.wait(list(self._conn_tasks), timeout=2.0)
        try:
            if self._server is not None:
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
        except Exception:
            pass
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

"""One engine process's conversation, without I/O: shared by the sync and async drivers.

The drivers (:mod:`.engine`, :mod:`.async_engine`) move bytes; this module
knows everything else: how the engine is started (:class:`EngineConfig`),
request ids, reply lines arriving in any order, the journal of writes and
its compaction, and what to replay after a restart.  Keeping it in one
place is what keeps the two drivers from drifting apart.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from cod.protocol.jsonrpc import skb_rpc_codes

from . import codec
from .codec import Op
from .errors import SKBError
from .journal import Journal

log = logging.getLogger("cod.skb")

PROLOG_DIR = Path(__file__).resolve().parent / "prolog"
SERVER_FILE = PROLOG_DIR / "cod_server.pl"

# Grace on top of a query's own time limit before its caller stops waiting
# (the limit is enforced inside Prolog; this is the backstop).
WATCHDOG_GRACE_S = 2.0
# An engine's start: each STARTUP_TIMEOUT_S without its ready line, it must have used
# STARTUP_PROGRESS_CPU_S of CPU to be waited for again, up to STARTUP_MAX_WAIT_S in all (at load
# 50-70 on 2 CPUs its ~1 s of start-up CPU took over 20 s of wall time: "did not start").
STARTUP_TIMEOUT_S = 20.0
STARTUP_MAX_WAIT_S = 180.0
STARTUP_PROGRESS_CPU_S = 0.1
MAX_REPLY_BYTES = 64 << 20
# A snapshot of the whole state (for the journal) may be larger than any reply to a caller.
MAX_LINE_BYTES = 1 << 30


def library_dir() -> Path:
    """The SKB's stored procedures: `$COD_STORED_PROCEDURES`, else those installed with the package."""
    env = os.environ.get("COD_STORED_PROCEDURES")
    if env:
        return Path(env)
    import cod.stored_procedures

    return Path(cod.stored_procedures.__file__).resolve().parent


def library_files(directory: Path | None = None) -> list[Path]:
    d = directory or library_dir()
    return sorted(d.glob("*.pl")) if d.is_dir() else []


@dataclass
class EngineConfig:
    """How an engine process is started and what its callers may ask of it."""

    query_timeout_s: float = 5.0
    inference_limit: int | None = 10_000_000
    thread_stack_bytes: int = 256 << 20  # stack limit of the engine's writer thread (the daemon's changes)
    # Clients' work runs under query_stack_bytes, and under large_stack_bytes while it holds one of
    # large_stacks grants (skb/prolog/cod_grants.pl; docs/security.md, "Memory across the running queries").
    query_stack_bytes: int = 4 << 20
    large_stack_bytes: int = 128 << 20
    large_stacks: int = 4
    memory_limit_bytes: int | None = 4 << 30  # RLIMIT_AS of the whole engine process
    app_slots: int = 4  # queries of one application running at once
    max_threads: int = 256
    worker_idle_s: float = 10.0  # an idle query worker (beyond 4) leaves after this
    uid_threads: int = 16  # queries of one unprivileged uid running at once
    reserved_privileged_threads: int = 32  # of max_threads, for root and the daemon only
    direct_idle_timeout_s: float = 120.0  # a greeted direct connection silent this long is closed
    direct_max_connections: int = 1024
    direct_max_connections_per_uid: int = 64  # of an unprivileged uid
    direct_reserved_privileged_connections: int = 64  # of direct_max_connections
    direct_max_pending: int = 64  # direct connections waiting for their hello (a new one closes the oldest)
    direct_write_timeout_s: float = 10.0  # a direct connection that reads nothing of an answer this long is closed
    max_reply_bytes: int = MAX_REPLY_BYTES
    bulk_reply_chars: int = 65536  # a reply longer than this waits behind small ones (cod_server.pl)
    journal_compact_at: int = Journal.COMPACT_AT_LEAST  # entries before the journal's first compaction
    direct_socket: str | None = None  # the direct query channel's socket, or none
    max_frame_bytes: int = 1 << 20
    load_library: bool = True
    library_dir: Path | None = None
    swipl: str = field(default_factory=lambda: shutil.which("swipl") or "swipl")
    # ---- the engine's privileges (skb/lockdown.py, docs/security.md "The threat model") ----
    user: str = "cod-skb"  # whom the engine runs as when started by root (falls back to nobody)
    private_dir: str | None = None  # the one directory it may write (None: a fresh temporary one)
    landlock: bool = True  # False: as on a kernel without Landlock (tests)
    # Called with the direct socket's path after every start of the engine (mode, owner, group).
    socket_permissions: Callable[[str], None] | None = None

    def command(self) -> list[str]:
        args = {
            "app-slots": self.app_slots,
            "max-threads": self.max_threads,
            "worker-idle-s": self.worker_idle_s,
            "uid-threads": self.uid_threads, "reserved-privileged-threads": self.reserved_privileged_threads,
            "idle-timeout": self.direct_idle_timeout_s, "max-connections": self.direct_max_connections,
            "max-connections-per-uid": self.direct_max_connections_per_uid,
            "reserved-privileged-connections": self.direct_reserved_privileged_connections,
            "max-pending": self.direct_max_pending, "write-timeout": self.direct_write_timeout_s,
            "thread-stack": self.thread_stack_bytes,
            "query-stack": self.query_stack_bytes, "large-stack": self.large_stack_bytes,
            "large-stacks": self.large_stacks,
            "max-reply-bytes": self.max_reply_bytes,
            "bulk-reply-chars": self.bulk_reply_chars,
            "max-frame-bytes": self.max_frame_bytes,
            "max-time-limit": self.query_timeout_s,
            "inference-limit": self.inference_limit or 10_000_000,
            "rpc-codes": skb_rpc_codes(),
        }
        if self.direct_socket:
            args["direct-socket"] = self.direct_socket
        cmd = [self.swipl, "-q", "-f", "none", f"--stack-limit={self.thread_stack_bytes // 1024}k",
               "-g", "cod_server:main", "-t", "halt", str(SERVER_FILE), "--"]
        for key, value in args.items():
            cmd += [f"--{key}", str(value)]
        return cmd

    def query_op(self, app: str, goal: str, all_solutions: bool, timeout_s: float | None,
                 max_solutions: int, tag: str | None = None,
                 client: codec.Client | None = None) -> tuple[Op, float]:
        """The engine operation for a query, and the time limit it runs under."""
        timeout = self.query_timeout_s if timeout_s is None else min(timeout_s, self.query_timeout_s)
        op = codec.query(app, goal, all_solutions=all_solutions, max_solutions=max_solutions,
                         timeout_s=timeout, inference_limit=self.inference_limit, tag=tag, client=client)
        return op, timeout

    def library_files(self) -> list[Path]:
        return library_files(self.library_dir) if self.load_library else []


class Session:
    """Requests and replies of one engine process, and the journal that can rebuild it."""

    def __init__(self, journal_compact_at: int | None = None) -> None:
        self.journal = Journal(journal_compact_at)
        self._next_id = 0
        self._buffer = bytearray()

    def reset(self) -> None:
        """A new engine process: nothing is buffered, ids go on (a stale reply can never match),
        and a snapshot asked of the old one will not come."""
        self._buffer.clear()
        self.journal.snapshot_lost()

    def request(self, op: Op) -> tuple[int, bytes]:
        self._next_id += 1
        return self._next_id, codec.encode_request(self._next_id, op)

    def feed(self, data: bytes) -> list[bytes]:
        """Complete reply lines in ``data`` (and what came before it)."""
        self._buffer += data
        if len(self._buffer) > MAX_LINE_BYTES and b"\n" not in self._buffer:
            self._buffer.clear()
            raise SKBError("resource", f"a reply line larger than {MAX_LINE_BYTES} bytes")
        lines = []
        while True:
            nl = self._buffer.find(b"\n")
            if nl < 0:
                return lines
            lines.append(bytes(self._buffer[:nl]))
            del self._buffer[: nl + 1]

    @staticmethod
    def ready(line: bytes | None) -> bool:
        return line is not None and line.strip() == b'{"ready":true}'

    @staticmethod
    def decode(line: bytes) -> tuple[int, Any] | None:
        """(request id, result) of a reply line.  A line that names no request (the engine's
        own fault) is logged and skipped, by both drivers alike: it cannot be given to a
        caller, and the caller whose reply it may have been gets the timeout error."""
        try:
            return codec.decode_reply(line)
        except SKBError as err:
            log.error("SKB engine: %s", err.message)
            return None

    def succeeded(self, op: Op, rid: int) -> bool:
        """Record the write of request ``rid``, which succeeded; True when the journal should be
        compacted now (then :meth:`snapshot_request` asks for the snapshot)."""
        self.journal.record(op, rid)
        return self.journal.needs_compaction()

    def snapshot_request(self) -> tuple[int, bytes]:
        """The request for a snapshot that :meth:`compact` folds into the journal."""
        rid, line = self.request(codec.snapshot())
        self.journal.snapshot_requested(rid)
        return rid, line

    def compact(self, rid: int, snapshot: dict[str, Any]) -> None:
        self.journal.compact(snapshot, rid)

    def replay_ops(self) -> list[Op]:
        return self.journal.ops()


def timeout_for(op: Op, config: EngineConfig, timeout_s: float | None) -> float:
    """How long a caller waits for ``op``'s reply before giving up on it."""
    base = config.query_timeout_s if timeout_s is None else timeout_s
    return base + WATCHDOG_GRACE_S


__all__ = ["EngineConfig", "Session", "SKBError", "library_dir", "library_files",
           "STARTUP_TIMEOUT_S", "STARTUP_MAX_WAIT_S", "STARTUP_PROGRESS_CPU_S", "WATCHDOG_GRACE_S", "MAX_REPLY_BYTES"]

"""Process events: fork, exec and exit as they happen.

Three sources with one shape, all fit for ``loop.add_reader(src.fileno(), ...)``
followed by ``src.read_events()``:

* `ConnectorSource` -- the kernel's proc connector (netlink, CN_IDX_PROC),
  root only.  Events arrive within a millisecond of the fork/exit.
* `cod.rm.enforce.bpfevents.BpfSource` -- tp_btf programs on the process
  tracepoints feeding a ring buffer, root only, chosen first where it loads.
* `PollingSource` -- scans /proc at an interval and reports what appeared and
  vanished (no root needed).  Its fileno() is a timerfd that fires every
  interval, so the RM's loop treats both alike.

We read the netlink socket ourselves rather than through pyroute2's
ProcEventSocket.get(): pyroute2 0.9.7 reads several datagrams into its own
buffer per call, after which the socket no longer polls readable while events
wait in that buffer, which breaks an event loop's add_reader (measured: 4 of 9
events seen).  The wire format is small and stable (include/uapi/linux/cn_proc.h).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import socket
import struct
import time
from dataclasses import dataclass

from cod.facts import procfs

from .errors import EnforceError

log = logging.getLogger("cod.rm.enforce")

NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
NLMSG_DONE = 3
PROC_CN_MCAST_LISTEN = 1
PROC_CN_MCAST_IGNORE = 2
PROC_EVENT_FORK = 0x1
PROC_EVENT_EXEC = 0x2
PROC_EVENT_COMM = 0x200
PROC_EVENT_EXIT = 0x80000000

NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid
CN_MSG = struct.Struct("=IIIIHH")  # idx, val, seq, ack, len, flags
EV_HEAD = struct.Struct("=IIQ")  # what, cpu, timestamp_ns
FORK = struct.Struct("=IIII")  # parent pid, parent tgid, child pid, child tgid
EXEC = struct.Struct("=II")  # pid, tgid
COMM = struct.Struct("=II16s")  # pid, tgid, the new name (NUL-padded)
EXIT = struct.Struct("=IIIIII")  # pid, tgid, exit code, exit signal, parent pid, parent tgid
RCVBUF = 4 << 20  # room for bursts (a build spawning thousands of processes)


@dataclass(frozen=True)
class ProcEvent:
    """One event.  ``pid`` is the thread id, ``tgid`` the process id (as in the kernel).

    For ``fork``, pid/tgid are the child's and parent_* its creator's; a new thread
    has ``pid != tgid``.  ``timestamp_ns`` is CLOCK_MONOTONIC when the kernel sent
    it (connector) or when the scan saw it (poller)."""

    kind: str  # "fork" | "exec" | "comm" | "exit" | "overrun"
    pid: int
    tgid: int
    parent_pid: int = 0
    parent_tgid: int = 0
    exit_code: int = 0
    timestamp_ns: int = 0
    comm: str = ""  # "comm": the thread's new name

    @property
    def is_thread(self) -> bool:
        return self.pid != self.tgid


def parse_datagram(data: bytes) -> list[ProcEvent]:
    """Decode every netlink message in one datagram (no I/O, testable with bytes)."""
    events: list[ProcEvent] = []
    off = 0
    while off + NLMSGHDR.size <= len(data):
        length = NLMSGHDR.unpack_from(data, off)[0]
        if length < NLMSGHDR.size:
            break
        body = off + NLMSGHDR.size
        idx, val = CN_MSG.unpack_from(data, body)[:2]
        ev = body + CN_MSG.size
        if idx == CN_IDX_PROC and val == CN_VAL_PROC and ev + EV_HEAD.size <= off + length:
            what, _cpu, ts = EV_HEAD.unpack_from(data, ev)
            p = ev + EV_HEAD.size
            if what == PROC_EVENT_FORK:
                ppid, ptgid, cpid, ctgid = FORK.unpack_from(data, p)
                events.append(ProcEvent("fork", cpid, ctgid, ppid, ptgid, 0, ts))
            elif what == PROC_EVENT_EXEC:
                pid, tgid = EXEC.unpack_from(data, p)
                events.append(ProcEvent("exec", pid, tgid, timestamp_ns=ts))
            elif what == PROC_EVENT_COMM and p + COMM.size <= off + length:
                pid, tgid, raw = COMM.unpack_from(data, p)
                name = raw.split(b"\0", 1)[0].decode(errors="replace")
                events.append(ProcEvent("comm", pid, tgid, timestamp_ns=ts, comm=name))
            elif what == PROC_EVENT_EXIT:
                pid, tgid, code, _sig, ppid, ptgid = EXIT.unpack_from(data, p)
                events.append(ProcEvent("exit", pid, tgid, ppid, ptgid, code, ts))
        off += (length + 3) & ~3
    return events


class ConnectorSource:
    """The proc connector.  Non-blocking; read_events() drains what is queued."""

    kind = "connector"

    def __init__(self) -> None:
        try:
            self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
        except OSError as err:
            raise EnforceError(f"cannot open the proc connector socket: {err.strerror}") from err
        try:
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, 33, RCVBUF)  # SO_RCVBUFFORCE (root)
            except OSError:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
            self.sock.bind((0, CN_IDX_PROC))
            self._control(PROC_CN_MCAST_LISTEN)
        except OSError as err:
            self.sock.close()
            raise EnforceError(f"cannot subscribe to the proc connector: {err.strerror}") from err
        self.sock.setblocking(False)

    def _control(self, op: int) -> None:
        payload = struct.pack("=I", op)
        cn = CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(payload), 0)
        msg = cn + payload
        hdr = NLMSGHDR.pack(NLMSGHDR.size + len(msg), NLMSG_DONE, 0, 0, os.getpid())
        self.sock.send(hdr + msg)

    def fileno(self) -> int:
        return self.sock.fileno()

    def read_events(self) -> list[ProcEvent]:
        """Everything queued now.  An ``overrun`` event means events were lost
        (socket buffer full): the caller should rescan its tasks' threads."""
        events: list[ProcEvent] = []
        while True:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                return events
            except OSError as err:
                if err.errno == errno.ENOBUFS:
                    events.append(ProcEvent("overrun", 0, 0, timestamp_ns=time.monotonic_ns()))
                    continue
                raise EnforceError(f"proc connector read failed: {err.strerror}") from err
            events.extend(parse_datagram(data))

    def close(self) -> None:
        if self.sock.fileno() >= 0:
            try:
                self.sock.setblocking(True)
                self._control(PROC_CN_MCAST_IGNORE)
            except OSError:
                pass
            self.sock.close()


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def timerfd(interval: float) -> int:
    """A non-blocking timerfd firing every ``interval`` s (os.timerfd_* is Python 3.13+)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.timerfd_create(time.CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        raise EnforceError(f"timerfd_create failed: {os.strerror(ctypes.get_errno())}")
    sec = int(interval)
    ts = _Timespec(sec, int((interval - sec) * 1e9))
    spec = _Itimerspec(ts, ts)
    if libc.timerfd_settime(fd, 0, ctypes.byref(spec), None) < 0:
        err = ctypes.get_errno()
        os.close(fd)
        raise EnforceError(f"timerfd_settime failed: {os.strerror(err)}")
    return fd


class PollingSource:
    """Scans /proc every ``interval`` seconds; reports new and vanished threads.

    Only processes in ``watch`` (tgids; None = all) have their threads listed and
    their zombie state checked, which keeps a scan cheap; every process's
    appearance and exit is reported (unwatched ones: once reaped).  Events
    are ``fork`` (parents unknown: parent_* = 0) and ``exit``; no ``exec``."""

    kind = "polling"

    def __init__(self, interval: float = 0.1, proc: str = procfs.PROC) -> None:
        if interval <= 0:
            raise EnforceError(f"polling interval must be positive, not {interval!r}")
        self.interval = interval
        self.proc = proc
        self.watch: set[int] | None = set()
        self._timer = timerfd(interval)
        self._known: dict[int, set[int]] = self._scan()

    def _scan(self) -> dict[int, set[int]]:
        seen: dict[int, set[int]] = {}
        for pid in procfs.pids(self.proc):
            if self.watch is None or pid in self.watch:
                # A watched process counts as exited once it is a zombie, as the
                # connector reports exit before the parent reaps it.
                try:
                    if procfs.read_stat(pid, proc=self.proc).state in "ZX":
                        continue
                except (FileNotFoundError, ProcessLookupError):
                    continue
                seen[pid] = set(procfs.thread_ids(pid, self.proc)) or {pid}
            else:
                seen[pid] = {pid}
        return seen

    def fileno(self) -> int:
        return self._timer

    def read_events(self) -> list[ProcEvent]:
        try:
            os.read(self._timer, 8)  # acknowledge the tick
        except BlockingIOError:
            pass
        now = time.monotonic_ns()
        current = self._scan()
        events: list[ProcEvent] = []
        for pid, tids in current.items():
            before = self._known.get(pid)
            if before is None:
                events.append(ProcEvent("fork", pid, pid, timestamp_ns=now))
                before = {pid}
            events.extend(ProcEvent("fork", t, pid, timestamp_ns=now) for t in sorted(tids - before))
        for pid, tids in self._known.items():
            after = current.get(pid, set())
            events.extend(ProcEvent("exit", t, pid, timestamp_ns=now)
                          for t in sorted(tids - after) if t != pid)
            if pid not in current:
                events.append(ProcEvent("exit", pid, pid, timestamp_ns=now))
        self._known = current
        return events

    def close(self) -> None:
        if self._timer >= 0:
            os.close(self._timer)
            self._timer = -1

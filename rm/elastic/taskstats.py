"""Per-process delay accounting from the kernel's taskstats (generic netlink).

For a process (TGID) the kernel answers with its threads' totals, exited
threads included: ``cpu_run_real_total`` (ns on a CPU) and ``cpu_delay_total``
(ns runnable but waiting for a CPU).  Both come from the scheduler's
``sched_info`` and are filled even when ``kernel.task_delayacct`` is 0 (that
switch only adds block I/O, swap-in, reclaim and thrashing delays).

pyroute2 resolves the TASKSTATS family; the request and the three fields we
read are decoded here with `struct` because pyroute2's request path costs
~330 us per query on the test box and its lazy decoding ~80 us, against
~10 us this way (tests check our decoding against pyroute2's).  The struct's
leading fields are a fixed ABI (``include/uapi/linux/taskstats.h``: new
fields are only ever appended).  The query needs CAP_NET_ADMIN; without it `open_reader` returns None and the
caller falls back to `procfs.schedstat_delay_ns` (live threads only).
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import struct
from dataclasses import dataclass


log = logging.getLogger("cod.rm.elastic")

NETLINK_GENERIC = 16
NLM_F_REQUEST = 1
NLMSG_ERROR = 2
TASKSTATS_CMD_GET = 1
TASKSTATS_CMD_ATTR_TGID = 2
NLMSGHDR = struct.Struct("=IHHII")
GENLMSGHDR = struct.Struct("=BBH")
NLATTR_U32 = struct.Struct("=HHI")
NLATTR = struct.Struct("=HH")
TASKSTATS_TYPE_STATS = 3
TASKSTATS_TYPE_AGGR_TGID = 5
# Offsets in struct taskstats (version 1 and later).
OFF_CPU_COUNT, OFF_CPU_DELAY_TOTAL, OFF_CPU_RUN_REAL_TOTAL = 16, 24, 64
U64 = struct.Struct("=Q")


@dataclass(frozen=True)
class TaskDelays:
    run_ns: int  # time on a CPU, all threads
    delay_ns: int  # time runnable but waiting for a CPU, all threads
    count: int  # times it was scheduled in


class TaskstatsReader:
    def __init__(self) -> None:
        from pyroute2 import TaskStats  # resolves the family id (CTRL_CMD_GETFAMILY)

        ts = TaskStats()
        try:
            ts.bind()
            self.family = int(ts.prid)
        finally:
            ts.close()
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_GENERIC)
        self.sock.settimeout(1.0)
        self.sock.bind((0, 0))
        self._seq = 0

    def tgid(self, pid: int) -> TaskDelays | None:
        """The totals of process ``pid``; None when it does not exist."""
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        body = GENLMSGHDR.pack(TASKSTATS_CMD_GET, 1, 0) + NLATTR_U32.pack(8, TASKSTATS_CMD_ATTR_TGID, pid)
        self.sock.send(NLMSGHDR.pack(NLMSGHDR.size + len(body), self.family, NLM_F_REQUEST, self._seq, 0) + body)
        while True:
            data = self.sock.recv(65536)
            _, kind, _, seq, _ = NLMSGHDR.unpack_from(data)
            if seq == self._seq:
                break  # an answer to an earlier, timed-out request is skipped
        if kind == NLMSG_ERROR:
            code = -struct.unpack_from("=i", data, NLMSGHDR.size)[0]
            if code in (errno.ESRCH, errno.EINVAL):
                return None
            raise OSError(code, f"taskstats query for pid {pid} failed: {os.strerror(code)}")
        return parse_reply(data)

    def close(self) -> None:
        self.sock.close()


def _attrs(data: bytes, start: int, end: int):
    """(type, payload start, payload end) of each netlink attribute in data[start:end]."""
    while start + NLATTR.size <= end:
        length, kind = NLATTR.unpack_from(data, start)
        if length < NLATTR.size:
            return
        yield kind & 0x3FFF, start + NLATTR.size, start + length
        start += (length + 3) & ~3


def parse_reply(data: bytes) -> TaskDelays | None:
    """The delays in a TASKSTATS_CMD_NEW reply for a TGID; None if it holds none."""
    body = NLMSGHDR.size + GENLMSGHDR.size
    end = min(len(data), NLMSGHDR.unpack_from(data)[0])
    for kind, start, stop in _attrs(data, body, end):
        if kind != TASKSTATS_TYPE_AGGR_TGID:
            continue
        for inner, s, e in _attrs(data, start, stop):
            if inner == TASKSTATS_TYPE_STATS and e - s >= OFF_CPU_RUN_REAL_TOTAL + 8:
                return TaskDelays(run_ns=U64.unpack_from(data, s + OFF_CPU_RUN_REAL_TOTAL)[0],
                                  delay_ns=U64.unpack_from(data, s + OFF_CPU_DELAY_TOTAL)[0],
                                  count=U64.unpack_from(data, s + OFF_CPU_COUNT)[0])
    return None


def open_reader() -> TaskstatsReader | None:
    """A reader, or None (logged once) when taskstats cannot be queried here."""
    try:
        reader = TaskstatsReader()
        if reader.tgid(os.getpid()) is None:
            reader.close()
            raise OSError(errno.ENOENT, "no answer for this process")
        return reader
    except Exception as err:  # no pyroute2 family, EPERM without CAP_NET_ADMIN, ...
        log.info("taskstats unavailable (%s); run-queue delay from /proc/PID/task/*/schedstat", err)
        return None

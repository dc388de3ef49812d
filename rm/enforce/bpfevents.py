"""Process events from BPF: tp_btf programs on fork, exec, exit and rename feeding a ring buffer.

The third source of `cod.rm.enforce.procevents`, with the connector's shape and meaning
(`ProcEvent`; a fork's parent is the child's real parent, as the connector reports it).
The BPF object (``bpf/procevents.bpf.o``) and its loader (``bpf/libcod_procevents.so``, C
against libbpf) are built by ``make setup``; this module loads the library with ctypes.
The programs are tied to this process's file descriptors: they detach when it exits.

Differences from the connector: a ``comm`` event also comes at every exec (the kernel renames
the task there; the connector reports only prctl and /proc/PID/comm renames), and timestamps
are taken in the tracepoint (bpf_ktime_get_ns, CLOCK_MONOTONIC) rather than when the netlink
message was built.  Events the ring buffer had no room for are counted on the BPF side and
reported as one ``overrun`` event, as the connector's ENOBUFS is.
"""

from __future__ import annotations

import ctypes
import os
import struct
import time

from .errors import EnforceError
from .procevents import ProcEvent

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bpf")
OBJECT = os.path.join(HERE, "procevents.bpf.o")
LIBRARY = os.path.join(HERE, "libcod_procevents.so")
KERNEL_BTF = "/sys/kernel/btf/vmlinux"

# struct cod_pe_event (bpf/procevents.h)
EVENT = struct.Struct("=IIIIIiQ16s")
KINDS = {1: "fork", 2: "exec", 3: "exit", 4: "comm"}
BATCH = 1024  # events taken per call into the library


def _library() -> ctypes.CDLL:
    if not (os.path.exists(LIBRARY) and os.path.exists(OBJECT)):
        raise EnforceError(f"BPF process events are not built ({HERE}: 'make setup' builds them "
                           "where clang and libbpf-dev are installed)")
    try:
        lib = ctypes.CDLL(LIBRARY, use_errno=True)
    except OSError as err:
        raise EnforceError(f"cannot load {LIBRARY}: {err}") from err
    lib.cod_pe_open.restype = ctypes.c_void_p
    lib.cod_pe_open.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.cod_pe_fd.restype = ctypes.c_int
    lib.cod_pe_fd.argtypes = [ctypes.c_void_p]
    lib.cod_pe_read.restype = ctypes.c_int
    lib.cod_pe_read.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int]
    lib.cod_pe_dropped.restype = ctypes.c_longlong
    lib.cod_pe_dropped.argtypes = [ctypes.c_void_p]
    lib.cod_pe_close.restype = None
    lib.cod_pe_close.argtypes = [ctypes.c_void_p]
    return lib


def _tracepoint_btf_note(btf: str = KERNEL_BTF) -> str:
    """Why a tp_btf program cannot attach where the kernel's BTF has no tracepoint types: libbpf
    finds each tracepoint by its ``btf_trace_*`` type and answers ESRCH ("No such process") when
    it is missing, which the kernel's BTF is without CONFIG_BPF_EVENTS."""
    try:
        with open(btf, "rb") as f:
            types = f.read()
    except OSError:
        return f" ({btf} is missing: this kernel has no BTF, CONFIG_DEBUG_INFO_BTF)"
    if b"btf_trace_sched_process_fork" in types:
        return ""
    return (f" (the kernel's BTF has no tracepoint types such as btf_trace_sched_process_fork: it was built without "
            "CONFIG_BPF_EVENTS, which needs CONFIG_KPROBE_EVENTS or CONFIG_UPROBE_EVENTS)")


def parse_events(raw: bytes) -> list[ProcEvent]:
    """Decode a batch of ``struct cod_pe_event`` (no I/O, testable with bytes)."""
    events = []
    for off in range(0, len(raw) - EVENT.size + 1, EVENT.size):
        kind, pid, tgid, ppid, ptgid, code, ts, comm = EVENT.unpack_from(raw, off)
        name = KINDS.get(kind)
        if name is None:
            continue
        events.append(ProcEvent(name, pid, tgid, ppid, ptgid, code, ts,
                                comm.split(b"\0", 1)[0].decode(errors="replace") if name == "comm" else ""))
    return events


class BpfSource:
    """The BPF ring buffer.  Non-blocking; read_events() drains what is queued."""

    kind = "bpf"

    def __init__(self) -> None:
        self._lib = _library()
        err = ctypes.create_string_buffer(512)
        handle = self._lib.cod_pe_open(OBJECT.encode(), err, len(err))
        if not handle:
            why = err.value.decode(errors="replace") or "the BPF programs did not load"
            raise EnforceError(why + _tracepoint_btf_note())
        self._pe: int | None = handle
        self._fd = self._lib.cod_pe_fd(handle)
        self._buf = ctypes.create_string_buffer(EVENT.size * BATCH)
        self._dropped = 0

    def fileno(self) -> int:
        return self._fd

    def read_events(self) -> list[ProcEvent]:
        """Everything queued now; an ``overrun`` event first when events were lost."""
        if self._pe is None:
            raise EnforceError("the BPF event source is closed")
        events: list[ProcEvent] = []
        dropped = self._lib.cod_pe_dropped(self._pe)
        if dropped > self._dropped:
            self._dropped = dropped
            events.append(ProcEvent("overrun", 0, 0, timestamp_ns=time.monotonic_ns()))
        while True:
            n = self._lib.cod_pe_read(self._pe, self._buf, BATCH)
            if n < 0:
                raise EnforceError(f"reading the BPF ring buffer failed: {os.strerror(-n)}")
            events.extend(parse_events(ctypes.string_at(self._buf, n * EVENT.size)))  # not .raw: all 48 KiB
            if n < BATCH:
                return events

    def close(self) -> None:
        if self._pe is not None:
            self._lib.cod_pe_close(self._pe)
            self._pe = None

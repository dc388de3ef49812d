"""BPF process events (cod.rm.enforce.bpfevents) against the real kernel, and their decoding.

The tests both kernel sources share are in test_enforce_procevents.py; these are BPF's own:
the record format, exit codes, no event lost in a burst, and a clear refusal."""

from __future__ import annotations

import os
import select
import subprocess
import time

import pytest

from cod.rm.enforce import bpfevents
from cod.rm.enforce.bpfevents import EVENT, BpfSource, parse_events
from cod.rm.enforce.errors import EnforceError
from cod.rm.enforce.eventsource import open_source
from cod.rm.enforce.procevents import ConnectorSource, ProcEvent
from helpers.procs import needs_root


def record(kind: int, pid: int, tgid: int, ppid: int = 0, ptgid: int = 0, code: int = 0,
           ts: int = 5, comm: bytes = b"") -> bytes:
    return EVENT.pack(kind, pid, tgid, ppid, ptgid, code, ts, comm)


@pytest.mark.parametrize("raw,expected", [
    (record(1, 11, 10, 10, 10), [ProcEvent("fork", 11, 10, 10, 10, 0, 5)]),
    (record(2, 12, 12), [ProcEvent("exec", 12, 12, timestamp_ns=5)]),
    (record(3, 13, 13, 1, 1, 768), [ProcEvent("exit", 13, 13, 1, 1, 768, 5)]),
    (record(4, 14, 12, comm=b"scan0_1"), [ProcEvent("comm", 14, 12, timestamp_ns=5, comm="scan0_1")]),
    (record(4, 14, 12, comm=b"a" * 16), [ProcEvent("comm", 14, 12, timestamp_ns=5, comm="a" * 16)]),
    (record(9, 1, 1), []),  # an unknown kind is ignored
    (record(2, 1, 1)[:-1], []),  # a truncated record is ignored
    (record(2, 1, 1) + record(2, 2, 2), [ProcEvent("exec", 1, 1, timestamp_ns=5), ProcEvent("exec", 2, 2, timestamp_ns=5)]),
])
def test_parse_events(raw, expected):
    assert parse_events(raw) == expected


def test_the_record_is_the_c_struct():
    # struct cod_pe_event in rm/enforce/bpf/procevents.h: six 32-bit fields, a u64, comm[16].
    assert EVENT.size == 6 * 4 + 8 + 16


def test_an_unbuilt_object_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(bpfevents, "OBJECT", str(tmp_path / "procevents.bpf.o"))
    with pytest.raises(EnforceError, match="not built.*make setup"):
        BpfSource()


@needs_root()
def test_a_file_that_is_no_bpf_object_is_refused_and_the_connector_taken(monkeypatch, tmp_path, caplog):
    bogus = tmp_path / "procevents.bpf.o"
    bogus.write_bytes(b"not an ELF file")
    monkeypatch.setattr(bpfevents, "OBJECT", str(bogus))
    with pytest.raises(EnforceError, match="cannot open"):
        BpfSource()
    with caplog.at_level("INFO", logger="cod.rm.enforce"):
        src = open_source(prefer_connector=True)
    try:
        assert src.kind == "connector"
        assert "BPF unavailable (cannot open" in caplog.text and "proc connector (netlink)" in caplog.text
    finally:
        src.close()


def drain(src, until, timeout: float = 30.0) -> list[ProcEvent]:
    """Every event until ``until(events)`` holds, or fail at the timeout."""
    got: list[ProcEvent] = []
    deadline = time.monotonic() + timeout
    while not until(got):
        left = deadline - time.monotonic()
        assert left > 0, f"the events stopped coming ({len(got)} read)"
        select.select([src.fileno()], [], [], min(left, 1.0))
        got.extend(src.read_events())
    return got


@needs_root()
def test_exit_code_is_the_wait_status():
    src = BpfSource()
    try:
        p = subprocess.Popen(["sh", "-c", "exit 3"])
        p.wait()
        events = drain(src, lambda evs: any(e.kind == "exit" and e.pid == p.pid for e in evs))
        exit_ev = next(e for e in events if e.kind == "exit" and e.pid == p.pid)
        assert exit_ev.exit_code == 3 << 8 and exit_ev.parent_tgid == os.getpid()
    finally:
        src.close()


FORKS = 2000  # bench/procevents_bench.py runs 10,000


@needs_root()
@pytest.mark.parametrize("kind", ["bpf", "connector"])
def test_no_event_lost_in_a_burst_of_forks(kind):
    # A shell forks FORKS children as fast as it can; every fork, exec and exit is seen once.
    src = BpfSource() if kind == "bpf" else ConnectorSource()
    try:
        shell = subprocess.Popen(["sh", "-c", f"i=0; while [ $i -lt {FORKS} ]; do /bin/true; i=$((i+1)); done"])
        def complete(evs: list[ProcEvent]) -> bool:
            return any(e.kind == "exit" and e.pid == shell.pid for e in evs)
        events = drain(src, complete, timeout=300)
        shell.wait()
        assert not [e for e in events if e.kind == "overrun"]
        children = {e.pid for e in events if e.kind == "fork" and e.parent_tgid == shell.pid}
        assert len(children) == FORKS
        for what in ("exec", "exit"):
            assert len({e.pid for e in events if e.kind == what and e.pid in children}) == FORKS, what
    finally:
        src.close()


@pytest.mark.parametrize("content, says", [
    (None, "this kernel has no BTF"),
    (b"\x9f\xeb\x01\x00 task_struct btf_trace_sched_process_exit", "built without CONFIG_BPF_EVENTS"),
    (b"\x9f\xeb\x01\x00 task_struct btf_trace_sched_process_fork btf_trace_task_rename", ""),
])
def test_a_kernel_without_tracepoint_btf_is_named(tmp_path, content, says):
    # The scx guest's kernel refused the programs with ESRCH ("No such process"): libbpf looks each
    # tracepoint up by its btf_trace_* type, which that kernel's BTF lacked (issue 48).
    from cod.rm.enforce.bpfevents import _tracepoint_btf_note

    btf = tmp_path / "vmlinux"
    if content is not None:
        btf.write_bytes(content)
    note = _tracepoint_btf_note(str(btf))
    assert (note == "") if not says else (says in note)

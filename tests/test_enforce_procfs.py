"""/proc parsing helpers."""

from __future__ import annotations

import os

import pytest

from cod.rm.enforce.procfs import cpus_allowed, format_cpu_list, parse_cpu_list, parse_stat, read_stat


@pytest.mark.parametrize("text,ids", [
    ("0", (0,)), ("0-3", (0, 1, 2, 3)), ("0-2,5,7-8", (0, 1, 2, 5, 7, 8)), ("", ()), ("4,1", (1, 4)),
])
def test_cpu_list_round_trip(text, ids):
    assert parse_cpu_list(text) == ids
    assert parse_cpu_list(format_cpu_list(ids)) == ids


@pytest.mark.parametrize("text,needle", [("a", "bad cpulist item 'a'"), ("3-1", "descending range '3-1'"), ("1,,2", "bad cpulist item ''")])
def test_bad_cpu_list_is_named(text, needle):
    with pytest.raises(ValueError, match=needle):
        parse_cpu_list(text)


def test_parse_stat_with_awkward_comm():
    own = open(f"/proc/{os.getpid()}/stat").read()
    rest = own[own.rindex(")") + 1:]
    st = parse_stat(f"{os.getpid()} (a) b (c){rest}")
    assert st.comm == "a) b (c" and st == parse_stat(own).__class__(**{**parse_stat(own).__dict__, "comm": st.comm})


def test_read_stat_of_self():
    st = read_stat(os.getpid())
    assert st.pid == os.getpid() and st.ppid == os.getppid() and not st.is_kernel_thread
    assert st.processor in os.sched_getaffinity(0)
    assert cpus_allowed(os.getpid()) == tuple(sorted(os.sched_getaffinity(0)))


def test_kept_file_of_an_exited_process_reads_none():
    import subprocess
    from cod.rm.enforce.procfs import KeptFiles, parse_cpu_ticks
    kept = KeptFiles()
    child = subprocess.Popen(["sleep", "30"])
    path = f"/proc/{child.pid}/stat"
    first = kept.read(path)
    assert first is not None and parse_cpu_ticks(first)[1] == read_stat(child.pid).start_time
    child.kill()
    child.wait()
    assert kept.read(path) is None  # ESRCH through the old fd: never a reused pid's file
    kept.close()

"""/proc parsing helpers."""

from __future__ import annotations

import os

import pytest

from cod.facts import procfs
from cod.facts.procfs import cpus_allowed, format_cpu_list, parse_cpu_list, parse_stat, read_stat


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
    from cod.facts.procfs import KeptFiles, parse_cpu_ticks
    kept = KeptFiles()
    child = subprocess.Popen(["sleep", "30"])
    path = f"/proc/{child.pid}/stat"
    first = kept.read(path)
    assert first is not None and parse_cpu_ticks(first)[1] == read_stat(child.pid).start_time
    child.kill()
    child.wait()
    assert kept.read(path) is None  # ESRCH through the old fd: never a reused pid's file
    kept.close()


# ---- the one reader, on a fake tree under its one root --------------------------------------------------
def fake_process(root, pid: int, comm: str, threads: dict[int, tuple[str, int, int, int | None]]) -> None:
    """threads: tid -> (comm, utime, stime, schedstat wait_ns or None); the process's own stat has
    utime 7, stime 3, cutime 20, cstime 5, start time 4242."""
    fields = ["S", "1"] + ["0"] * 9 + ["7", "3", "20", "5"] + ["0"] * 4 + ["4242"] + ["0"] * 30
    (root / str(pid)).mkdir(parents=True)
    (root / str(pid) / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")
    (root / str(pid) / "comm").write_text(comm + "\n")
    (root / str(pid) / "cgroup").write_text("12:cpuset:/db\n0::/user.slice/db.scope\n")
    for tid, (name, utime, stime, wait) in threads.items():
        task = root / str(pid) / "task" / str(tid)
        task.mkdir(parents=True)
        tfields = ["R", "1"] + ["0"] * 9 + [str(utime), str(stime)] + ["0"] * 40
        (task / "stat").write_text(f"{tid} ({name}) {' '.join(tfields)}\n")
        (task / "comm").write_text(name + "\n")
        if wait is not None:
            (task / "schedstat").write_text(f"{utime * 1000} {wait} 3\n")


def test_every_reader_takes_the_one_root(tmp_path):
    from cod.facts import procfs
    fake_process(tmp_path, 100, "post) gres (x", {100: ("main", 50, 5, 900), 101: ("scan (1)", 9, 1, None)})
    proc = str(tmp_path)
    st = procfs.read_stat(100, proc=proc)
    assert (st.comm, st.ppid, st.utime, st.stime, st.cutime, st.cstime, st.start_time) == (
        "post) gres (x", 1, 7, 3, 20, 5, 4242)
    assert procfs.cpu_ticks(100, proc)[:2] == (10, 4242)
    assert procfs.cpu_totals(100, proc) == (10, 25, 4242)
    assert procfs.start_time(100, proc) == 4242 and procfs.same_process(100, 4242, proc)
    assert procfs.comm(100, proc) == "post) gres (x"
    assert procfs.thread_ids(100, proc) == [100, 101]
    assert procfs.thread_names(100, proc) == {100: "main", 101: "scan (1)"}
    assert procfs.thread_comm(100, 101, proc) == "scan (1)"
    assert procfs.thread_cpu_ticks(100, 101, proc) == 10
    assert procfs.cpu_seconds(100, proc) == 10 / procfs.CLK_TCK
    assert procfs.thread_state(100, 101, proc) == "R"
    (tmp_path / "100" / "task" / "100" / "wchan").write_text("pipe_read")
    (tmp_path / "100" / "task" / "101" / "wchan").write_text("0")  # running: the kernel says 0
    assert procfs.thread_wait_channel(100, 100, proc) == "pipe_read"
    assert procfs.thread_wait_channel(100, 101, proc) == ""
    assert procfs.thread_schedstat(100, 100, proc) == (50_000, 900)
    assert procfs.thread_schedstat(100, 101, proc) is None  # no schedstat file
    assert procfs.schedstat_delay_ns(100, proc) == 900
    assert procfs.cgroups(100, proc) == [("12", "cpuset", "/db"), ("0", "", "/user.slice/db.scope")]
    (tmp_path / "100" / "status").write_text("Name:\tpost\nTgid:\t100\nUid:\t1000\t0\t0\t0\n")
    (tmp_path / "101").mkdir()  # a thread is reachable as /proc/TID too, with its leader's Tgid
    (tmp_path / "101" / "status").write_text("Name:\tscan\nTgid:\t100\nUid:\t1000\t0\t0\t0\n")
    (tmp_path / "100" / "numa_maps").write_bytes(b"7f00 default anon=3 N0=2 N1=1\n")
    assert procfs.real_uid(100, proc) == 1000  # the real uid, not the effective 0
    assert procfs.is_process(100, proc) and not procfs.is_process(101, proc)
    assert procfs.alive(100, proc) and procfs.alive(101, proc)
    assert procfs.numa_maps(100, proc) == b"7f00 default anon=3 N0=2 N1=1\n"


def test_a_process_that_is_gone_reads_none(tmp_path):
    from cod.facts import procfs
    proc = str(tmp_path)
    assert procfs.cpu_ticks(7, proc) is None and procfs.cpu_totals(7, proc) is None
    assert procfs.start_time(7, proc) is None and not procfs.same_process(7, 1, proc)
    assert procfs.comm(7, proc) is None and procfs.thread_comm(7, 7, proc) is None
    assert procfs.thread_ids(7, proc) == [] and procfs.thread_names(7, proc) == {}
    assert procfs.thread_cpu_ticks(7, 7, proc) is None and procfs.thread_schedstat(7, 7, proc) is None
    assert procfs.cpu_seconds(7, proc) is None
    assert procfs.thread_state(7, 7, proc) is None and procfs.thread_wait_channel(7, 7, proc) is None
    assert procfs.schedstat_delay_ns(7, proc) is None
    assert procfs.real_uid(7, proc) is None and not procfs.is_process(7, proc) and not procfs.alive(7, proc)
    assert procfs.numa_maps(7, proc) is None
    with pytest.raises(FileNotFoundError):
        procfs.cgroups(7, proc)


def test_scope_and_cgroupfs_read_through_the_one_reader(tmp_path):
    from cod.rm.enforce.cgroupfs import process_cgroup
    from cod.rm.scope import ProcessScope
    fake_process(tmp_path, 100, "postgres", {100: ("main", 1, 1, None)})
    (tmp_path / "100" / "status").write_text("Name:\tpostgres\nUid:\t1000\t1000\t1000\t1000\n")
    proc = str(tmp_path)
    assert process_cgroup(100, 1, proc) == "/db" and process_cgroup(100, 2, proc) == "/user.slice/db.scope"
    assert ProcessScope.parse("uids:1000", proc=proc).allows(100)
    assert not ProcessScope.parse("uids:0", proc=proc).allows(100)
    assert ProcessScope.parse("cgroup:/user.slice", proc=proc).allows(100)
    assert not ProcessScope.parse("all", never="postgres", proc=proc).allows(100)
    assert ProcessScope.parse("descendants:1", proc=proc).allows(100)  # its ppid is 1


def test_meminfo_reads_bytes_and_tolerates_a_missing_file(tmp_path):
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       24731708 kB\nMemFree:         3979136 kB\nMemAvailable:   22524828 kB\n"
                 "HugePages_Total:       0\nbogus line\n")
    got = procfs.meminfo(str(f))
    assert got["MemTotal"] == 24731708 * 1024 and got["MemAvailable"] == 22524828 * 1024
    assert got["HugePages_Total"] == 0 and "bogus line" not in got
    assert procfs.meminfo(str(tmp_path / "absent")) == {}


MOUNTS_TEXT = """sysfs /sys sysfs rw,nosuid 0 0
cgroup /sys/fs/cgroup/cpuset cgroup rw,nosuid,cpuset 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,nosuid,memory 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nsdelegate 0 0
cgroup2 /mnt/my\\040cgroups cgroup2 rw 0 0
/dev/vda1 /mnt/my\\040cgroups/data ext4 rw 0 0
"""


@pytest.mark.parametrize("path,mount", [
    ("/sys/fs/cgroup/cpuset/cod/db", "/sys/fs/cgroup/cpuset"),
    ("/sys/fs/cgroup/unified/user.slice", "/sys/fs/cgroup/unified"),
    ("/mnt/my cgroups/db.scope", "/mnt/my cgroups"),  # \040 in mounts is a space
    ("/mnt/my cgroups/data", "/mnt/my cgroups"),  # an ext4 mount below does not count
    ("/sys/fs/cgroupx", None),
    ("/tmp/looks-like-a-cgroup", None),
])
def test_the_cgroup_mount_that_holds_a_path(tmp_path, path, mount):
    from cod.rm.elastic.group import cgroup_mount_of
    mounts = tmp_path / "mounts"
    mounts.write_text(MOUNTS_TEXT)
    assert cgroup_mount_of(path, str(mounts)) == mount


def test_the_cpuset_mount_is_v1s_before_a_cgroup2(tmp_path):
    from cod.rm.enforce.cgroupfs import cgroup_mounts, find_cpuset_mount
    mounts = tmp_path / "mounts"
    mounts.write_text(MOUNTS_TEXT)
    assert [m[:2] for m in cgroup_mounts(str(mounts))] == [
        ("/sys/fs/cgroup/cpuset", "cgroup"), ("/sys/fs/cgroup/memory", "cgroup"),
        ("/sys/fs/cgroup/unified", "cgroup2"), ("/mnt/my cgroups", "cgroup2")]
    assert find_cpuset_mount(str(mounts)).describe() == "cgroup v1 cpuset at /sys/fs/cgroup/cpuset"

"""Group tracking and measurement on real processes: pids, children, cgroups, bad input."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from cod.rm.elastic.errors import ElasticError, GroupGone
from cod.rm.elastic.group import CgroupGroup, PidTreeGroup
from cod.rm.elastic.measure import GroupMeter
from cod.rm.elastic.taskstats import TaskstatsReader, open_reader, parse_reply
from cod.facts.procfs import CLK_TCK, cpu_seconds, schedstat_delay_ns
from cod.rm.enforce.eventsource import open_source
from helpers.cgroups import enter, temp_cgroup
from helpers.procs import needs_root, spawn, spinner_cmd  # noqa: F401 (fixtures)

CPUS = sorted(os.sched_getaffinity(0))

FORKER = textwrap.dedent("""
    import os, sys, time
    kids = []
    for line in sys.stdin:
        if line.startswith("fork"):
            pid = os.fork()
            if pid == 0:  # spins for this much CPU time, however busy the machine is
                end = time.process_time() + float(line.split()[1])
                while time.process_time() < end:
                    pass
                os._exit(0)
            kids.append(pid)
            print(pid, flush=True)
        elif line.startswith("wait"):
            for k in kids:
                os.waitpid(k, 0)
            kids.clear()
            print("waited", flush=True)
""")


def measure(meter: GroupMeter, seconds: float):
    meter.sample()
    time.sleep(seconds)
    return meter.sample()


def test_cpu_time_of_a_spinning_thread(spawn):
    """The meter's CPU time is the process's own over the meter's interval: checked against /proc
    read around the measurement, not against the wall clock (on a busy machine a spinner gets any
    share: it failed at a host load of ~12 asserting more than 15 % of a CPU)."""
    task = spawn(1, "spin")  # one spinning worker
    meter = GroupMeter(PidTreeGroup([task.pid]))
    t0, cpu0 = time.monotonic(), cpu_seconds(task.pid)
    s = measure(meter, 0.6)
    outer_s, used_s = time.monotonic() - t0, cpu_seconds(task.pid) - cpu0
    tick = 1 / CLK_TCK
    assert 0.6 <= s.interval_s <= outer_s
    # What the process used around the interval, less at most what one thread used outside it.
    assert used_s - (outer_s - s.interval_s) - 2 * tick <= s.cpu_s <= used_s + tick
    assert 0 < s.cpu_s <= s.interval_s + tick  # one thread, at most one CPU
    assert s.members == (task.pid,)


@pytest.mark.parametrize("source", ["taskstats", "schedstat"])
def test_run_queue_delay_of_threads_sharing_one_cpu(spawn, source):
    task = spawn(3, "spin")  # two spinning workers
    for tid in task.tids:
        os.sched_setaffinity(tid, [CPUS[0]])  # on one CPU they wait for each other
    reader = open_reader() if source == "taskstats" else None
    if source == "taskstats" and reader is None:
        pytest.skip("taskstats needs CAP_NET_ADMIN")
    try:
        s = measure(GroupMeter(PidTreeGroup([task.pid]), want_delay=True, taskstats=reader), 0.6)
    finally:
        if reader:
            reader.close()
    assert s.cpu_s <= 1.1 * s.interval_s
    # Two runnable threads on one CPU: about one thread waits at any time.
    assert s.delay_s is not None and s.delay_s > 0.5 * s.interval_s


@needs_root()
def test_taskstats_decoding_matches_pyroute2s():
    from pyroute2.netlink.taskstats import taskstatsmsg

    reader = TaskstatsReader()
    try:
        ours = reader.tgid(os.getpid())
        # Ask again and keep the raw reply to decode with pyroute2.
        import struct
        from cod.rm.elastic import taskstats as ts
        reader._seq += 1
        body = ts.GENLMSGHDR.pack(ts.TASKSTATS_CMD_GET, 1, 0) + ts.NLATTR_U32.pack(8, ts.TASKSTATS_CMD_ATTR_TGID, os.getpid())
        reader.sock.send(ts.NLMSGHDR.pack(ts.NLMSGHDR.size + len(body), reader.family, 1, reader._seq, 0) + body)
        raw = reader.sock.recv(65536)
        assert struct.unpack_from("=H", raw, 4)[0] == reader.family
        msg = taskstatsmsg(raw)
        msg.decode()
        stats = msg.get_nested("TASKSTATS_TYPE_AGGR_TGID", "TASKSTATS_TYPE_STATS")
        mine = parse_reply(raw)
        assert (mine.run_ns, mine.delay_ns, mine.count) == (
            stats["cpu_run_real_total"], stats["cpu_delay_total"], stats["cpu_count"])
        assert ours.run_ns <= mine.run_ns
        assert reader.tgid(2**22 + 12345) is None  # no such process
    finally:
        reader.close()
    assert schedstat_delay_ns(2**22 + 12345) is None


def test_children_forked_later_are_members_and_their_cpu_counts():
    events = open_source(prefer_connector=os.geteuid() == 0, poll_interval=0.05)
    parent = subprocess.Popen([sys.executable, "-c", FORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        group = PidTreeGroup([parent.pid])
        meter = GroupMeter(group)
        meter.sample()
        parent.stdin.write("fork 0.4\nfork 0.4\n")
        parent.stdin.flush()
        kids = {int(parent.stdout.readline()), int(parent.stdout.readline())}
        time.sleep(0.1)
        group.on_events(events.read_events())
        assert kids <= {m.pid for m in group.members()}
        parent.stdin.write("wait\n")
        parent.stdin.flush()
        assert parent.stdout.readline().strip() == "waited"
        time.sleep(0.1)
        group.on_events(events.read_events())
        s = meter.sample()
        assert {m.pid for m in group.members()} == {parent.pid}  # the children are gone
        # 2 x 0.4 s of CPU reached the group through the parent's cutime, counted once.
        assert 0.7 < s.cpu_s < 1.0
    finally:
        parent.kill()
        parent.wait()
        events.close()


def test_rescan_finds_children_forked_before_registration():
    parent = subprocess.Popen([sys.executable, "-c", FORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        parent.stdin.write("fork 2\n")
        parent.stdin.flush()
        kid = int(parent.stdout.readline())
        group = PidTreeGroup([parent.pid])
        assert {m.pid for m in group.members()} == {parent.pid, kid}
    finally:
        parent.kill()
        parent.wait()


def test_a_pid_that_exits(spawn):
    a, b = spawn(1, "sleep"), spawn(1, "sleep")
    group = PidTreeGroup([a.pid, b.pid])
    meter = GroupMeter(group)
    meter.sample()
    a.stop()
    s = meter.sample()
    assert s.members == (b.pid,)
    b.stop()
    meter.sample()  # finds b gone
    with pytest.raises(GroupGone, match="exited"):
        meter.sample()


def test_bad_pids_are_refused():
    with pytest.raises(ElasticError, match="does not exist"):
        PidTreeGroup([2**22 + 12345])
    with pytest.raises(ElasticError, match="not a process id"):
        PidTreeGroup([-3])
    with pytest.raises(ElasticError, match="at least one pid"):
        PidTreeGroup([])
    with pytest.raises(ElasticError, match="not a cgroup"):
        CgroupGroup("/proc")


@needs_root()
def test_cgroup_members_counter_and_disappearance(spawn):
    with temp_cgroup("group") as path:
        task = spawn(1, "spin")
        enter(path, task.pid)
        group = CgroupGroup(path)
        assert [m.pid for m in group.members()] == [task.pid]
        assert group.cpu_usage_s() is not None
        s = measure(GroupMeter(group), 0.5)
        assert 0.1 * s.interval_s < s.cpu_s <= 1.1 * s.interval_s
        meter = GroupMeter(group)
        meter.sample()
        task.stop()
        assert meter.sample().members == ()  # an empty cgroup is still a group
    with pytest.raises(GroupGone, match="disappeared"):
        meter.sample()


@needs_root()
def test_thousands_of_short_processes_are_counted_through_their_parent():
    # A shell forks and reaps 1500 short processes; few are ever seen alive.
    events = open_source(prefer_connector=True)
    shell = subprocess.Popen(["sh", "-c", "i=0; while [ $i -lt 1500 ]; do /bin/true; i=$((i+1)); done; sleep 60"])
    try:
        group = PidTreeGroup([shell.pid])
        meter = GroupMeter(group)
        meter.sample()
        seen_max = 0
        end = time.monotonic() + 8
        total = 0.0
        while time.monotonic() < end:
            time.sleep(0.2)
            group.on_events(events.read_events())
            s = meter.sample()
            total += s.cpu_s
            seen_max = max(seen_max, len(s.members))
            if len(s.members) == 1 and total > 0 and time.monotonic() > end - 6:
                break
        assert seen_max < 50  # members come and go; none is kept after it exits
        assert total > 0.05  # the children's CPU time reached the group via the shell's cutime
        # The shell, and its final `sleep` once the loop is over (on a busy machine the loop may still run).
        alive = {shell.pid, *map(int, open(f"/proc/{shell.pid}/task/{shell.pid}/children").read().split())}
        assert shell.pid in {m.pid for m in group.members()} <= alive
    finally:
        shell.send_signal(signal.SIGKILL)
        shell.wait()
        events.close()


def test_member_counter_counts_a_reaped_child_once(monkeypatch):
    from cod.rm.elastic import measure

    clock = iter(range(100, 10_000, 100))  # boot ticks at each update
    monkeypatch.setattr(measure, "boot_ticks", lambda: next(clock))
    c = measure._MemberCounter()  # created at tick 100
    # Parent 10 existed before: what it had (500 ticks) is its baseline, not the group's.
    assert c.update({10: (500, 50, 1)}, absorbed=True) == 0
    # It used 50 more; child 11, born at tick 250 (after the last update), counts whole: 30.
    assert c.update({10: (550, 50, 1), 11: (30, 250, 10)}, absorbed=True) == 80
    # The child is reaped by its parent: its final 40 ticks arrive in the parent's cutime.
    assert c.update({10: (590, 50, 1)}, absorbed=True) == 90
    # A member reaped by a non-member (12's parent is 1) keeps what was seen of it.
    assert c.update({10: (590, 50, 1), 12: (5, 450, 1)}, absorbed=True) == 95
    assert c.update({10: (590, 50, 1)}, absorbed=True) == 95
    # Delays are not absorbed by parents: a leaving member keeps its share.
    d = measure._MemberCounter()
    assert d.update({10: (100, 50, 1), 11: (20, 5000, 10)}, absorbed=False) == 20
    assert d.update({10: (110, 50, 1)}, absorbed=False) == 30

"""cpuset enforcement on cgroup v2 against the guest's kernel: what the v1 tests check on the
host (tests/rm/enforce/test_enforce_affinity.py runs in the guest too), plus what only v2 and several NUMA
nodes show: cpuset.mems and where pages land, hogs confined, partitions, a crashed run cleaned
up, and a broken cgroup write caught."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from cod.rm.enforce import AffinityEnforcer, CpusetV2Enforcer, EnforceError
from cod.rm.enforce.cgroupfs import CpusetMount, find_cpuset_mount, process_cgroup
from cod.facts.procfs import cpus_allowed, thread_ids
from helpers.procs import spawn, spinner_cmd  # noqa: F401 (fixtures)
from numa import Toucher, cgroup_confines, cgroup_v2_fixture, fmt, node_pages, read, status_list

MOUNT = find_cpuset_mount()
PARENT = f"cod-vm-{os.getpid()}"


cgroup_v2 = cgroup_v2_fixture(PARENT)


@pytest.fixture
def state_dir(tmp_path):
    return str(tmp_path / "state")


def test_a_task_gets_one_nodes_cpus_and_memory_and_is_released(topo, state_dir, spawn):
    task = spawn(3, "sleep")
    home = process_cgroup(task.pid, 2)
    node = topo.nodes - 1
    cpus = topo.node_cpus(node)
    enf = CpusetV2Enforcer(MOUNT, state_dir, parent=PARENT)
    cg = os.path.join(MOUNT.path, PARENT, "db")
    try:
        assert enf.apply("db", [task.pid], cpus, [node]) == [task.pid]
        assert read(f"{cg}/cpuset.cpus") == fmt(cpus) and read(f"{cg}/cpuset.mems") == str(node)
        cgroup_confines(task.pid, cpus, (node,))
        assert {cpus_allowed(task.pid, t) for t in thread_ids(task.pid)} == {cpus}
        enf.release("db")
        assert not os.path.exists(cg)
        assert process_cgroup(task.pid, 2) == home
        assert status_list(task.pid, "Mems_allowed_list") == fmt(range(topo.nodes))
    finally:
        enf.close()


def test_pages_land_on_the_tasks_node_and_earlier_ones_are_migrated(topo, state_dir):
    """Pages touched before the move are migrated (memory_migrate); pages touched after are
    allocated on the cpuset's node: numa_maps of the process shows every one of them there."""
    node = topo.nodes - 1
    with Toucher(topo.node_cpus(0)) as t:
        before = t.touch(16)
        assert set(node_pages(t.pid, before)) == {0}, "not where it was started"
        enf = CpusetV2Enforcer(MOUNT, state_dir, parent=PARENT, memory_migrate=True)
        try:
            enf.apply("db", [t.pid], topo.node_cpus(node), [node])
            assert enf.wait_moves(240.0), "the background page move did not end"  # apply() does not wait for it
            after = t.touch(32)
            for addr, mib in ((before, 16), (after, 32)):
                pages = node_pages(t.pid, addr)
                assert set(pages) == {node} and pages[node] >= mib * 256, (hex(addr), pages)
        finally:
            enf.close()


def test_hogs_run_only_on_their_cpus(topo, state_dir, spawn):
    """Where spinning threads actually run (the CPU each last ran on, sampled), not only masks."""
    hog = spawn(4, "spin")
    cpus = topo.node_cpus(1)
    enf = CpusetV2Enforcer(MOUNT, state_dir, parent=PARENT)
    try:
        enf.apply("hog", [hog.pid], cpus, [1])
        time.sleep(0.5)  # let every thread be scheduled once after the move
        seen = set()
        for _ in range(40):
            for tid in hog.tids[1:]:  # the spinning workers (the main thread sleeps on stdin)
                seen.add(int(read(f"/proc/{hog.pid}/task/{tid}/stat").rsplit(")", 1)[1].split()[36]))
            time.sleep(0.05)
        assert seen and seen <= set(cpus), f"hog ran on {sorted(seen)}, confined to {cpus}"
    finally:
        enf.close()


def test_an_exclusive_task_is_a_valid_partition_root(topo, state_dir, spawn):
    """exclusive: cpuset.cpus.partition is 'root' (the kernel says 'root invalid (...)' when it
    cannot be), and a second exclusive task on the same CPUs is refused."""
    a, b = spawn(1, "sleep"), spawn(1, "sleep")
    cpus = topo.node_cpus(topo.nodes - 1)
    enf = CpusetV2Enforcer(MOUNT, state_dir, parent=PARENT, exclusive=True)
    try:
        enf.apply("a", [a.pid], cpus, [topo.nodes - 1])
        assert read(os.path.join(MOUNT.path, PARENT, "a", "cpuset.cpus.partition")) == "root"
        cgroup_confines(a.pid, cpus, (topo.nodes - 1,))
        # No other cgroup runs on a partition's CPUs: the root's effective CPUs lose them.
        assert not set(cpus) & set(parse(read(f"{MOUNT.path}/cpuset.cpus.effective")))
        with pytest.raises(EnforceError):
            enf.apply("b", [b.pid], cpus[:1], [topo.nodes - 1])
        # CPU 0 stays with the root cgroup (the kernel keeps a CPU for the tasks there).
        enf.apply("b", [b.pid], topo.node_cpus(0)[1:], [0])
        assert read(os.path.join(MOUNT.path, PARENT, "b", "cpuset.cpus.partition")) == "root"
    finally:
        enf.close()
    assert set(topo.node_cpus(topo.nodes - 1)) <= set(parse(read(f"{MOUNT.path}/cpuset.cpus.effective")))


def parse(text: str) -> tuple[int, ...]:
    from cod.facts.procfs import parse_cpu_list
    return parse_cpu_list(text)


CRASHER = """
import sys, time
from cod.rm.enforce import detect
state_dir, parent, pid, cpus, node = sys.argv[1:6]
enf = detect("cpuset", state_dir, cgroup_parent=parent)
enf.apply("victim", [int(pid)], [int(c) for c in cpus.split(",")], [int(node)])
print("ready", flush=True)
time.sleep(3600)
"""


@pytest.mark.parametrize("next_run", ["cpuset", "affinity"])
def test_the_next_start_after_a_sigkill_removes_the_cgroup_and_restores(topo, state_dir, spawn, next_run):
    task = spawn(2, "sleep")
    home, before = process_cgroup(task.pid, 2), cpus_allowed(task.pid)
    node = topo.nodes - 1
    rm = subprocess.Popen([sys.executable, "-c", CRASHER, state_dir, PARENT, str(task.pid),
                           ",".join(map(str, topo.node_cpus(node))), str(node)], stdout=subprocess.PIPE, text=True)
    try:
        assert rm.stdout.readline().strip() == "ready"
        cgroup_confines(task.pid, topo.node_cpus(node), (node,))
    finally:
        rm.send_signal(signal.SIGKILL)
        rm.wait()
    cg = os.path.join(MOUNT.path, PARENT, "victim")
    assert os.path.isdir(cg), "a crash undoes nothing"
    enf = (CpusetV2Enforcer(MOUNT, state_dir, parent=PARENT) if next_run == "cpuset"
           else AffinityEnforcer(state_dir, cgroup_parent=PARENT))  # the crashed run's parent (issue 47 item 7)
    try:
        done = enf.cleanup_stale()
        assert f"removed cgroup {cg}" in done
        assert enf.cleanup_stale() == []
    finally:
        enf.close()
    assert not os.path.exists(os.path.join(MOUNT.path, PARENT))
    assert process_cgroup(task.pid, 2) == home and cpus_allowed(task.pid) == before
    assert status_list(task.pid, "Mems_allowed_list") == fmt(range(topo.nodes))


# ---- a broken write is caught ----------------------------------------------------------------

class MisnamedCpus(CpusetV2Enforcer):
    """An enforcer with a typo in the file it writes the CPUs to."""

    def _configure(self, path, cpus, mems, fresh):
        from cod.rm.enforce.cpuset import _write
        _write(os.path.join(path, "cpuset.cpu"), fmt(cpus))


def test_a_write_to_a_file_the_kernel_does_not_have_is_an_error(topo, state_dir, spawn):
    task = spawn(1, "sleep")
    enf = MisnamedCpus(MOUNT, state_dir, parent=PARENT)
    try:
        with pytest.raises(EnforceError, match=r"cannot write '[0-9-]+' to .*/db/cpuset\.cpu: "):
            enf.apply("db", [task.pid], topo.node_cpus(1), [1])
    finally:
        enf.close()


def test_an_enforcer_pointed_at_a_wrong_hierarchy_fails_the_kernel_check(topo, state_dir, spawn, tmp_path):
    """Writes that land in plain files (a directory that is not cgroupfs) all 'succeed'; the
    affinity pinning still happens.  The check the tests above rely on reads the kernel's cgroup
    of the process, so it fails: a broken cgroup v2 write cannot pass this suite."""
    fake = tmp_path / "cgroup"
    for d in (fake, fake / PARENT):
        d.mkdir()
        (d / "cgroup.subtree_control").write_text("")
        (d / "cgroup.controllers").write_text("cpuset\n")
    task = spawn(1, "sleep")
    cpus = topo.node_cpus(1)
    enf = CpusetV2Enforcer(CpusetMount(2, str(fake)), state_dir, parent=PARENT)
    try:
        for f in ("cpuset.cpus", "cpuset.mems", "cgroup.procs"):
            (fake / PARENT / "db").mkdir(parents=True, exist_ok=True)
            (fake / PARENT / "db" / f).touch()
        enf.apply("db", [task.pid], cpus, [1])
        assert (fake / PARENT / "db" / "cpuset.cpus").read_text() == fmt(cpus)
        with pytest.raises(AssertionError, match="root cgroup"):
            cgroup_confines(task.pid, cpus, (1,))
    finally:
        # Not cgroupfs: its 'cgroup' keeps the files written into it, and removing it says so.
        with pytest.raises(EnforceError, match="cannot remove cgroup .*/db: Directory not empty"):
            enf.close()


def test_the_runner_keeps_a_cpuset_for_the_whole_run():
    # vmrun.py makes it before pytest starts, so that the kernel's cpusets_enabled() key never
    # flips while the tests make and remove their cpusets (a QEMU TCG race with code patching).
    from vmrun import KEPT_CPUSET
    assert "cpuset" in read(os.path.join(KEPT_CPUSET, "cgroup.controllers")).split()

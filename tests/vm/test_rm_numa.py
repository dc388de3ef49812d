"""The RM daemon on a NUMA guest with cgroup v2: a NUMA-sensitive task gets CPUs and memory of
one node (and its pages are there), and a newcomer is kept off that node.  One daemon for the
module: it starts in tens of seconds under TCG."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from cod.rm.enforce.cgroupfs import find_cpuset_mount
from helpers.procs import spawn, spinner_cmd  # noqa: F401 (fixtures)
from helpers.waiting import wait_until
from numa import Toucher, cgroup_confines, fmt, node_pages, status_list
from helpers import rm_support
from helpers.rm_support import Daemon, RawConn

SLOW = 300.0  # seconds: generous under TCG, still a failure when nothing happens
# pytest-timeout's 300 s (pyproject) would cut a wait of SLOW before it can say what it waited for.
pytestmark = pytest.mark.timeout(3 * SLOW)


# The SKB gives SWI-Prolog 20 s to start (skb/session.py), which TCG on a loaded machine exceeds:
# the guest's daemon gets the generous limit, nothing else of it changes.
RM_MAIN = f"""
import sys
from cod.skb import async_engine, engine, session
for module in (session, engine, async_engine):
    if hasattr(module, "STARTUP_TIMEOUT_S"):
        module.STARTUP_TIMEOUT_S = {SLOW}
from cod.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def rm(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rm")
    parent = f"cod-vm-rm-{os.getpid()}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rm_support, "COD", [sys.executable, "-c", RM_MAIN])
        d = Daemon(tmp / "rm.sock", ["--enforce", "cpuset", "--state-dir", str(tmp / "state"), "--cgroup-parent",
                                     parent, "--log-level", "debug", "--busy-scope", f"descendants:{os.getpid()}",
                                     "--busy-window", "2"], tmp / "rm.log").start(timeout=SLOW)
    yield d
    d.proc.send_signal(signal.SIGTERM)
    assert d.proc.wait(SLOW) == 0, d.log_text()[-4000:]
    d.logf.close()
    mount = find_cpuset_mount()
    assert not os.path.exists(os.path.join(mount.path, parent)), "the daemon left its cgroups behind"


@pytest.fixture
def conn(rm):
    c = RawConn(rm.path)
    c.sock.settimeout(SLOW)
    c.hello("vm")
    yield c
    c.close()


def wait_for(rm: Daemon, check, what: str):
    """wait_until with the daemon's last log lines in the failure: a guest run leaves nothing else."""
    try:
        return wait_until(check, SLOW, what)
    except AssertionError as err:
        raise AssertionError(f"{err}\n--- the daemon's log, last lines ---\n{rm.log_text()[-6000:]}") from None


def node_of(topo, cpu: int) -> int:
    return cpu // topo.cpus_per_node


def register(conn: RawConn, name: str, pid: int, **props) -> list[int]:
    reply = conn.call("register_task", {"name": name, "pid": pid, "properties": props})
    assert "result" in reply, reply
    return reply["result"]["allocation"]["cores"]


def test_a_numa_sensitive_task_gets_one_nodes_cpus_and_its_pages_are_there(topo, rm, conn):
    with Toucher(range(topo.cpus)) as t:
        cores = register(conn, "db", t.pid, min_cores=2, max_cores=2, sensitive=["numa"])
        nodes = {node_of(topo, c) for c in cores}
        assert len(cores) == 2 and len(nodes) == 1, cores
        node = nodes.pop()
        wait_for(rm, lambda: os.sched_getaffinity(t.pid) == set(cores), "db pinned")
        # its cpuset keeps every node until the daemon's background page move ends
        wait_for(rm, lambda: status_list(t.pid, "Mems_allowed_list") == fmt((node,)), "db's memory on its node")
        cgroup_confines(t.pid, cores, (node,))
        addr = t.touch(32)
        pages = node_pages(t.pid, addr)
        assert set(pages) == {node} and pages[node] >= 32 * 256, pages
        assert conn.call("deregister_task", {"task": "db"}).get("result") is not None


def test_a_newcomer_is_placed_away_from_a_numa_sensitive_tasks_node(topo, rm, conn, spawn):
    db = spawn(1, "sleep")
    home = register(conn, "db", db.pid, min_cores=1, max_cores=1, sensitive=["numa"])
    node_cpus = set(topo.node_cpus(node_of(topo, home[0])))
    hog = spawn(1, "spin")
    for tid in hog.tids:  # it starts on db's CPU
        os.sched_setaffinity(tid, home)
    wait_for(rm, lambda: all(not set(os.sched_getaffinity(t)) & node_cpus for t in hog.tids),
             f"the newcomer kept off db's node {sorted(node_cpus)}")
    assert sorted(os.sched_getaffinity(db.pid)) == home
    assert conn.call("deregister_task", {"task": "db"}).get("result") is not None

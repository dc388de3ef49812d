"""End to end: a live `cod rm` on a fake resctrl tree (tests/helpers/fake_resctrl.py).

The daemon is the real one, started through ``python -m helpers.fake_resctrl`` so its one
resctrl I/O seam meets the fake kernel's rules.  Tasks of mixed locality arrive and leave,
the groups and masks follow; after a SIGKILL the next start removes what was left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import TESTS
from helpers import rm_support as support
from cod.client import Client
from cod.facts import discover
from cod.rm.enforce.resctrl_info import parse_schemata
from helpers import fake_resctrl as fk
from helpers.procs import spawn, spinner_cmd  # noqa: F401 (fixtures)
from helpers.waiting import wait_until



@pytest.fixture
def fake_tree(tmp_path, monkeypatch):
    """An Intel-like tree with as many L3 domains as this machine has L3 caches, and the daemon
    command that runs `cod` behind the fake kernel."""
    n_l3 = len(discover.from_args().l3_caches())
    if n_l3 == 0:
        pytest.skip("this machine reports no L3 cache: nothing to partition")
    spec = fk.FakeSpec(**{**fk.INTEL.__dict__, "l3_domains": tuple(range(n_l3))})
    root = fk.build_tree(str(tmp_path / "resctrl"), spec)
    monkeypatch.setattr(support, "COD", [sys.executable, "-m", "helpers.fake_resctrl"])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    return root


def start(tmp_path, root):
    return support.start_daemon(tmp_path, "--enforce", "affinity", "--state-dir", str(tmp_path / "state"),
                                "--resctrl-root", root, "--no-busy-detect")


def masks(root: str, group: str) -> dict[int, int]:
    with open(os.path.join(root, group, "schemata")) as f:
        return {d: int(v, 16) for d, v in parse_schemata(f.read())["L3"].items()}


def tasks_of(root: str, group: str) -> set[int]:
    with open(os.path.join(root, group, "tasks")) as f:
        return {int(p) for p in f.read().split()}


def test_groups_follow_tasks_and_a_crash_leaves_nothing(tmp_path, fake_tree, spawn):
    root = fake_tree
    hj, ij = spawn(1, "sleep"), spawn(1, "sleep")
    d = start(tmp_path, root)
    try:
        assert "cache partitioning: resctrl" in d.log_text()
        with Client(str(d.path), app="db") as c:
            # the hash join's class derived by stored_procedures/locality.pl from the facts it pushes
            c.register_task("hj", pid=hj.pid, max_cores=1, working_set_bytes=4 << 20,
                            facts=["plan_operator(q1, hj, hash_join, 1)", "hash_table_bytes(q1, hj, 65536)"],
                            locality={"query": "plan_locality(q1, L)", "var": "L"})
            assert c.list_tasks()[0]["properties"]["locality"] == {"query": "plan_locality(q1, L)", "var": "L"}
            assert fk.group_names(root) == []  # one strength only: nothing to partition
            c.register_task("ij", pid=ij.pid, max_cores=1, locality="weak")
            wait_until(lambda: fk.group_names(root) == ["cod_task_hj", "cod_weak"], what="MLS groups")
            weak, strong = masks(root, "cod_weak")[0], masks(root, "cod_task_hj")[0]
            assert weak == 0x3 and strong == 0xffffc  # 2 of 20 ways for the index join, the rest for the hash join
            wait_until(lambda: hj.pid in tasks_of(root, "cod_task_hj") and ij.pid in tasks_of(root, "cod_weak"),
                       what="tasks in their groups")
            plan = c.call("list_tasks")["plan"]
            if len(discover.from_args().l3_caches()) == 1:  # this machine: the only choice is to partition
                assert plan["cache_policy"].startswith("SLS not possible (the machine has one L3 domain)")
            assert plan["cache_partition"].startswith("MLS: weak-locality ij capped at 2 of 20 ways")
            wait_until(lambda: sorted((r["G"], r["M"]) for r in c.execute_query("cache_partition(G, 0, M)"))
                       == [("task_hj", 0xffffc), ("weak", 0x3)], what="cache_partition facts in the SKB")
            assert c.execute_query("cache_group_task(weak, T)") == [{"T": "ij"}]
            assert c.execute_query("cache_occupancy(weak, 0, B)") == [{"B": 0}]
            shell = subprocess.run([sys.executable, "-m", "cod.cli.main", "shell", "--socket", str(d.path),
                                    "-c", ":cache", "-c", ":plan", "-c", ":explain ij"],
                                   capture_output=True, text=True, timeout=120)
            assert shell.returncode == 0, shell.stderr
            assert "weak: L3 0=3; tasks ij; occupancy 0: 0.0 MiB" in shell.stdout
            assert "task_hj: L3 0=ffffc; tasks hj" in shell.stdout
            assert shell.stdout.count("MLS: weak-locality ij capped at 2 of 20 ways") == 3  # :cache, :plan, :explain
            c.deregister_task("ij")
            wait_until(lambda: fk.group_names(root) == [], what="groups removed when the mix ends")
            c.register_task("ij2", pid=ij.pid, max_cores=1, locality="weak")
            wait_until(lambda: fk.group_names(root) == ["cod_task_hj", "cod_weak"], what="groups again")
            # The crash, while the client is still connected: once it has closed, the daemon may
            # see the tasks leave and remove the groups before a kill after it lands.
            d.stop(signal.SIGKILL)
    finally:
        d.stop(signal.SIGKILL)
    assert fk.group_names(root) == ["cod_task_hj", "cod_weak"]  # a crash leaves them ...
    d = start(tmp_path, root)
    try:
        assert fk.group_names(root) == []  # ... and the next start removes them
        assert "removed resctrl group" in d.log_text()
    finally:
        assert d.stop() == 0
    assert fk.group_names(root) == [] and not (tmp_path / "state" / "resctrl-state.json").exists()


def test_absent_resctrl_is_logged_and_the_daemon_runs(tmp_path, monkeypatch):
    d = support.start_daemon(tmp_path, "--enforce", "affinity", "--state-dir", str(tmp_path / "state"),
                             "--resctrl-root", str(tmp_path / "nothing"), "--no-busy-detect")
    try:
        assert "cache partitioning off" in d.log_text()
    finally:
        assert d.stop() == 0


def test_sls_in_the_daemon_keeps_weak_off_the_strong_ones_l3(tmp_path, spawn):
    """A planning daemon for MagnyCours (8 L3 domains of 6 cores): the index join and the scan land on
    L3 domains the hash join does not use, and the plan says so."""
    from cod.facts import machines

    l3_of = {cpu: i for i, c in enumerate(machines.load("magnycours").l3_caches()) for cpu in c.cpus}
    d = support.start_daemon(tmp_path, "--machine", "magnycours")
    procs = [spawn(1, "sleep") for _ in range(3)]
    try:
        with Client(str(d.path), app="db") as c:
            c.register_task("hj", pid=procs[0].pid, min_cores=6, max_cores=12, locality="moderate")
            c.register_task("ij", pid=procs[1].pid, min_cores=4, max_cores=12, locality="weak")
            c.register_task("scan", pid=procs[2].pid, min_cores=4, max_cores=12, locality="weak")
            listing = c.call("list_tasks")
            doms = {t["task"]: {l3_of[x] for x in t["cores"]} for t in listing["tasks"]}
            assert not doms["hj"] & (doms["ij"] | doms["scan"]), doms
            assert listing["plan"]["cache_policy"].startswith("SLS: weak-locality ij, scan kept off the L3 domains of hj")
    finally:
        assert d.stop() == 0

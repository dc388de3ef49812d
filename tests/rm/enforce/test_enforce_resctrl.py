"""The resctrl backend against fake kernels (tests/helpers/fake_resctrl.py): the kernel's rules
first (the fake must refuse what Linux refuses), then the backend meeting them."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from cod.rm.enforce import resctrl
from cod.rm.enforce.errors import EnforceError
from cod.rm.enforce.resctrl import GroupPlan, ResctrlEnforcer, open_resctrl
from cod.rm.enforce.resctrl_info import parse_schemata, read_info
from cod.rm.enforce.resctrlfs import ResctrlError
from helpers.paths import TESTS
from helpers import fake_resctrl as fk



@pytest.fixture(autouse=True)
def fake_seam(monkeypatch):
    monkeypatch.setattr(resctrl, "FS_FACTORY", fk.fs_factory)


def tree(tmp_path, kind: str, **over) -> str:
    spec = fk.SPECS[kind]
    if over:
        spec = fk.FakeSpec(**{**spec.__dict__, **over})
    return fk.build_tree(str(tmp_path / f"resctrl-{kind}"), spec)


# ---- the fake's rules, table-driven (what Linux's cbm_validate / bw_validate do) ----
RULES = [
    # kind, schemata written, errno or None, last_cmd_status (prefix)
    ("intel", "L3:0=fffff\n", None, "ok"),
    ("intel", "L3:0=ff;1=ff000\n", None, "ok"),
    ("intel", "L3:0=f0f\n", errno.EINVAL, "The mask f0f has non-consecutive 1-bits"),
    ("intel", "L3:0=0\n", errno.EINVAL, "Mask out of range"),
    ("intel", "L3:0=1fffff\n", errno.EINVAL, "Mask out of range"),
    ("intel", "L3:0=xyz\n", errno.EINVAL, "Non-hex character in the mask xyz"),
    ("intel", "L3:7=ff\n", errno.EINVAL, "Unknown domain 7"),
    ("intel", "L3:0=ff;0=f\n", errno.EINVAL, "Duplicate domain 0"),
    ("intel", "MB:0=5\n", errno.EINVAL, "MB value 5 out of range [10,100]"),
    ("intel", "MB:0=55\n", None, "ok"),
    ("intel_cdp", "L3:0=ff\n", errno.EINVAL, "Unknown or unsupported resource name 'L3'"),
    ("intel_cdp", "L3CODE:0=ff\nL3DATA:0=ff\n", None, "ok"),
    ("intel_cdp", "L3DATA:0=1\n", errno.EINVAL, "Need at least 2 bits in the mask"),
    ("amd", "L3:0=f00f\n", None, "ok"),
    ("amd", "L3:0=0\n", None, "ok"),
    ("amd", "MB:0=2048\n", None, "ok"),
    ("amd", "MB:0=2049\n", errno.EINVAL, "MB value 2049 out of range [0,2048]"),
]


@pytest.mark.parametrize("kind,text,err,status", RULES)
def test_fake_kernel_rules(tmp_path, kind, text, err, status):
    root = tree(tmp_path, kind)
    fs = fk.FakeResctrlFS(root)
    fs.mkdir("g")
    before = fs.read("g/schemata")
    if err is None:
        fs.write("g/schemata", text)
    else:
        with pytest.raises(ResctrlError) as exc:
            fs.write("g/schemata", text)
        assert exc.value.errno == err
        assert status in str(exc.value)
        assert fs.read("g/schemata") == before  # a refused write changes nothing
    assert fs.status().startswith(status)


def test_fake_rounds_intel_bandwidth_up_to_its_granularity(tmp_path):
    fs = fk.FakeResctrlFS(tree(tmp_path, "intel"))
    fs.mkdir("g")
    fs.write("g/schemata", "MB:1=55\n")
    assert "1=  60" in fs.read("g/schemata")


@pytest.mark.parametrize("kind", ["intel", "intel_cdp", "amd"])
def test_fake_runs_out_of_closids(tmp_path, kind):
    fs = fk.FakeResctrlFS(tree(tmp_path, kind))
    n = fk.SPECS[kind].num_closids
    for i in range(n - 1):  # the default group holds one
        assert fs.mkdir(f"g{i}")
    with pytest.raises(ResctrlError) as exc:
        fs.mkdir("one-too-many")
    assert exc.value.errno == errno.ENOSPC and exc.value.status == "Out of CLOSIDs"
    assert not os.path.exists(os.path.join(fs.root, "one-too-many"))


def test_fake_keeps_freed_rmids_busy_while_they_drain(tmp_path):
    fs = fk.FakeResctrlFS(tree(tmp_path, "intel", num_rmids=3, limbo_s=60.0))
    fs.mkdir("a")
    fs.mkdir("b")
    fs.rmdir("a")
    with pytest.raises(ResctrlError) as exc:
        fs.mkdir("c")
    assert exc.value.errno == errno.EBUSY and "Out of RMIDs" in str(exc.value)


def test_fake_moves_tasks_between_groups_and_back_on_rmdir(tmp_path):
    fs = fk.FakeResctrlFS(tree(tmp_path, "intel"))
    fs.mkdir("a")
    fs.mkdir("b")
    me = os.getpid()
    fs.write("a/tasks", str(me))
    fs.write("b/tasks", str(me))
    assert fs.read("a/tasks").split() == [] and fs.read("b/tasks").split() == [str(me)]
    fs.rmdir("b")
    assert str(me) in fs.read("tasks").split()
    with pytest.raises(ResctrlError) as exc:
        fs.write("a/tasks", "999999999")
    assert exc.value.errno == errno.ESRCH


# ---- the backend ------------------------------------------------------------------------
def test_info_is_read_from_each_fixture(tmp_path):
    intel = read_info(fk.FakeResctrlFS(tree(tmp_path, "intel")))
    assert (intel.l3.cbm_len, intel.l3.min_cbm_bits, intel.num_closids, intel.l3.sparse) == (20, 1, 16, False)
    assert intel.bandwidth.max_bandwidth == 100 and intel.l3.domains == (0, 1)
    cdp = read_info(fk.FakeResctrlFS(tree(tmp_path, "intel_cdp")))
    assert cdp.cdp and cdp.num_closids == 8 and cdp.l3.name == "L3DATA"
    amd = read_info(fk.FakeResctrlFS(tree(tmp_path, "amd")))
    assert amd.l3.sparse and amd.bandwidth.max_bandwidth == 2048 and len(amd.l3.domains) == 4


@pytest.mark.parametrize("kind", ["intel", "intel_cdp", "amd"])
def test_backend_applies_and_removes_groups(tmp_path, kind):
    root = tree(tmp_path, kind)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        enf = ResctrlEnforcer(root, str(tmp_path / "state"))
        assert enf.apply([GroupPlan("strong", {0: 0xff0}, (sleeper.pid,)),
                          GroupPlan("weak", {0: 0xf})]) == []
        fs = enf.fs
        assert fs.read("cod_strong/tasks").split() == [str(sleeper.pid)]
        values = parse_schemata(fs.read("cod_strong/schemata"))
        for res in ("L3CODE", "L3DATA") if kind == "intel_cdp" else ("L3",):
            assert int(values[res][0], 16) == 0xff0
        assert enf.apply([GroupPlan("strong", {0: 0xff})]) == []  # weak left, strong narrowed
        assert fk.group_names(root) == ["cod_strong"]
        enf.close()
        assert fk.group_names(root) == []
        assert str(sleeper.pid) in fs.read("tasks").split()
        assert not os.path.exists(tmp_path / "state" / resctrl.STATE_FILE)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_backend_reports_the_kernels_words(tmp_path):
    enf = ResctrlEnforcer(tree(tmp_path, "intel"), str(tmp_path / "state"))
    problems = enf.apply([GroupPlan("bad", {0: 0xf0f})])
    assert len(problems) == 1 and "non-consecutive 1-bits" in problems[0] and "cod_bad/schemata" in problems[0]
    enf.close()


def test_backend_reports_closid_exhaustion_and_applies_the_rest(tmp_path):
    enf = ResctrlEnforcer(tree(tmp_path, "intel_cdp"), str(tmp_path / "state"))
    plans = [GroupPlan(f"g{i}", {0: 0x3}) for i in range(9)]  # 8 CLOSIDs, one is the default group's
    problems = enf.apply(plans)
    assert len(problems) == 2 and all("Out of CLOSIDs" in p for p in problems)
    assert len(fk.group_names(enf.fs.root)) == 7
    enf.close()
    assert fk.group_names(enf.fs.root) == []


def test_backend_says_busy_rmids_are_retried(tmp_path):
    enf = ResctrlEnforcer(tree(tmp_path, "intel", num_rmids=3, limbo_s=60.0), str(tmp_path / "state"))
    assert enf.apply([GroupPlan("a", {0: 0x3}), GroupPlan("b", {0: 0x3})]) == []
    problems = enf.apply([GroupPlan("a", {0: 0x3}), GroupPlan("c", {0: 0x3})])
    assert len(problems) == 1 and "Out of RMIDs" in problems[0] and "retried" in problems[0]
    enf.close()


def test_crash_leftovers_are_removed_by_the_next_start(tmp_path):
    root = tree(tmp_path, "amd")
    state = str(tmp_path / "state")
    code = ("import sys, os; sys.path.insert(0, sys.argv[3]); from helpers import fake_resctrl as fk;"
            "from cod.rm.enforce import resctrl; resctrl.FS_FACTORY = fk.fs_factory;"
            "e = resctrl.ResctrlEnforcer(sys.argv[1], sys.argv[2]);"
            "e.apply([resctrl.GroupPlan('x', {0: 0xff}), resctrl.GroupPlan('y', {1: 0xf})]);"
            "os.kill(os.getpid(), 9)")
    subprocess.run([sys.executable, "-c", code, root, state, str(TESTS)])
    fk.FakeResctrlFS(root).mkdir("cod_unrecorded")  # a crash between mkdir and the state file
    fk.FakeResctrlFS(root).mkdir("someone_else")   # not ours: left alone
    assert fk.group_names(root) == ["cod_unrecorded", "cod_x", "cod_y", "someone_else"]
    enf = open_resctrl(root, state)
    assert enf is not None and fk.group_names(root) == ["someone_else"]
    enf.close()


def test_absent_root_disables_partitioning(tmp_path, caplog):
    caplog.set_level("INFO", logger="cod.rm.enforce")
    assert open_resctrl(str(tmp_path / "nothing"), str(tmp_path / "state")) is None
    assert "cache partitioning off" in caplog.text


def test_second_daemon_on_the_same_state_dir_is_refused(tmp_path):
    root = tree(tmp_path, "intel")
    enf = ResctrlEnforcer(root, str(tmp_path / "state"))
    with pytest.raises(EnforceError, match="another COD daemon"):
        ResctrlEnforcer(root, str(tmp_path / "state"))
    enf.close()


def test_monitoring_reads_occupancy_and_bandwidth(tmp_path):
    root = tree(tmp_path, "intel")
    enf = ResctrlEnforcer(root, str(tmp_path / "state"))
    enf.apply([GroupPlan("a", {0: 0xff})])
    with open(os.path.join(root, "cod_a", "mon_data", "mon_L3_01", "llc_occupancy"), "w") as f:
        f.write("1048576\n")
    mon = enf.monitoring()
    assert mon["a"][1]["llc_occupancy"] == 1048576 and mon["a"][0] == {"llc_occupancy": 0, "mbm_total_bytes": 0}
    enf.close()


def test_bad_group_name_is_refused():
    with pytest.raises(EnforceError, match="resctrl group name"):
        GroupPlan("../x", {0: 1})


def test_cod_facts_shows_the_partitions(tmp_path, capsys):
    from cod.cli.main import main

    root = tree(tmp_path, "intel")
    enf = ResctrlEnforcer(root, str(tmp_path / "state"))
    enf.apply([GroupPlan("weak", {0: 0x3})])
    with open(os.path.join(root, "cod_weak", "mon_data", "mon_L3_00", "llc_occupancy"), "w") as f:
        f.write(str(3 << 20))
    assert main(["facts", "--resctrl-root", root]) == 0
    out = capsys.readouterr().out
    assert "L3 20 ways x 2 domains, min 1 bits" in out and "16 CLOSIDs" in out
    assert "group cod_weak: L3:0=00003;1=fffff" in out and "L3 0: 3.0 MiB occupied" in out
    enf.close()
    assert main(["facts", "--resctrl-root", str(tmp_path / "none")]) == 2
    assert "is not a resctrl mount" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["intel", "intel_cdp", "amd"])
def test_backend_writes_only_what_the_kernel_accepts(tmp_path, kind):
    """Random task sets, partitioned (cod.rm.allocator.cachepart) and applied one after another on
    each fixture tree: the fake kernel refuses none of the backend's writes, and the groups never
    exceed the CLOS budget (30 plans per fixture, file I/O through the fake; the 10,000-set property of the masks is in
    test_alloc_cachepart.py)."""
    import random

    from cod.rm.allocator.cachepart import CacheTask, Geometry, partition

    root = tree(tmp_path, kind)
    enf = ResctrlEnforcer(root, str(tmp_path / "state"))
    res = enf.info.l3
    geo = Geometry(res.cbm_len, res.min_cbm_bits, enf.info.num_closids, res.domains, way_bytes=1 << 20)
    rnd = random.Random(28)
    for _ in range(30):
        tasks = [CacheTask(f"t{i}", rnd.choice(["strong", "moderate", "weak", None]), rnd.randint(0, 30) << 20,
                           frozenset(rnd.sample(res.domains, rnd.randint(1, len(res.domains)))))
                 for i in range(rnd.randint(1, 20))]
        part = partition(geo, tasks)
        assert enf.apply([GroupPlan(g.name, g.masks) for g in part.groups]) == []
        assert len(fk.group_names(root)) == len(part.groups) <= enf.info.num_closids - 1
    assert enf.fs.writes and all(p.endswith("schemata") for p, _ in enf.fs.writes)
    enf.close()
    assert fk.group_names(root) == []


def test_pids_follow_their_groups_and_return_to_the_default_one(tmp_path):
    root = tree(tmp_path, "intel")
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    p, q = procs[0].pid, procs[1].pid
    try:
        enf = ResctrlEnforcer(root, str(tmp_path / "state"))
        fs = enf.fs
        assert enf.apply([GroupPlan("weak", {0: 0x3}, (p, q)), GroupPlan("task_a", {0: 0xffffc})]) == []
        assert enf.apply([GroupPlan("weak", {0: 0x3}, (q,)), GroupPlan("task_a", {0: 0xffffc})]) == []
        assert str(p) in fs.read("tasks").split() and fs.read("cod_weak/tasks").split() == [str(q)]
        assert enf.apply([GroupPlan("weak", {0: 0x3}), GroupPlan("task_a", {0: 0xffffc}, (q,))]) == []
        assert fs.read("cod_task_a/tasks").split() == [str(q)] and fs.read("cod_weak/tasks").split() == []
        enf.close()
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()

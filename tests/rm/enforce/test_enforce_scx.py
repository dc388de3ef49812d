"""The sched_ext backend (cod.rm.enforce.scx) where no scx_cod runs, and its map formats.

Where the scheduler runs (the scx guest: make vm-test VM_KERNEL=scx) tests/vm/test_scx.py
checks it against the kernel; here, on a kernel without sched_ext (or without scx_cod
running), the backend must say so and enforce by its fallback."""

from __future__ import annotations

import logging
import os

import pytest

from cod.rm.enforce import AffinityEnforcer, detect
from cod.rm.enforce.errors import EnforceError
from cod.rm.enforce.scx import ScxEnforcer, others_cpus
from cod.rm.enforce.scxmaps import MAX_CPUS, mask_bytes, mask_cpus, scheduler_state
from helpers.procs import allowed_list, needs_root, spawn, spinner_cmd  # noqa: F401 (fixtures)

CPUS = sorted(os.sched_getaffinity(0))


@pytest.mark.parametrize("cpus", [[], [0], [1, 2, 3], [63, 64], [0, 127, 128, MAX_CPUS - 1]])
def test_masks_round_trip(cpus):
    raw = mask_bytes(cpus)
    assert len(raw) == MAX_CPUS // 8 and mask_cpus(raw) == cpus


def test_a_cpu_beyond_the_mask_is_refused():
    with pytest.raises(EnforceError, match=f"CPU {MAX_CPUS} is beyond"):
        mask_bytes([MAX_CPUS])


def sysfs(tmp_path, state: str | None, ops: str | None):
    d = tmp_path / "sched_ext"
    if state is not None:
        d.mkdir()
        (d / "state").write_text(state + "\n")
        if ops is not None:
            (d / "root").mkdir()
            (d / "root" / "ops").write_text(ops + "\n")
    return str(d)


@pytest.mark.parametrize("state,ops,why", [
    (None, None, "no sched_ext"),
    ("disabled", None, "no sched_ext scheduler is running (state: disabled)"),
    ("enabled", "simple", "is 'simple', not 'cod'"),
    ("enabled", None, "has no name"),
    ("enabled", "cod", None),
])
def test_scheduler_state(tmp_path, state, ops, why):
    got = scheduler_state(sysfs(tmp_path, state, ops))
    assert (got is None) if why is None else (why in got)


def test_without_the_scheduler_the_fallback_enforces_and_says_so(tmp_path, spawn, caplog):
    task = spawn(2, "sleep")
    with caplog.at_level(logging.INFO, logger="cod.rm.enforce"):
        enf = ScxEnforcer(AffinityEnforcer(str(tmp_path / "state")), pin_dir=str(tmp_path / "pins"),
                          sched_ext=sysfs(tmp_path, "disabled", None))
    try:
        assert not enf.active
        assert "sched_ext unavailable (no sched_ext scheduler is running" in enf.describe()
        assert "fallback affinity" in enf.describe()
        assert enf.apply("db", [task.pid], [CPUS[-1]], [0]) == [task.pid]
        assert {allowed_list(task.pid, t) for t in task.tids} == {str(CPUS[-1])}
        enf.release("db")
        assert {allowed_list(task.pid, t) for t in task.tids} != {str(CPUS[-1])} or len(CPUS) == 1
    finally:
        enf.close()


def test_a_scheduler_named_cod_without_its_pins_is_not_taken(tmp_path):
    # The state says cod runs, but the maps are not where they should be: the fallback stays.
    enf = ScxEnforcer(AffinityEnforcer(str(tmp_path / "state")), pin_dir=str(tmp_path / "nowhere"),
                      sched_ext=sysfs(tmp_path, "enabled", "cod"))
    try:
        assert not enf.active and "cannot open scx_cod's group_cpus" in enf.describe()
        assert enf.check() is False  # nothing changed
    finally:
        enf.close()


@needs_root()
def test_detect_sched_ext_on_a_kernel_without_it_falls_back_to_cpuset(tmp_path, caplog):
    if scheduler_state() is None:
        pytest.skip("scx_cod runs here: tests/vm/test_scx.py covers it")
    with caplog.at_level(logging.INFO, logger="cod.rm.enforce"):
        enf = detect("sched_ext", str(tmp_path / "state"), root=True, cgroup_parent=f"cod_test_{os.getpid()}")
    try:
        assert enf.name == "sched_ext" and not enf.active
        assert "sched_ext unavailable" in caplog.text and "fallback cpuset" in enf.describe()
    finally:
        enf.close()


@pytest.mark.parametrize("tasks, others", [
    ({}, [0, 1, 2, 3]),
    ({"db": [2, 3]}, [0, 1]),
    ({"db": [1, 2, 3]}, [0]),
    ({"db": [0, 1, 2, 3]}, [0, 1, 2, 3]),  # nothing left: everything may run everywhere
    ({"db": [0, 1], "web": [2, 3]}, [0, 1, 2, 3]),
    # A confined busy process keeps its CPUs for unregistered work: newcomers go there too.
    ({"db": [1, 2, 3], "other.4242": [0]}, [0]),
    ({"db": [2, 3], "other.4242": [0], "other.4343": [1]}, [0, 1]),
    ({"other.4242": [0]}, [0, 1, 2, 3]),
    ({"db": [2, 3], "other.x": [0]}, [1]),  # not a busy process's name: a task like any
])
def test_group_0_gets_the_cpus_no_registered_task_reserved(tasks, others):
    assert others_cpus([0, 1, 2, 3], tasks) == others


# ---- the loader's start and stop (cod.rm.enforce.scxloader), with stand-in programs ----------------
def fake_sched_ext(root, state: str, ops: str | None) -> str:
    (root / "root").mkdir(parents=True)
    (root / "state").write_text(state + "\n")
    if ops is not None:
        (root / "root" / "ops").write_text(ops + "\n")
    return str(root)


def stand_in(tmp_path, script: str):
    exe = tmp_path / "scx_cod"
    exe.write_text("#!/bin/sh\n" + script + "\n")
    exe.chmod(0o755)
    return exe


@pytest.mark.parametrize("script, state, ops, says", [
    # it said it runs, and the kernel agrees (its stderr written before: a SIGTERM may come first)
    ('echo bye >&2; echo "scx_cod: running; maps pinned in /x"; exec sleep 60', "enabled", "cod", None),
    # it said so, but another scheduler is the kernel's
    ('echo "scx_cod: running; maps pinned in /x"; exec sleep 60', "enabled", "rusty", "is 'rusty', not 'cod'"),
    # it could not attach: its own words, and what it wrote on stderr
    ('echo "no luck" >&2; exit 1', "disabled", None, "it printed '' no luck"),
    ('echo "half"; exec sleep 60', "enabled", "cod", "it printed 'half\\n'"),
])
def test_the_loader_starts_only_when_the_kernel_runs_it(tmp_path, script, state, ops, says):
    from cod.rm.enforce.scxloader import ScxLoader

    exe, sched_ext = stand_in(tmp_path, script), fake_sched_ext(tmp_path / "sx", state, ops)
    if says is None:
        loader = ScxLoader(exe, sched_ext)
        assert loader.proc.poll() is None
        rc, err = loader.stop()
        assert (rc, err) == (-15, "bye\n") and loader.stop() == (rc, err)  # stopping twice: the same answer
        return
    with pytest.raises(EnforceError, match="scx_cod did not start") as got:
        ScxLoader(exe, sched_ext)
    assert says in str(got.value), got.value


def test_a_loader_that_writes_much_on_stderr_is_not_stopped_by_it(tmp_path):
    """200 KB on its standard error before it says it runs: more than a pipe holds (64 KB), which
    nobody reads while it runs; it used to block there, and its start with it."""
    from cod.rm.enforce.scxloader import ScxLoader

    exe = stand_in(tmp_path, 'head -c 200000 /dev/zero | tr "\\0" x >&2; '
                             'echo "scx_cod: running; maps pinned in /x"; exec sleep 60')
    with ScxLoader(exe, fake_sched_ext(tmp_path / "sx", "enabled", "cod")) as loader:
        assert loader.proc.poll() is None
    rc, err = loader.stop()
    assert rc == -15 and err == "x" * 200000


def test_a_loader_not_built_says_how_to_build_it(tmp_path):
    from cod.rm.enforce.scxloader import ScxLoader, built_loader

    with pytest.raises(EnforceError, match="is not built .*build_scx_cod.sh"):
        ScxLoader(built_loader(tmp_path))

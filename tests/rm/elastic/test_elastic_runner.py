"""End to end: a real multi-threaded spinner group whose load steps up and down, managed by
the standalone runner through the real enforcement backends."""

from __future__ import annotations

import os
import signal
import time

import pytest

from cod.facts import from_args
from cod.rm.elastic.controller import Limits
from cod.rm.elastic.errors import ElasticError
from cod.rm.elastic.group import CgroupGroup, PidTreeGroup
from cod.rm.elastic.runner import ElasticRunner, open_events
from cod.rm.elastic.settings import ElasticSettings
from cod.rm.enforce import AffinityEnforcer, detect
from cod.rm.enforce.cgroupfs import find_cpuset_mount
from helpers.cgroups import enter, temp_cgroup
from helpers.procs import allowed_list, needs_root, spawn, spinner_cmd  # noqa: F401 (fixtures)

CPUS = sorted(os.sched_getaffinity(0))
MACHINE = from_args()
PERIOD = 0.2
PARENT = f"cod-elastic-test-{os.getpid()}"
two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs to grow")


def masks(pid: int) -> set[str]:
    return {allowed_list(pid, int(t)) for t in os.listdir(f"/proc/{pid}/task")}


def cpulist(cpus) -> str:
    from cod.facts.cpulist import format_cpulist
    return format_cpulist(cpus)


def make_enforcer(kind: str, state_dir: str):
    if kind == "affinity":
        return AffinityEnforcer(state_dir)
    if os.geteuid() != 0 or find_cpuset_mount() is None:
        pytest.skip("the cpuset backend needs root and a cpuset controller")
    return detect("cpuset", state_dir, cgroup_parent=PARENT)


def steps_until(runner: ElasticRunner, predicate, limit: int) -> int:
    """Step once per period until predicate(runner) holds; the number of periods it took."""
    for i in range(1, limit + 1):
        time.sleep(PERIOD)
        assert runner.step() is not None, runner.gone
        if predicate(runner):
            return i
    raise AssertionError(f"not reached within {limit} periods: {runner.history[-limit:]}")


@two_cpus
@pytest.mark.parametrize("kind,backend", [("pids", "affinity"), ("cgroup", "affinity"), ("pids", "cpuset"),
                                          ("cgroup", "cpuset")])
def test_cores_follow_a_load_that_steps_up_and_down(kind, backend, spawn, tmp_path):
    settings = ElasticSettings(period_s=PERIOD, mode="dense", metric="cpu_demand")
    top = len(CPUS)
    task = spawn(top + 1, "spin")  # `top` spinning workers: demand for every CPU
    original = masks(task.pid)
    enforcer = make_enforcer(backend, str(tmp_path / "state"))
    cg = temp_cgroup("runner") if kind == "cgroup" else None
    runner = None
    try:
        if cg is not None:
            path = cg.__enter__()
            mount = find_cpuset_mount()
            if backend == "cpuset" and mount is not None and path.startswith(mount.path.rstrip("/") + "/"):
                pytest.skip("a cgroup in the cpuset backend's own hierarchy is refused (tested below)")
            enter(path, task.pid)
            group = CgroupGroup(path)
        else:
            group = PidTreeGroup([task.pid])
        runner = ElasticRunner("spin", group, MACHINE, enforcer, settings, allowed_cpus=CPUS,
                               events=open_events(group))
        runner.start()
        assert runner.state.cpus == (CPUS[0],)
        assert masks(task.pid) == {cpulist([CPUS[0]])}

        # Up: one CPU per period, plus one period to measure (bounded by top + 2).
        took = steps_until(runner, lambda r: r.state.n == top, top + 2)
        assert took <= top + 1
        assert masks(task.pid) == {cpulist(CPUS)}
        assert all(rec.action in ("allocate", "hold") for rec in runner.history)
        assert "t5" in {t for rec in runner.history for t in rec.fired}
        late = task.spawn_thread()  # born while managed: inherits the group's CPUs
        assert allowed_list(task.pid, late) == cpulist(CPUS)

        # Down: the group stops (SIGSTOP): idle, one CPU released per period, down to one.
        os.kill(task.pid, signal.SIGSTOP)
        took = steps_until(runner, lambda r: r.state.n == 1, top + 2)
        assert took <= top + 1
        assert "t4" in runner.history[-2].fired or "t4" in runner.history[-1].fired
        assert masks(task.pid) == {cpulist(runner.state.cpus)}

        # Idle at the floor: t0 then t7, the last CPU kept.
        steps_until(runner, lambda r: r.history[-1].fired == ("t0", "t7"), 3)
        assert runner.state.n == 1

        # Up again.
        os.kill(task.pid, signal.SIGCONT)
        steps_until(runner, lambda r: r.state.n == top, top + 2)
        text = "".join(f + "\n" for fs in runner.facts().values() for f in fs)
        assert f"elastic_cores(spin, [{','.join(map(str, CPUS))}])" in text
        assert "elastic_transition(spin, t5," in text
    finally:
        os.kill(task.pid, signal.SIGCONT)
        if runner is not None:
            runner.close()
        enforcer.close()
        if cg is not None:
            cg.__exit__(None, None, None)
    assert masks(task.pid) == original  # every thread, the late one too, has its mask back


@two_cpus
def test_the_external_cap_revokes_and_limits(spawn, tmp_path):
    task = spawn(len(CPUS) + 1, "spin")
    cap = {"n": None}
    settings = ElasticSettings(period_s=PERIOD, mode="dense", metric="cpu_demand")
    with AffinityEnforcer(str(tmp_path / "state")) as enforcer:
        runner = ElasticRunner("capped", PidTreeGroup([task.pid]), MACHINE, enforcer, settings,
                               limits=lambda: Limits(cap=cap["n"]), allowed_cpus=CPUS)
        runner.start()
        steps_until(runner, lambda r: r.state.n == len(CPUS), len(CPUS) + 2)
        cap["n"] = 1  # the global allocation wants the others back
        steps_until(runner, lambda r: r.state.n == 1, 1)
        assert runner.history[-1].action == "revoke"
        assert masks(task.pid) == {cpulist(runner.state.cpus)}
        for _ in range(3):  # overloaded, but capped: t1 then t6
            time.sleep(PERIOD)
            runner.step()
        assert runner.history[-1].fired == ("t1", "t6") and runner.state.n == 1
        runner.close()


def test_a_group_that_ends_stops_the_runner(spawn, tmp_path):
    task = spawn(2, "sleep")
    with AffinityEnforcer(str(tmp_path / "state")) as enforcer:
        runner = ElasticRunner("ends", PidTreeGroup([task.pid]), MACHINE, enforcer,
                               ElasticSettings(period_s=PERIOD), allowed_cpus=CPUS)
        runner.start()
        task.stop()
        runner.step()  # the meter finds it gone
        assert runner.step() is None and "exited" in runner.gone
        runner.run(duration=1.0)  # returns at once
        runner.close()
        runner.close()  # idempotent


@needs_root()
def test_a_cgroup_group_refuses_the_cpuset_backend_of_its_own_hierarchy(tmp_path):
    mount = find_cpuset_mount()
    if mount is None:
        pytest.skip("no cpuset controller")
    path = os.path.join(mount.path, f"cod-elastic-refuse-{os.getpid()}")
    os.mkdir(path)
    try:
        enforcer = detect("cpuset", str(tmp_path / "state"), cgroup_parent=PARENT)
        try:
            with pytest.raises(ElasticError, match="affinity backend"):
                ElasticRunner("mixed", CgroupGroup(path), MACHINE, enforcer, ElasticSettings())
        finally:
            enforcer.close()
    finally:
        os.rmdir(path)


def test_standalone_command_line(spawn, tmp_path):
    import subprocess
    import sys
    task = spawn(2, "spin")
    original = masks(task.pid)
    csv = tmp_path / "run.csv"
    out = subprocess.run([sys.executable, "-m", "cod.rm.elastic", "--pid", str(task.pid), "--name", "cli",
                          "--mode", "sparse", "--period", "0.2", "--duration", "1.5", "--csv", str(csv), "--facts",
                          "--state-dir", str(tmp_path / "state")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "elastic_group(cli, pids([" in out.stdout and "elastic_marking(cli, provision," in out.stdout
    rows = csv.read_text().splitlines()
    assert rows[0].startswith("t,load,cpu_s") and len(rows) >= 5
    assert masks(task.pid) == original  # given back at exit
    bad = subprocess.run([sys.executable, "-m", "cod.rm.elastic", "--pid", str(2**22 + 7)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "does not exist" in bad.stderr


def test_elastic_groups_pin_only_through_the_enforcer():
    """No module of cod.rm.elastic sets an affinity or reads /proc itself: pinning goes through
    the Enforcer (apply, add_thread, follow_thread), reading through cod.facts.procfs."""
    import ast
    import pathlib

    import cod.rm.elastic

    for path in sorted(pathlib.Path(cod.rm.elastic.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        called = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert not imported & {"set_thread_affinity", "pin_process"}, path.name
        assert "sched_setaffinity" not in called, path.name
        assert "/proc/{" not in path.read_text(), path.name  # a /proc/PID path of its own

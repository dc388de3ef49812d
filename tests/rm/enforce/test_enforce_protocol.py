"""Every enforcement backend speaks the whole `Enforcer` protocol (issue 48: the monitor called
`moving` on the sched_ext backend, which did not have it, and failed every 5 s), and the daemon's
monitor runs over each backend this machine has without an error in its log."""

from __future__ import annotations

import inspect
import os
import time
from pathlib import Path

import pytest

from cod.rm.enforce import AffinityEnforcer, CpusetV1Enforcer, CpusetV2Enforcer, NullEnforcer
from cod.rm.enforce.backend import Enforcer
from cod.rm.enforce.scx import ScxEnforcer
from helpers.procs import spawn, spinner_cmd  # noqa: F401 (fixtures)
from helpers.rm_support import start_daemon
from helpers.waiting import wait_until

BACKENDS = [NullEnforcer, AffinityEnforcer, CpusetV1Enforcer, CpusetV2Enforcer, ScxEnforcer]
MEMBERS = [name for name in dir(Enforcer) if not name.startswith("_")]


def test_the_protocol_is_the_one_the_callers_use():
    assert {"check", "degraded", "moving", "apply", "release", "describe", "close"} <= set(MEMBERS)


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.__name__)
@pytest.mark.parametrize("member", MEMBERS)
def test_every_backend_has_every_member_with_its_parameters(backend, member):
    assert hasattr(backend, member), f"{backend.__name__} has no {member}"
    wanted = getattr(Enforcer, member)
    if not callable(wanted):
        return
    got = getattr(backend, member)
    assert callable(got), f"{backend.__name__}.{member} is not a method"
    assert list(inspect.signature(got).parameters) == list(inspect.signature(wanted).parameters), \
        f"{backend.__name__}.{member}{inspect.signature(got)} is not Enforcer.{member}{inspect.signature(wanted)}"


def test_the_sched_ext_backend_without_its_scheduler_warns_and_moves_as_its_fallback(tmp_path):
    fallback = AffinityEnforcer(str(tmp_path / "state"))
    enf = ScxEnforcer(fallback, pin_dir=str(tmp_path / "pins"), sched_ext=str(tmp_path / "no-sched-ext"))
    try:
        assert isinstance(enf, Enforcer) and not enf.active
        assert enf.degraded() == ("sched_ext is not in force (this kernel has no sched_ext (CONFIG_SCHED_CLASS_EXT)): "
                                  f"the tasks are enforced by {fallback.describe()}")
        assert enf.moving("db") is False and enf.check() is False
    finally:
        enf.close()


def _modes() -> list[str]:
    """The --enforce modes this machine can serve (cpuset ones need root and a cpuset mount)."""
    from cod.rm.enforce.cgroupfs import find_cpuset_mount

    modes = ["none", "affinity", "sched_ext,affinity"]
    if os.geteuid() == 0 and find_cpuset_mount() is not None:
        modes += ["cpuset", "sched_ext,cpuset"]
    return modes


@pytest.mark.parametrize("mode", _modes())
def test_the_monitor_runs_over_each_backend_without_an_error(tmp_path: Path, mode, spawn):
    # A refresh every 0.1 s: the page walk (and the drift watch, which asks the enforcer whether
    # the task's pages are moving) comes every 5th, so 3 s see several of each.
    d = start_daemon(tmp_path, "--enforce", mode, "--state-dir", str(tmp_path / "state"), "--cgroup-parent",
                     f"cod-test-{os.getpid()}", "--refresh-interval", "0.1", "--busy-scope", "uids:65534")
    try:
        from cod.client import Client

        worker = spawn(2, "sleep")
        with Client.connect(str(d.path), app="proto") as c:
            c.register_task("db", pid=worker.pid, max_cores=1)
            enforcement = c.call("get_topology", {})["enforcement"]
            assert enforcement["mode"] == mode.partition(",")[0]
            assert ("warning" in enforcement) == mode.startswith("sched_ext"), enforcement
            start = time.monotonic()
            assert wait_until(lambda: c.list_tasks() and time.monotonic() - start > 3.0, 30)
            c.deregister_task("db")
        log = d.log_text()
        assert "Traceback" not in log and " ERROR " not in log, log[-4000:]
    finally:
        d.stop()

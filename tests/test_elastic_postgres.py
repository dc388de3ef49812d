"""Smoke test on a real PostgreSQL (Debian's): the elastic runner manages the server's cgroup
(or its postmaster and children) during a short pgbench, grants cores, pins every backend
inside them, and leaves nothing behind."""

from __future__ import annotations

import os
import threading

import pytest

from cod.facts import from_args
from cod.rm.elastic.group import CgroupGroup, PidTreeGroup
from cod.rm.elastic.runner import ElasticRunner, open_events
from cod.rm.elastic.settings import ElasticSettings
from cod.rm.enforce import AffinityEnforcer
from cod.rm.enforce.procfs import cpus_allowed
from helpers.cgroups import temp_cgroup
from helpers.postgres import Postgres, bin_dir

CPUS = sorted(os.sched_getaffinity(0))
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bin_dir() is None, reason="PostgreSQL is not installed (make setup installs it)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="runs the server as the postgres user: needs root"),
]


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.parametrize("kind", ["cgroup", "pids"])
def test_postgres_under_elastic_cores(kind, tmp_path):
    settings = ElasticSettings(period_s=0.2, mode="adaptive")
    cg = temp_cgroup("pg") if kind == "cgroup" else None
    path = cg.__enter__() if cg is not None else None
    pg = Postgres(cgroup=path)
    try:
        pg.start()
        pg.pgbench(["-i", "-s", "2", "-q"]).check_returncode()
        group = CgroupGroup(path) if path else PidTreeGroup([pg.pid])
        assert pg.pid in {m.pid for m in group.members()}
        with AffinityEnforcer(str(tmp_path / "state")) as enforcer:
            runner = ElasticRunner("postgres", group, from_args(), enforcer, settings, allowed_cpus=CPUS,
                                   events=open_events(group))
            assert runner.mode == "dense" or len(runner.layout.nodes) > 1  # one node: adaptive says so
            runner.start()
            stop = threading.Event()
            loop = threading.Thread(target=runner.run, kwargs={"stop": stop})
            loop.start()
            try:
                # Select-only clients keep the server's backends busy.
                bench = pg.pgbench(["-S", "-c", "4", "-j", "2", "-T", "5"])
                assert bench.returncode == 0, bench.stderr
                assert "tps = " in bench.stdout
            finally:
                stop.set()
                loop.join()
            runner.step()  # one more period: the exits and forks of the run's end are seen
            # Every server process (backends started during the run included) is a member,
            # and confined to the group's CPUs.
            server = set(pg.server_pids())
            assert server <= {m.pid for m in group.members()}
            held = set(runner.state.cpus)
            for pid in server:
                assert set(cpus_allowed(pid)) <= held, (pid, cpus_allowed(pid), held)
            if len(CPUS) > 1:
                assert max(r.n_after for r in runner.history) > 1  # cores were granted
                assert "t5" in {t for r in runner.history for t in r.fired}
            runner.close()
            for pid in pg.server_pids():  # released: the server has every CPU back
                assert set(cpus_allowed(pid)) == set(CPUS)
            assert enforcer.tasks() == {}
    finally:
        pg.stop()
        if cg is not None:
            cg.__exit__(None, None, None)
    assert not os.path.exists(pg.base)  # data directory and socket removed
    assert pg.proc.poll() is not None
    assert not [p for p in os.listdir("/proc") if p.isdigit() and pg.base in cmdline(int(p))]  # no process left
    if path:
        assert not os.path.exists(path)

"""Smoke test on a real PostgreSQL (Debian's) through the daemon: `cod elastic` registers the
server's cgroup (or its postmaster and children) with a running `cod rm`, a short pgbench makes the
group grow, every backend is pinned inside the group's CPUs, and after `cod elastic --remove`, the
server's stop and the daemon's stop nothing is left behind."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from cod.client import Client
from cod.facts import from_args
from cod.facts.procfs import cpus_allowed
from helpers.cgroups import temp_cgroup
from helpers.postgres import Postgres, bin_dir
from helpers.rm_support import COD, start_daemon

CPUS = sorted(os.sched_getaffinity(0))
CPUSET = Path("/sys/fs/cgroup/cpuset")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bin_dir() is None, reason="PostgreSQL is not installed (make setup installs it)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="runs the server as the postgres user: needs root"),
]


def cod_elastic(sock: Path, *args: str) -> dict:
    r = subprocess.run([*COD, "elastic", "--socket", str(sock), *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def group_cores(sock: Path) -> list[int]:
    with Client(str(sock)) as c:
        [g] = c.call("list_tasks")["elastic_groups"]
        return g["cores"]


@pytest.mark.parametrize("kind", ["cgroup", "pids"])
def test_postgres_under_elastic_cores_through_the_daemon(kind, tmp_path):
    parent = f"cod_test_{os.getpid()}_pg{kind}"
    cg = temp_cgroup("pg") if kind == "cgroup" else None
    path = cg.__enter__() if cg is not None else None
    pg = Postgres(cgroup=path)
    # The default backend as root (cpuset cgroups of its own when mounted, else affinity).  Busy
    # detection is off: pgbench's clients are this test's descendants and would be kept CPUs for.
    d = start_daemon(tmp_path, "--state-dir", str(tmp_path / "state"), "--cgroup-parent", parent,
                     "--no-busy-detect", "--log-level", "debug")
    try:
        pg.start()
        pg.pgbench(["-i", "-s", "2", "-q"]).check_returncode()
        source = ["--cgroup", path] if path else ["--pid", str(pg.pid)]
        group = cod_elastic(d.path, *source, "--mode", "adaptive", "--period", "0.2", "--metric", "cpu_demand")
        name = group["group"]
        assert len(group["cores"]) == 1
        if len(from_args().numa_nodes) == 1:  # adaptive has no node to choose: it says so, works as dense
            assert group["mode"] == "dense" and "one NUMA node" in group["notes"][0]
        # Select-only clients keep the server's backends busy.
        bench = pg.pgbench(["-S", "-c", "4", "-j", "2", "-T", "5"])
        assert bench.returncode == 0, bench.stderr
        assert "tps = " in bench.stdout
        # A backend started now (a long query) is a member, pinned inside the group's CPUs.
        sleeper = subprocess.Popen([pg.tool("psql"), *pg.conn_args(), "-d", "postgres", "-Atqc",
                                    "SELECT pg_backend_pid(), pg_sleep(3)"], stdout=subprocess.PIPE, text=True)
        time.sleep(1.0)
        held = set(group_cores(d.path))
        server = pg.server_pids()
        assert len(server) >= 5  # postmaster, its background processes and the sleeper's backend
        for pid in server:
            assert set(cpus_allowed(pid)) <= held, (pid, cpus_allowed(pid), held)
        backend = int(sleeper.communicate(timeout=30)[0].split("|")[0])
        assert backend in server
        out = cod_elastic(d.path, "--remove", *(["--cgroup", path] if path else ["--name", name]))
        assert out["group"] == name and len(out["periods"]) > 10
        with Client(str(d.path)) as c:
            assert c.call("list_tasks")["elastic_groups"] == []
        for pid in pg.server_pids():  # released: the server has every CPU back
            assert set(cpus_allowed(pid)) == set(CPUS), pid
        log = d.log_text()
        if len(CPUS) > 1:
            assert f"elastic group {name}: allocate" in log, "cores were granted during pgbench"
    finally:
        pg.stop()
        d.stop()
        if cg is not None:
            cg.__exit__(None, None, None)
    assert not (tmp_path / "state" / "enforce-state.json").exists(), "a clean stop leaves no record"
    assert not (CPUSET / parent).exists(), "nor a cgroup of the daemon's"
    assert not os.path.exists(pg.base), "nor the server's data"

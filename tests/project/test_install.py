"""`pip install .` gives a working `cod` with its Prolog files, from a wheel, outside this checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers.paths import REPO



@pytest.mark.slow
def test_a_wheel_installs_and_runs_the_readme_example(tmp_path):
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO)],
                   check=True, cwd=tmp_path)
    [wheel] = wheels.glob("cod_policy_engine-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(wheel)], check=True, cwd=tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COD_STORED_PROCEDURES")}
    # The README's example, run far from the checkout: the stored procedures come from the wheel.
    out = subprocess.run(
        [str(venv / "bin" / "cod"), "query", "--machine", "magnycours", "--app", "cscs",
         "--fact", "db_ntuple(30000000)", "--fact", "db_tsize(315)", "--fact", "db_nquery(2048)",
         "--fact", "db_nupdate(0)", "--fact", "db_rtime(2000)",
         "--load", str(REPO / "stored_procedures" / "examples" / "cscs_cost_fn.pl"),
         "dbos_cost_function(S, N, P)"],
        check=True, capture_output=True, text=True, cwd=tmp_path, env=env)
    assert json.loads(out.stdout) == {"S": 0, "N": 8, "P": 1181250000}
    files = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import cod.skb.session as s, cod.stored_procedures as p, pathlib;"
                            "print(s.SERVER_FILE, pathlib.Path(p.__file__).parent)"],
                           check=True, capture_output=True, text=True, cwd=tmp_path, env=env).stdout.split()
    assert all(str(venv) in f for f in files), files


@pytest.mark.slow
def test_the_wheel_builds_without_a_warning_and_holds_the_data_files(tmp_path):
    """`make setup` and `pip install .` print no packaging warning (issue 32: setuptools warned about
    every folder of data files that was not a package), and the wheel holds every Prolog file and
    machine description of the checkout."""
    wheels = tmp_path / "wheels"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(wheels), str(REPO)],
                       capture_output=True, text=True, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    said = (r.stdout + r.stderr).lower()
    assert "warning" not in said, r.stdout + r.stderr
    [wheel] = wheels.glob("cod_policy_engine-*.whl")
    with zipfile.ZipFile(wheel) as z:
        held = set(z.namelist())
    wanted = {f"cod/skb/prolog/{p.name}" for p in (REPO / "skb" / "prolog").glob("*.pl")}
    wanted |= {f"cod/stored_procedures/{p.relative_to(REPO / 'stored_procedures')}"
               for p in (REPO / "stored_procedures").rglob("*.pl")}
    wanted |= {f"cod/facts/machines/{p.name}" for p in (REPO / "facts" / "machines").glob("*.json")}
    assert len(wanted) >= 10 and wanted <= held, sorted(wanted - held)

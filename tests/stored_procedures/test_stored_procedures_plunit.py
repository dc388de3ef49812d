"""The plunit tests beside the stored procedures (stored_procedures/*.plt),
run on the reference machines' facts and two hwloc topologies."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from cod.facts import hwloc_xml, machines
from cod.facts.prolog import to_prolog
from helpers.paths import REPO
from helpers.data import HWLOC_DIR

PLT_FILES = sorted((REPO / "stored_procedures").glob("*.plt"))
# Machines the .plt files name, as Prolog atoms, and where their facts come from.
HWLOC_MACHINES = {
    "zen2x7451": "AMD-17h-Zen-2xEpyc-7451.xml",  # 2 x 24 cores, SMT, 3-core L3s, 8 nodes
    "em64t_4s2c2t": "16em64t-4s2c2t.xml",       # 4 sockets x 2 cores x 2 threads
}


@pytest.fixture(scope="module")
def machine_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("machines")
    for name in machines.names():
        (d / f"{name.replace('-', '_')}.pl").write_text(to_prolog(machines.load(name)))
    for name, xml in HWLOC_MACHINES.items():
        (d / f"{name}.pl").write_text(to_prolog(hwloc_xml.load(HWLOC_DIR / xml)))
    return d


@pytest.mark.parametrize("plt", PLT_FILES, ids=lambda p: p.name)
def test_plunit(plt: Path, machine_dir: Path) -> None:
    proc = subprocess.run(
        ["swipl", "-g", "run_tests", "-t", "halt", str(plt)],
        env={"COD_TEST_MACHINES": str(machine_dir), "PATH": "/usr/bin:/bin:/usr/local/bin", "HOME": str(machine_dir)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "failed" not in out, out
    passed = re.search(r"All (\d+) tests passed", out)
    assert passed and int(passed.group(1)) > 0, out

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


# The engine's probe, run by the fresh environment's Python: is the seccomp filter in force? The
# escape library (tests/data/skb_escape) runs a program through the ELF interpreter, which
# Landlock alone lets through (tests/skb/test_skb_lockdown.py) and only the filter refuses.
SECCOMP_PROBE = """
import json, sys
from pathlib import Path
from cod.skb import SKB, EngineConfig, native_libs
with SKB(config=EngineConfig(library_dir=Path(sys.argv[1]))) as skb:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{skb.pid}/status").read_text().splitlines())
    maps = Path(f"/proc/{skb.pid}/maps").read_text()
    [loader] = skb.execute_query("probe", "escape_loader(['/lib64/ld-linux-x86-64.so.2', '/bin/true'], R)")
    print(json.dumps({"seccomp": status["Seccomp"].strip(), "maps": [n for n in ("cod_noexec.so", "cod_frames.so")
                                                                    if n in maps],
                      "loader": str(loader["R"]), "warning": native_libs.startup_warning(),
                      "native_libs": native_libs.__file__}))
"""


@pytest.mark.slow
def test_an_sdist_install_builds_the_native_helpers_and_the_engine_runs_under_its_seccomp_filter(tmp_path):
    """Issue 53: `pip install` of the sdist into a fresh virtual environment, far from the checkout,
    builds the SKB engine's native helpers (setup.py); the engine runs under its seccomp filter
    against execve, loads the frames in C, and `cod query` prints no warning."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COD_STORED_PROCEDURES")}
    subprocess.run([sys.executable, "-m", "build", "--sdist", "--outdir", str(tmp_path / "dist"), str(REPO)],
                   check=True, capture_output=True, cwd=tmp_path, env=env)
    [sdist] = (tmp_path / "dist").glob("cod_policy_engine-*.tar.gz")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(sdist)], check=True, cwd=tmp_path, env=env)
    q = subprocess.run([str(venv / "bin" / "cod"), "query", "--machine", "magnycours", "X = 1"],
                       capture_output=True, text=True, cwd=tmp_path, env=env)
    assert (q.returncode, q.stdout, q.stderr) == (0, '{"X": 1}\n', "")
    (tmp_path / "probe.py").write_text(SECCOMP_PROBE)
    r = subprocess.run([str(venv / "bin" / "python"), str(tmp_path / "probe.py"),
                        str(REPO / "tests" / "data" / "skb_escape")],
                       capture_output=True, text=True, cwd=tmp_path, env=env, check=True)
    seen = json.loads(r.stdout)
    assert seen["native_libs"].startswith(str(venv)), seen
    assert seen["seccomp"] == "2" and seen["maps"] == ["cod_noexec.so", "cod_frames.so"], seen
    assert seen["loader"] != "exit(0)" and seen["warning"] is None, seen

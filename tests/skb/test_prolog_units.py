"""The Prolog modules' own plunit tests (skb/prolog/*.plt), run in a real swipl with the server loaded."""

from __future__ import annotations

import re
import subprocess

from cod.skb.session import PROLOG_DIR


def test_plunit_suites_pass():
    units = {p.stem for p in PROLOG_DIR.glob("*.plt")}
    assert units >= {"cod_guard", "cod_apps", "cod_sys"}
    goal = "load_test_files([]), (run_tests -> halt(0) ; halt(1))"
    r = subprocess.run(["swipl", "-f", "none", "-g", goal, "-t", "halt(2)", str(PROLOG_DIR / "cod_server.pl")],
                       capture_output=True, text=True, timeout=120, cwd=PROLOG_DIR)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    ran = set(re.findall(r"PL-Unit: (\w+)", out))
    assert ran == units, out  # every .plt beside the modules ran
    m = re.search(r"All (\d+) tests passed", out)
    assert m and int(m.group(1)) > 50, out

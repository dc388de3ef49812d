"""`cod` starts without the heavy parts of the product it does not use (bench/cli_start.py).

Building the parser of every subcommand (what `cod --help` and every command does first) used to
import OR-Tools, the SKB's drivers and every enforcement backend: 1.5-1.8 s at load 3.5 against
the interpreter's 86 ms. Each of them is imported by the command that needs it, when it runs.
Checked in a fresh interpreter by what is in ``sys.modules``, not by time.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# the solver, the engine's drivers, the enforcement backends (resctrl's reader is light), the daemon
HEAVY = ("ortools", "cod.skb", "cod.rm.enforce.backend", "cod.rm.daemon", "numpy", "pandas")


def modules_after(code: str) -> set[str]:
    probe = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          check=True)
    return set(json.loads(done.stdout.splitlines()[-1]))


def heavy_in(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


def test_building_every_subcommands_parser_imports_nothing_heavy():
    loaded = modules_after("from cod.cli.main import build_parser\nbuild_parser()")
    assert heavy_in(loaded) == []


@pytest.mark.parametrize("argv", [["facts", "--machine", "magnycours"], ["facts", "--machine", "magnycours",
                                                                          "--format", "prolog"]])
def test_cod_facts_runs_without_the_solver_or_the_engine(argv):
    code = ("import contextlib, io\nfrom cod.cli.main import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()):\n    assert main({argv!r}) == 0")
    assert heavy_in(modules_after(code)) == []


def test_the_allocator_loads_its_solvers_when_asked():
    loaded = modules_after("import cod.rm.allocator as a\nassert a.SOLVERS\n")
    assert "ortools" not in loaded
    loaded = modules_after("from cod.rm.allocator import Allocator\n")
    assert "ortools" in loaded

"""The README's `cod plan` example runs as shown (issue 32): its command on the task file of
docs/examples gives the output the README prints, apart from the solve time."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from helpers.paths import REPO

COD = [sys.executable, "-m", "cod.cli.main"]


def readme_block(starting: str) -> list[str]:
    """The lines of the README's ```sh block whose first line starts with `starting`."""
    for block in re.findall(r"```sh\n(.*?)```", (REPO / "README.md").read_text(), re.S):
        lines = block.rstrip("\n").splitlines()
        if lines and lines[0].startswith(starting):
            return lines
    raise AssertionError(f"the README has no sh block starting with {starting!r}")


def without_time(text: str) -> str:
    return re.sub(r"in \d+\.\d+ ms", "in T ms", text)


def test_the_readme_plan_example_runs_as_shown() -> None:
    command, *shown = readme_block(".venv/bin/cod plan")
    args = command.split()[1:]
    env = {**os.environ, "COLUMNS": "100"}  # the terminal the README's text says the matrix is folded to
    r = subprocess.run([*COD, *args], capture_output=True, text=True, cwd=REPO, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert without_time(r.stdout).splitlines() == [without_time(line) for line in shown]

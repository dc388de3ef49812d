"""docs/pyclient.md's examples run as shown (issue 32): every ```python block is a whole program,
run against a real daemon (`cod rm --machine magnycours`, found through $COD_SOCKET); the ```text
block after "Output:" is what it must print."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import REPO
from helpers.rm_support import magny  # noqa: F401  (a fixture)

DOC = REPO / "docs" / "pyclient.md"


def examples() -> list[tuple[str, str, str | None]]:
    """(section, code, expected output or None) of each python block, in order."""
    text = DOC.read_text()
    found = []
    for m in re.finditer(r"```python\n(.*?)```\n(?:\nOutput:\n\n```text\n(.*?)```)?", text, re.S):
        section = re.findall(r"^## (.+)$", text[:m.start()], re.M)[-1]
        found.append((section, m.group(1), m.group(2)))
    return found


def test_the_page_has_its_examples():
    sections = [s for s, _, _ in examples()]
    assert len(sections) >= 5 and all(out is not None for _, _, out in examples())
    for wanted in ("Register, upcall, acknowledge", "Conditions", "Derived properties", "Errors"):
        assert wanted in sections, sections


@pytest.mark.parametrize("section, code, output", examples(), ids=[s for s, _, _ in examples()])
def test_example_runs_as_shown(magny, tmp_path, section, code, output):
    program = tmp_path / "example.py"
    program.write_text(code)
    env = {**os.environ, "COD_SOCKET": str(magny.path)}
    r = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", str(program)], capture_output=True,
                       text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout == output, r.stdout

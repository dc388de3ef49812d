"""docs/cclient.md's C programs, and the Listing 1 example, as a user builds them (issue 53, item 2):
libcod installed into a private prefix (`make install PREFIX=...`), each program compiled with
`cc -std=c11 -Wall -Wextra -Werror $(pkg-config --cflags --libs cod)` and nothing of the
repository's Makefile (no -D_GNU_SOURCE, no -I into the tree), then run against a real `cod rm`
started with the arguments the page's "Output, against `cod rm ...`" line names; the ```text block
after it is what the program must print."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from cod.facts import from_args
from test_client_listing1 import expected_cores
from helpers.paths import REPO
from helpers.rm_support import start_daemon

DOC = REPO / "docs" / "cclient.md"
CDIR = REPO / "clients" / "c"
STRICT = ["-std=c11", "-Wall", "-Wextra", "-Werror"]
# A C block, then "Output, against `cod rm ARGS`..." and the text block it prints.
EXAMPLE = re.compile(r"```c\n(.*?)```\n\nOutput, against `cod rm ([^`]*)`[^\n]*:\n\n```text\n(.*?)```", re.S)


def examples() -> list[tuple[str, str, list[str], str]]:
    """(section, program, daemon arguments, expected output) of each C block, in order."""
    text = DOC.read_text()
    found = []
    for m in EXAMPLE.finditer(text):
        section = re.findall(r"^## (.+)$", text[:m.start()], re.M)[-1]
        found.append((section, m.group(1), shlex.split(m.group(2)), m.group(3)))
    return found


@pytest.fixture(scope="module")
def prefix(tmp_path_factory) -> Path:
    """libcod installed as docs/cclient.md says, into a prefix of this test's own."""
    where = tmp_path_factory.mktemp("prefix")
    r = subprocess.run(["make", "-s", "-C", str(CDIR), "install", f"PREFIX={where}"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return where


def build(prefix: Path, source: Path, program: Path) -> subprocess.CompletedProcess[str]:
    """cc as a user runs it: the compiler, the strict flags and what pkg-config says, nothing else."""
    env = {k: v for k, v in os.environ.items() if k not in ("CFLAGS", "CPPFLAGS", "C_INCLUDE_PATH", "CPATH")}
    env["PKG_CONFIG_PATH"] = str(prefix / "lib" / "pkgconfig")
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "cod"], capture_output=True, text=True, env=env,
                           check=True).stdout.split()
    return subprocess.run(["cc", *STRICT, str(source), "-o", str(program), *flags], capture_output=True,
                          text=True, env=env, cwd=source.parent)


def test_every_c_block_of_the_page_is_a_program_with_its_output():
    blocks = re.findall(r"```c\n", DOC.read_text())
    found = examples()
    assert len(found) == len(blocks) >= 3, "each ```c block needs its 'Output, against `cod rm ...`' line"
    assert all("int main(" in program for _, program, _, _ in found)


@pytest.mark.parametrize("section, program, daemon_args, output", examples(), ids=[e[0] for e in examples()])
def test_the_page_s_program_builds_from_the_installed_prefix_and_runs_as_shown(prefix, tmp_path, section,
                                                                               program, daemon_args, output):
    source = tmp_path / "app.c"
    source.write_text(program)
    built = build(prefix, source, tmp_path / "app")
    assert built.returncode == 0, built.stderr
    # The daemon as the page names it; its state under this test's directory (--no-enforce pins nothing).
    d = start_daemon(tmp_path, *daemon_args, "--state-dir", str(tmp_path / "state"), "--log-level", "warning")
    try:
        env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"} | {"COD_SOCKET": str(d.path)}
        r = subprocess.run([str(tmp_path / "app")], capture_output=True, text=True, env=env, timeout=60)
    finally:
        d.stop()
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert r.stdout == output


def test_the_cost_function_example_prints_what_the_paper_s_model_gives():
    """Not a number copied from a run: the output block is the model's (tests/test_client_listing1.py)."""
    [(_, _, _, output)] = [e for e in examples() if "dbos_cost_function" in e[1]]
    assert output == f"NrCores = {expected_cores(from_args(machine='magnycours'), 3000)}\n"


def test_listing1_builds_from_the_installed_prefix_and_runs(prefix, tmp_path):
    """clients/c/examples/listing1.c with -std=c11 and pkg-config alone: it asks for POSIX itself
    (clock_gettime, setenv), and runs as `make check-progs`'s build does."""
    built = build(prefix, CDIR / "examples" / "listing1.c", tmp_path / "listing1")
    assert built.returncode == 0, built.stderr
    d = start_daemon(tmp_path, "--machine", "magnycours")
    try:
        r = subprocess.run([str(tmp_path / "listing1"), "--socket", str(d.path)], capture_output=True, text=True,
                           timeout=60)
    finally:
        d.stop()
    assert r.returncode == 0, r.stderr
    lines = {title: json.loads(value) for title, _, value in (line.partition(": ") for line in r.stdout.splitlines())}
    n = expected_cores(from_args(machine="magnycours"), 3000)
    assert lines["deployment derived by the SKB"]["NrCores"] == n and len(lines["allocation"]["cores"]) == n

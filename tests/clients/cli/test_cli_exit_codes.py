"""One set of exit statuses for every `cod` subcommand, and one sentence for a socket nothing answers
on (issue 53, item 4): the same kind of failure exits with the same status whichever subcommand
meets it (an unknown machine was 2 in `cod facts` and `cod shell` but 1 in `cod query`), the
README's table is the code's, and the Python client, the shell and the C client say "no COD daemon
answers on PATH: why" alike (the Python client said "no COD RM answers")."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from cod.cli.errors import MEANING, ExitStatus
from cod.client import Client
from cod.client.errors import NotConnected
from cod.protocol.paths import no_daemon
from helpers.paths import REPO
from helpers.rm_support import COD

CDIR = REPO / "clients" / "c"
GRAPH = REPO / "docs" / "examples" / "plans" / "scan_join.json"


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "tasks.json").write_text(json.dumps({"tasks": [{"name": "db", "min_cores": 2}]}))
    (tmp_path / "huge.json").write_text(json.dumps({"tasks": [{"name": "db", "min_cores": 64}]}))
    (tmp_path / "bad.json").write_text(json.dumps({"tasks": [{"name": "db", "min_cores": "two"}]}))
    return tmp_path


M = ["--machine", "magnycours"]
# (id, arguments ({d}: the test's directory), the status)
ROWS = [
    ("facts: unknown machine", ["facts", "--machine", "vax"], ExitStatus.BAD_INPUT),
    ("query: unknown machine", ["query", "--machine", "vax", "true"], ExitStatus.BAD_INPUT),
    ("plan: unknown machine", ["plan", "--machine", "vax", "--tasks", "{d}/tasks.json"], ExitStatus.BAD_INPUT),
    ("deploy-plan: unknown machine", ["deploy-plan", "--machine", "vax", "--graph", str(GRAPH)], ExitStatus.BAD_INPUT),
    ("shell: unknown machine", ["shell", "--machine", "vax", "-c", "true."], ExitStatus.BAD_INPUT),
    ("rm: unknown machine", ["rm", "--socket", "{d}/rm.sock", "--machine", "vax"], ExitStatus.BAD_INPUT),
    ("query: syntax error", ["query", *M, "X = "], ExitStatus.BAD_INPUT),
    ("query: --load of a missing file", ["query", *M, "--load", "{d}/none.pl", "true"], ExitStatus.BAD_INPUT),
    ("plan: a bad task file", ["plan", *M, "--tasks", "{d}/bad.json"], ExitStatus.BAD_INPUT),
    ("plan: a missing task file", ["plan", *M, "--tasks", "{d}/none.json"], ExitStatus.BAD_INPUT),
    ("shell: syntax error", ["shell", *M, "-c", "X = ."], ExitStatus.BAD_INPUT),
    ("elastic: no group given", ["elastic", "--socket", "{d}/none.sock"], ExitStatus.BAD_INPUT),
    ("query: no solution", ["query", *M, "fail"], ExitStatus.NOT_FOUND),
    ("shell: no solution", ["shell", *M, "-c", "fail."], ExitStatus.NOT_FOUND),
    ("shell: no daemon", ["shell", "--socket", "{d}/none.sock", "-c", "true."], ExitStatus.UNREACHABLE),
    ("elastic: no daemon", ["elastic", "--socket", "{d}/none.sock", "--list"], ExitStatus.UNREACHABLE),
    ("plan: does not fit", ["plan", "--machine", "shanghai", "--tasks", "{d}/huge.json"], ExitStatus.DOES_NOT_FIT),
    ("plan: fits", ["plan", *M, "--tasks", "{d}/tasks.json"], ExitStatus.OK),
]


@pytest.mark.parametrize("args, status", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_each_kind_of_failure_has_one_status_in_every_subcommand(files, args, status):
    argv = [a.replace("{d}", str(files)) for a in args]
    r = subprocess.run([*COD, *argv], capture_output=True, text=True, timeout=120, cwd=files)
    assert r.returncode == status, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr


def test_the_readme_table_is_the_code_s():
    text = (REPO / "README.md").read_text()
    rows = re.findall(r"^\| (\d+) \| `([A-Z_]+)` \| (.+) \|$", text, re.M)
    assert [(int(n), name, meaning) for n, name, meaning in rows] == [
        (int(s), s.name, MEANING[s]) for s in ExitStatus]


def test_every_client_says_the_same_sentence_when_no_daemon_answers(tmp_path):
    missing = str(tmp_path / "none.sock")
    want = no_daemon(missing, "No such file or directory")
    with pytest.raises(NotConnected) as caught:
        Client(missing, reconnect=False)
    assert str(caught.value) == want
    shell = subprocess.run([*COD, "shell", "--socket", missing, "-c", "true."], capture_output=True, text=True,
                           timeout=60)
    assert shell.stderr.startswith(f"cod shell: error: N{want[1:]}; start one with `cod rm`"), shell.stderr
    # The C client, as a program built against libcod says it.
    subprocess.run(["make", "-s", "-C", str(CDIR), "all"], check=True, capture_output=True)
    src = tmp_path / "hello.c"
    src.write_text('#include <stdio.h>\n#include <cod.h>\nint main(int argc, char **argv) {\n'
                   '  (void)argc; if (cod_connect(argv[1], NULL)) return 1; puts(cod_connect_error()); return 0; }\n')
    subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", f"-I{CDIR / 'include'}", str(src), "-o",
                    str(tmp_path / "hello"), str(CDIR / "build" / "libcod.a"), "-ljansson", "-lpthread"], check=True)
    c = subprocess.run([str(tmp_path / "hello"), missing], capture_output=True, text=True, check=True)
    assert c.stdout == want + "\n"

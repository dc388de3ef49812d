"""`cod query` as a user runs it: a real process, JSON lines out, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import REPO

COD = [sys.executable, "-m", "cod.cli.main"]
COST_FN = REPO / "stored_procedures" / "examples" / "cscs_cost_fn.pl"


def cod(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*COD, *args], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("machine, sla_ms, cores", [("magnycours", 2000, 8), ("barcelona", 8000, 5)])
def test_listing3_from_the_command_line(machine: str, sla_ms: int, cores: int) -> None:
    facts = ["db_ntuple(30000000)", "db_tsize(315)", "db_nquery(2048)", "db_nupdate(0)", f"db_rtime({sla_ms})"]
    args = ["query", "--machine", machine, "--app", "cscs", "--load", str(COST_FN)]
    for fact in facts:
        args += ["--fact", fact]
    result = cod(*args, "dbos_cost_function(S, N, P)")
    assert result.returncode == 0, result.stderr
    assert [json.loads(line) for line in result.stdout.splitlines()] == [
        {"S": 0, "N": cores, "P": 30000000 * 315 // cores}
    ]


def test_one_json_object_per_solution() -> None:
    result = cod("query", "--machine", "shanghai", "numa_node(N, _, _)")
    assert [json.loads(line)["N"] for line in result.stdout.splitlines()] == [0, 1, 2, 3]


@pytest.mark.parametrize(
    "args, message",
    [
        (["shell(ls)"], "unsafe goal"),
        (["foo("], "syntax error at line 1"),
        (["--machine", "nosuch", "true"], "unknown machine"),
        (["--load", "/nonexistent.pl", "true"], "cannot read /nonexistent.pl"),
        (["--fact", "bad(", "true"], "syntax error"),
        (["repeat, fail", "--timeout", "0.3"], "limit"),
    ],
)
def test_errors_are_one_clear_line(args: list[str], message: str) -> None:
    result = cod("query", "--machine", "shanghai", *args)
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_no_daemon_is_said_once(tmp_path: Path) -> None:
    sock = tmp_path / "none.sock"
    result = cod("elastic", "--list", "--socket", str(sock))
    assert result.returncode != 0 and "Traceback" not in result.stderr
    [line] = result.stderr.strip().splitlines()
    assert line.count(str(sock)) == 1 and "no COD daemon answers" in line and "No such file" in line, line

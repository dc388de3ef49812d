"""`cod shell` in scripts: `-c`, standard input, `--format json`, and exit statuses.

Plain subprocesses against a real daemon (two tasks registered for real sleeping
processes) and against the embedded SKB.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from cod.client import Client
from cod.cli.errors import ExitStatus
from cod.rm.config import RMConfig
from helpers.paths import TESTS
from helpers.rm_support import COD, start_daemon

pytestmark = pytest.mark.slow


def run_shell(*args: str, stdin: str = "", env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(COD + ["shell", *args], input=stdin, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "100", **(env or {})})


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A daemon with tasks `scan` (application db) and `olap1` (application olap)."""
    tmp = tmp_path_factory.mktemp("shell")
    d = start_daemon(tmp, "--machine", "magnycours")
    procs = [subprocess.Popen(["sleep", "600"]) for _ in range(2)]
    clients = [Client(str(d.path), app="db"), Client(str(d.path), app="olap")]
    clients[0].register_task("scan", pid=procs[0].pid, min_cores=4, max_cores=8, sensitive=["numa"])
    clients[1].register_task("olap1", pid=procs[1].pid, min_cores=2, working_set_bytes=8 << 30)
    # olap1's arrival takes CPUs from scan, which acknowledges nothing: they change hands at the
    # revocation deadline, one more epoch.  Tests compare reads made at different moments, so
    # they start once the epoch has stood still for longer than that deadline.
    settled_epoch(clients[1], quiet_s=RMConfig().revoke_deadline_s + 1.0)
    yield d, clients
    for c in clients:
        c.close()
    for p in procs:
        p.kill()
        p.wait()
    d.stop()


def settled_epoch(client: Client, quiet_s: float, timeout: float = 60.0) -> int:
    """The daemon's epoch once it has not changed for ``quiet_s`` seconds."""
    deadline = time.monotonic() + timeout
    epoch, since = client.call("list_tasks")["epoch"], time.monotonic()
    while time.monotonic() - since < quiet_s:
        assert time.monotonic() < deadline, f"the allocation did not settle within {timeout} s"
        time.sleep(0.1)
        now = client.call("list_tasks")["epoch"]
        if now != epoch:
            epoch, since = now, time.monotonic()
    return epoch


def json_lines(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_c_runs_a_query_and_a_command(world) -> None:
    d, clients = world
    r = run_shell("--socket", str(d.path), "-c", "task(T, _, App)", "-c", ":tasks")
    assert r.returncode == 0, r.stderr
    assert "T = scan,\nApp = db ;\nT = olap1,\nApp = olap.\n" in r.stdout  # all answers, no prompt
    assert re.search(r"scan\s+\|\s+\d+\s+\|\s+db\s+\|", r.stdout)
    assert "\x1b[" not in r.stdout  # plain text when not a terminal


def test_json_allocation_matches_the_daemon(world) -> None:
    d, clients = world
    r = run_shell("--socket", str(d.path), "--format", "json", "-c", ":allocation", "-c", "allocated(olap1, C).",
                  "-c", ":explain scan")
    assert r.returncode == 0, r.stderr
    alloc, query, explain = json_lines(r.stdout)
    cores = {t["task"]: t["cores"] for t in alloc["result"]["tasks"]}
    assert cores["scan"] == clients[0].get_allocation("scan")["cores"]
    assert cores["olap1"] == clients[1].get_allocation("olap1")["cores"]
    assert alloc["result"]["plan"]["solver"] in ("cpsat", "greedy")
    assert sorted(s["C"] for s in query["solutions"]) == cores["olap1"] and query["truncated"] is False
    assert explain["result"]["task"] == "scan" and explain["result"]["cores"] == cores["scan"]
    assert any("max_cores (8)" in c["text"] for c in explain["result"]["constraints"])


def test_stdin_script_with_multi_line_query_and_errors(world) -> None:
    d, _ = world
    script = "\n".join([
        "% a comment line",
        "get_nr_cores(N).",
        "member(X,",
        "       [a, b]).",
        "foo(a b).",
        ":plan",
        "shell(ls).",
        ":nosuchcommand",
        "X is 2 + 3.",
    ])
    r = run_shell("--socket", str(d.path), stdin=script)
    assert r.returncode == 2  # errors happened; the script still ran to the end
    assert r.stdout.splitlines()[:3] == ["N = 48.", "X = a ;", "X = b."]
    assert "plan by cpsat" in r.stdout or "plan by greedy" in r.stdout
    assert r.stdout.rstrip().endswith("X = 5.")
    err = r.stderr
    assert "Error: Syntax error at line 1, column 7: operator expected." in err
    assert "    foo(a b).\n          ^" in err
    assert "Error: Unsafe goal: calling shell/2 is not allowed in the sandbox" in err
    assert "Error: There is no command :nosuchcommand (try :help)." in err


@pytest.mark.parametrize("args, stdin, status, out, err", [
    (["-c", "true."], "", 0, "true.\n", ""),
    (["-c", "fail."], "", 1, "false.\n", ""),
    ([], "member(x, [y]).\n", 1, "false.\n", ""),
    (["-c", "X = f(Y, 'a b', [1, 2.5])."], "", 0, "X = f(_, 'a b', [1, 2.5]).\n", ""),
    (["-c", "nope(1)."], "", 2, "", "Error: Unknown procedure nope/1."),
    (["-c", "tasks."], "", 2, "", "Error: Unknown procedure tasks/0 (shell commands start with ':', as in :tasks)."),
    (["-c", ":explain nobody"], "", 2, "", "Error: No task named 'nobody' (registered tasks: olap1, scan)."),
    (["-c", ":set answers many"], "", 2, "", "Error: Answers must be one or all."),
    (["-c", "X = 'open"], "", 2, "", "Error: Syntax error"),
    (["-c", "X is foo + 1."], "", 2, "", "Error: is/2: Arithmetic: `foo/0' is not a function."),
])
def test_exit_status(world, args, stdin, status, out, err) -> None:
    d, _ = world
    r = run_shell("--socket", str(d.path), *args, stdin=stdin)
    assert r.returncode == status, (r.stdout, r.stderr)
    assert r.stdout == out or (out and out in r.stdout) or (not out and r.stdout == "")
    assert err in r.stderr


def test_json_errors_and_failures(world) -> None:
    d, _ = world
    r = run_shell("--socket", str(d.path), "--format", "json", "-c", "foo(a b).", "-c", "fail.", "-c", ":tasks")
    assert r.returncode == 2
    syntax, failed, tasks = json_lines(r.stdout)
    assert syntax["error"]["kind"] == "syntax_error" and syntax["error"]["data"] == {"line": 1, "column": 7}
    assert failed == {"input": "fail.", "solutions": [], "truncated": False}
    assert {t["task"] for t in tasks["result"]["tasks"]} == {"scan", "olap1"}


def test_no_daemon(tmp_path: Path) -> None:
    r = run_shell("--socket", str(tmp_path / "none.sock"), "-c", "true.")
    assert r.returncode == ExitStatus.UNREACHABLE == 3  # as in every subcommand (issue 53 item 4)
    assert f"No COD daemon answers on {tmp_path / 'none.sock'}: No such file or directory; start one with `cod rm`" in r.stderr
    r = run_shell("--socket", str(tmp_path / "none.sock"), "--format", "json", "-c", "true.")
    assert r.returncode == 3 and json_lines(r.stdout)[0]["error"]["kind"] == "unreachable"


def test_embedded_skb_script() -> None:
    r = run_shell("--machine", "magnycours", stdin="\n".join([
        ":assert db_rtime(3000). db_tsize(315)",
        "db_rtime(R).",
        ":assert --system task(t1, 1, a). allocated(t1, 0). allocated(t1, 1)",
        ":allocation",
        ":facts db_tsize",
        ":watch",
    ]))
    assert r.returncode == 2, r.stderr  # :watch needs a daemon
    assert "Added 2 app facts." in r.stdout and "R = 3000." in r.stdout
    matrix = [line for line in r.stdout.splitlines() if line.startswith("t1 ")]
    assert matrix and matrix[0].split("|")[1].split() == ["X", "X", ".", ".", ".", "."]
    assert "db_tsize(315)." in r.stdout
    assert ":watch needs a daemon" in r.stderr


def test_piped_text_has_no_trailing_blanks() -> None:
    """Rich pads a table's last column to its widest cell; into a file, lines end at their text."""
    r = run_shell("--machine", "magnycours", "-c", ":help", "-c", ":machine", "-c", ":facts")
    assert r.returncode == 0, r.stderr
    padded = [line for line in r.stdout.splitlines() if line != line.rstrip()]
    assert not padded and ":allocation" in r.stdout


def test_embedded_hwloc_machine() -> None:
    hwloc = TESTS / "data" / "topologies" / "hwloc" / "16em64t-4s2c2t.xml"
    r = run_shell("--hwloc", str(hwloc), "--format", "json", "-c", "get_nr_cores(N).", "-c", ":machine")
    assert r.returncode == 0, r.stderr
    nr, machine = json_lines(r.stdout)
    assert nr["solutions"] == [{"N": 16}]
    assert len(machine["result"]["pus"]) == 16


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_refusals_of_the_daemon_read_as_sentences(tmp_path: Path) -> None:
    """An unprivileged user may not change system facts or another user's task: the daemon says no."""
    sock_dir = Path(tempfile.mkdtemp(prefix="cod-shell-"))
    try:
        os.chmod(sock_dir, 0o755)
        d = start_daemon(sock_dir, "--machine", "magnycours")
        proc = subprocess.Popen(["sleep", "600"])
        owner = Client(str(d.path), app="db")
        owner.register_task("scan", pid=proc.pid, min_cores=2)
        try:
            script = ":assert --system site(lab1)\n:update scan max_cores=3\nget_nr_cores(N).\n"
            out = _run_as_nobody(["shell", "--socket", str(d.path)], script)
            assert "Error: The daemon refused: only root or the daemon's user may change system-level facts." in out
            assert "Error: The daemon refused: task 'scan' belongs to uid 0." in out
            assert "N = 48." in out
            assert out.endswith("status 2\n")
        finally:
            owner.close()
            proc.kill()
            proc.wait()
            d.stop()
    finally:
        for p in sorted(sock_dir.iterdir(), reverse=True):
            p.unlink()
        sock_dir.rmdir()


AS_NOBODY = """
import io, os, pwd, sys
from cod.cli import main as cli

argv, script = sys.argv[1:], sys.stdin.read()


def run(app):
    out = io.StringIO()
    saved = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = out
    try:
        status = cli.main(argv + ["--app", app, "-c", script])
    finally:
        sys.stdout, sys.stderr = saved
    return status, out.getvalue()


run("warmup")  # as root first: every module the script needs is imported while the interpreter's files are readable
nobody = pwd.getpwnam("nobody")
os.setgroups([])
os.setgid(nobody.pw_gid)
os.setuid(nobody.pw_uid)
status, text = run("lab")  # a namespace of its own: root's may not be dropped yet
sys.stdout.write(text + f"status {status}\\n")
"""


def _run_as_nobody(argv: list[str], script: str) -> str:
    """Run `cod ARGV -c SCRIPT` in a fresh interpreter that turns into user nobody before it runs it again."""
    r = subprocess.run([sys.executable, "-c", AS_NOBODY, *argv], input=script, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_tasks_show_the_live_state_of_an_enforcing_daemon(tmp_path: Path) -> None:
    """CPU use and NUMA pages come from the daemon's live state in the SKB (only an enforcing daemon keeps it)."""
    d = start_daemon(tmp_path, "--enforce", "affinity", "--no-busy-detect", "--state-dir", str(tmp_path / "state"),
                     "--refresh-interval", "0.2")
    proc = subprocess.Popen(["sleep", "600"])
    client = Client(str(d.path), app="db")
    try:
        client.register_task("scan", pid=proc.pid, min_cores=1, max_cores=1)
        deadline = time.monotonic() + 15
        while True:
            r = run_shell("--socket", str(d.path), "--format", "json", "-c", ":tasks")
            assert r.returncode == 0, r.stderr
            (tasks,) = json_lines(r.stdout)
            scan = tasks["result"]["tasks"][0]
            if scan["numa_pages"] or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        assert scan["task"] == "scan" and scan["pid"] == proc.pid
        assert scan["cpu_use"] is not None and scan["cpu_use"] < 50  # a sleeping process
        assert sum(scan["numa_pages"].values()) > 0
        r = run_shell("--socket", str(d.path), "-c", ":tasks")
        assert re.search(rf"scan\s+\|\s+{proc.pid}\s+\|\s+db\s+\|.*\|\s+\d+(\.\d+)?%\s+\|\s+0:\d+", r.stdout), r.stdout
    finally:
        client.close()
        proc.kill()
        proc.wait()
        d.stop()


@pytest.mark.parametrize("mode, warns", [("affinity", False), ("sched_ext,affinity", True)])
def test_status_names_the_enforcement_and_warns_when_it_is_not_the_one_asked_for(tmp_path: Path, mode, warns) -> None:
    """`:status` (issue 48): a daemon asked for sched_ext,affinity on a kernel without sched_ext
    serves on affinity, and says so as a warning; plain affinity is what was asked for."""
    if warns and os.path.exists("/sys/kernel/sched_ext"):
        pytest.skip("this kernel has sched_ext: scx_cod may run here")
    d = start_daemon(tmp_path, "--enforce", mode, "--no-busy-detect", "--state-dir", str(tmp_path / "state"))
    try:
        text = run_shell("--socket", str(d.path), "-c", ":status")
        assert text.returncode == 0, text.stderr
        assert f"on {d.path}" in text.stdout and "Enforcement " in text.stdout
        assert ("Warning: sched_ext is not in force" in text.stdout) == warns, text.stdout
        r = run_shell("--socket", str(d.path), "--format", "json", "-c", ":status")
        (status,) = json_lines(r.stdout)
        enforcement = status["result"]["enforcement"]
        assert enforcement["mode"] == mode.partition(",")[0] and ("warning" in enforcement) == warns, enforcement
    finally:
        d.stop()
    embedded = run_shell("--machine", "magnycours", "-c", ":status")
    assert embedded.returncode == 0 and "No daemon: this shell runs its own SKB" in embedded.stdout, embedded

"""`cod shell` at a real terminal: a pseudo-terminal (pexpect) whose screen pyte keeps.

A real daemon (`cod rm --machine magnycours`) with two tasks registered through
cod.client for real sleeping processes; the shell is typed at as a person would,
and the screen is checked after each step.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from cod.client import Client
from helpers.paths import TESTS
from helpers.term import Terminal
from helpers.waiting import wait_until
from helpers.rm_support import COD, Daemon, start_daemon

pytestmark = pytest.mark.slow


def shell_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "PROMPT_TOOLKIT_NO_CPR": "1",  # pyte does not answer cursor-position requests
        "TERM": "xterm-256color",
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "COLUMNS": "", "LINES": "",
    })
    env.pop("NO_COLOR", None)
    return {k: v for k, v in env.items() if v != ""}


@pytest.fixture
def sleepers():
    procs: list[subprocess.Popen] = []

    def start() -> int:
        p = subprocess.Popen(["sleep", "600"])
        procs.append(p)
        return p.pid

    yield start
    for p in procs:
        p.kill()
        p.wait()


@pytest.fixture
def daemon_with_tasks(tmp_path: Path, sleepers):
    d = start_daemon(tmp_path, "--machine", "magnycours")
    clients = [Client(str(d.path), app="db"), Client(str(d.path), app="olap")]
    clients[0].register_task("scan", pid=sleepers(), min_cores=4, max_cores=8, sensitive=["numa"])
    clients[1].register_task("olap1", pid=sleepers(), min_cores=2, working_set_bytes=8 << 30)
    # olap1's plan takes CPUs scan gives back: they are its at the next epoch (the revocation
    # protocol), so the tests read the allocation once none is in transit (the shell once showed
    # olap1 with two CPUs more than its get_allocation a moment before).
    def settled() -> bool:
        def now() -> list[dict]:
            return [c.get_allocation(t) for c, t in zip(clients, ("scan", "olap1"))]
        before = now()
        time.sleep(0.2)
        return not any(a["releasing"] for a in before) and now() == before

    wait_until(settled, 20, "no CPU in transit")
    yield d, clients
    for c in clients:
        c.close()
    d.stop()


def start_shell(tmp_path: Path, *args: str, rows: int = 60, cols: int = 140) -> Terminal:
    term = Terminal(COD + ["shell", *args], shell_env(tmp_path), rows=rows, cols=cols)
    term.wait_prompt()
    return term


def test_session_against_a_daemon(tmp_path: Path, daemon_with_tasks, sleepers) -> None:
    d, clients = daemon_with_tasks
    term = start_shell(tmp_path, "--socket", str(d.path))
    try:
        assert "connected to the COD daemon on" in term.text() and "machine magnycours" in term.text()
        _answers_one_at_a_time(term)
        _allocation_matrix_in_colour(term, clients)
        _explain_and_errors(term)
        _ctrl_c_cancels_an_endless_query(term)
        _watch_sees_a_task_arrive(term, d, clients, sleepers)
        term.send(":quit\r")
        assert term.wait_exit() == 0
    finally:
        term.close()


def _answers_one_at_a_time(term) -> None:
    """A query, stepped through one answer at a time: ';' for the next, Enter stops."""
    term.send("task(T, Pid, App).\r")
    term.wait(r"(?m)^App = db$")  # the first answer, waiting for a key
    assert re.search(r"(?m)^T = scan,$", term.text())
    term.send(";")
    term.wait(r"(?m)^App = db ;$")
    term.wait(r"(?m)^App = olap\.$")  # the last answer ends with a full stop by itself
    term.wait_prompt()
    term.send("member(Z, [p1, p2, p3]).\r")
    term.wait(r"(?m)^Z = p1$")
    term.send("\r")
    term.wait(r"(?m)^Z = p1 \.$")  # stopped: SWI-Prolog writes ' .'
    term.wait_prompt()
    assert "Z = p2" not in term.text()
    term.send("member(q, [a]).\r")
    term.wait(r"(?m)^false\.$")
    term.wait_prompt()


def _allocation_matrix_in_colour(term, clients) -> None:
    """The allocation: the Figure 4 matrix, as the daemon has it, in colour."""
    alloc = {t: clients[i].get_allocation(t)["cores"] for i, t in enumerate(("scan", "olap1"))}
    term.send(":allocation\r")
    term.wait(r"X held by the row's task")
    term.wait_prompt()
    lines = term.lines()
    assert any(re.match(r"NUMA\s+\| node 0\s+\| node 1", line) for line in lines)
    assert any(re.match(r"L3\s+\| L3 0-5\s+\| L3 6-11", line) for line in lines)
    for task, cores in alloc.items():
        rows = [i for i, line in enumerate(lines) if line.startswith(task + " ") and "|" in line]
        cpu_rows = [i for i, line in enumerate(lines) if line.startswith("CPU ")]
        assert len(rows) == len(cpu_rows) >= 1  # one row per folded block
        held = []
        for r, c in zip(rows, cpu_rows):
            for m in re.finditer(r"X", lines[r]):
                held.append(int(re.match(r"\s*(\d+)", lines[c][m.start() - 1:m.end()]).group(1)))
                x = m.start()
                fg, bold = term.style_at(r, x)
                assert fg != "default" and bold, (task, fg)  # coloured on a terminal
        assert sorted(held) == sorted(cores), task


def _explain_and_errors(term) -> None:
    """Why a task has its CPUs; a syntax error with a caret under its column; an unsafe goal named."""
    term.send(":explain olap1\r")
    term.wait(r"What bounds it:")
    term.wait_prompt()
    screen = term.text()
    assert "task olap1 (application olap" in screen
    assert re.search(r"NUMA nodes? [\d, and]+ ha(s|ve) no room for another 8 GiB working set", screen)
    assert "Task scan holds CPUs" in screen

    term.send("foo(a b).\r")
    term.wait(r"Error: Syntax error at line 1, column 7: operator expected\.")
    term.wait_prompt()
    lines = term.lines()
    i = max(i for i, line in enumerate(lines) if line.strip() == "foo(a b).")
    assert lines[i + 1].index("^") == lines[i].index("b")

    term.send("shell(ls).\r")
    term.wait(r"Error: Unsafe goal: calling shell/2 is not allowed")
    term.wait_prompt()


def _ctrl_c_cancels_an_endless_query(term) -> None:
    """Ctrl-C on an endless query: the daemon cancels it, and the shell stays."""
    term.send("repeat, sleep(1), fail.\r")
    time.sleep(1.0)
    started = time.monotonic()
    term.interrupt()
    term.wait(r"Query cancelled\.")
    term.wait_prompt()
    term.send("get_nr_cores(Ncpus).\r")
    term.wait(r"Ncpus = 48\.")
    term.wait_prompt()
    # The query's time limit is 5 s: it was stopped, not waited out.
    assert time.monotonic() - started < 3.0


def _watch_sees_a_task_arrive(term, d, clients, sleepers) -> None:
    term.send(":watch\r")
    term.wait(r"Watching events; Ctrl-C stops\.")
    late = Client(str(d.path), app="late")
    clients.append(late)
    late.register_task("late", pid=sleepers(), min_cores=1, max_cores=2)
    term.wait(r"\d\d:\d\d:\d\d\.\d{3} task_arrived\s+late \(application late, pid \d+\)")
    term.wait(r"\d\d:\d\d:\d\d\.\d{3} allocation_changed late epoch \d+: CPUs [\d,-]+")
    term.interrupt()
    term.wait_prompt()


def test_lost_daemon_is_said_and_reconnected(tmp_path: Path) -> None:
    d = start_daemon(tmp_path, "--machine", "magnycours")
    term = start_shell(tmp_path, "--socket", str(d.path))
    try:
        d.stop()
        term.send("get_nr_cores(N1).\r")
        term.wait(r"Error: Lost the connection to the daemon on [^;]*rm\.sock; the shell reconnects\s+when\s+it\s+is\s+back\.")
        term.wait_prompt()
        term.send("get_nr_cores(N2).\r")
        term.wait(r"Error: No COD daemon answers on")
        term.wait_prompt()
        d = Daemon(d.path, d.args, d.log).start()
        term.send("get_nr_cores(N3).\r")
        term.wait(r"Reconnected to the daemon on [^(]*rm\.sock")
        term.wait(r"N3 = 48\.")
        term.wait_prompt()
        term.send("\x04")  # Ctrl-D leaves
        assert term.wait_exit() == 0
    finally:
        term.close()
        d.stop()


def test_embedded_skb_editing_history_completion_and_cancel(tmp_path: Path) -> None:
    term = start_shell(tmp_path, "--machine", "magnycours")
    try:
        assert "an SKB of its own for machine magnycours" in term.text()
        # Multi-line input: Enter before the full stop continues the query.
        term.send("X = 1,\r")
        term.wait(r"(?m)^\|\s+$")
        term.send("Y = two.\r")
        term.wait(r"(?m)^Y = two\.$")
        term.wait_prompt()
        # Completion of a predicate name the SKB holds.
        term.send("get_list_fr\t")
        term.wait(r"get_list_free_cpus")
        term.send("(Free).\r")
        term.wait(r"Free = \[0, 1, 2")
        term.wait_prompt()
        # Completion of a command name.
        term.send(":alloc\t")
        term.wait(r"\?- :allocation")
        term.send("\x15")  # Ctrl-U: clear the line
        # Ctrl-C ends a runaway query in the embedded engine at once.
        term.send("repeat, sleep(1), fail.\r")
        time.sleep(1.0)
        term.interrupt()
        term.wait(r"Query cancelled\.")
        term.wait_prompt()
        term.send("get_nr_cores(After).\r")
        term.wait(r"After = 48\.")
        term.wait_prompt()
        term.send("\x04")
        assert term.wait_exit() == 0
    finally:
        term.close()
    history = tmp_path / "state" / "cod" / "shell_history"
    assert "get_nr_cores(After)." in history.read_text()
    # The next session recalls it with the Up arrow.
    term = start_shell(tmp_path, "--machine", "magnycours")
    try:
        term.send("\x1b[A")
        term.wait(r"\?- get_nr_cores\(After\)\.")
        term.send("\r")
        term.wait(r"After = 48\.")
        term.wait_prompt()
        term.send(":quit\r")
        assert term.wait_exit() == 0
    finally:
        term.close()


@pytest.mark.skipif(shutil.which("less") is None, reason="no pager installed")
def test_output_taller_than_the_terminal_is_paged(tmp_path: Path) -> None:
    term = start_shell(tmp_path, "--machine", "magnycours", rows=20, cols=80)
    try:
        term.send(":facts pu\r")
        term.wait(r"pu\(18, 18, 1, 3\)\.\n:")  # less shows one screen and waits
        assert "pu(47" not in term.text()
        term.send("q")
        term.wait_prompt()
        term.send(":set pager off\r")
        term.wait_prompt()
        term.send(":facts pu\r")
        term.wait(r"pu\(47, 47, 3, 7\)\.")
        term.wait_prompt()
        term.send(":quit\r")
        assert term.wait_exit() == 0
    finally:
        term.close()


# ---- issue 32: what a new user trips on --------------------------------------------------------
TWO_CPUS = TESTS / "data" / "topologies" / "hwloc" / "2i386-2c-nohugepage.xml"
PG = "elastic.postgres.3245"
ELASTIC_FACTS = (
    f":assert --system elastic_group('{PG}', cgroup('/sys/fs/cgroup/system.slice/postgresql@15-main.service'), "
    f"adaptive, cpu_load). elastic_thresholds('{PG}', 30, 70). elastic_cores('{PG}', [0, 1]). "
    f"elastic_load('{PG}', 70.95123). elastic_marking('{PG}', checks, 71). elastic_marking('{PG}', provision, 2). "
    f"elastic_state('{PG}', overload). elastic_transition('{PG}', t0, 1000.0). "
    f"elastic_transition('{PG}', t3, 1000.5). elastic_transition('{PG}', t5, 1001.0). "
    f"elastic_transition('{PG}', t7, 1001.5)")


def test_layout_at_80_columns_and_a_psql_habit(tmp_path: Path) -> None:
    """At 80 columns: the allocation's header of a 2-CPU machine is whole (was `NUMA | nod |`),
    :elastic keeps a group's name whole and its load rounded (was `elastic.postgres.32…`, `70.951%`);
    `\\tasks` says to use :tasks instead of opening a continuation prompt."""
    term = start_shell(tmp_path, "--hwloc", str(TWO_CPUS), rows=50, cols=80)
    try:
        term.send(":assert --system task(t1, 1, a). allocated(t1, 0)\r")
        term.wait(r"Added 2 system facts\.")
        term.wait_prompt()
        term.send(":allocation\r")
        term.wait(r"(?m)^free\s+\|")
        term.wait_prompt()
        lines = term.lines()
        assert any(re.fullmatch(r"NUMA \| node 0 \|", line) for line in lines), term.text()
        assert any(re.fullmatch(r"CPU  \| 0 1    \|", line) for line in lines), term.text()
        term.send(ELASTIC_FACTS + "\r")
        term.wait(r"Added 11 system facts\.")
        term.wait_prompt()
        term.send("\x0c")  # Ctrl-L: a clean screen for the table
        term.wait_prompt()
        term.send(":elastic\r")
        term.wait(PG)
        term.wait_prompt()
        row = next(line for line in term.lines() if PG in line)
        assert re.search(r"\b71%", row) and "70.95" not in term.text(), term.text()
        assert re.search(r"\bt0 t3 t5\s*$", row) and "…" not in term.text(), term.text()
        term.send("\\tasks\r")
        term.wait(r"Error: Shell commands start with ':', not '\\' as in psql: use :tasks\.")
        term.wait_prompt()  # a new prompt, not the continuation prompt `|`
        term.send(":quit\r")
        assert term.wait_exit() == 0
    finally:
        term.close()


def test_tables_into_a_pipe_keep_their_lines_whole(tmp_path: Path) -> None:
    """docs/shell.md: into a pipe lines are left whole: a table keeps its natural width, whatever
    $COLUMNS says (it was squeezed into wrapped columns)."""
    env = {**shell_env(tmp_path), "COLUMNS": "80"}
    r = subprocess.run(COD + ["shell", "--machine", "magnycours", "-c", ELASTIC_FACTS, "-c", ":elastic"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    [row, source] = [line for line in r.stdout.splitlines() if PG in line]
    assert "adaptive cpu_load" in row and "overload" in row and "71%" in row and "t0 t3 t5 t7" in row
    assert source == f"  {PG}: cgroup /sys/fs/cgroup/system.slice/postgresql@15-main.service"
    assert len(source) > 80 and "\x1b[" not in r.stdout  # whole, and plain text
    header = next(line for line in r.stdout.splitlines() if line.startswith("group"))
    assert "mode, metric" in header and "marking C I S O P" in header and "last fired" in header

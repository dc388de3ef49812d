"""Every command the README and docs/*.md show in a ```sh block runs as shown (issue 53, item 3),
or is in `SKIPPED` below with why it cannot run in a test (root-only hardware, a daemon on the
default socket, a placeholder, a guest, minutes of benchmark).

A block's line that starts with a program (`PROGRAMS`) is a command (a trailing `\\` joins the
next line); the lines after it up to the next command are the output it must print, the solve
times aside. A block with a command ending in `&` is one shell session: it runs whole, and what
it started is stopped after it; a daemon (`cod rm --socket ...`) runs until it answers on its
socket. Paths the docs give under /tmp and /opt become a temporary
directory's, and `cod` is the checkout's."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers.paths import REPO
from helpers.waiting import load_scaled

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
PROGRAMS = ("cod", ".venv/bin/cod", "make", "python", "sudo", "cc", "flock", "clients/cscs/cscs", "until", "kill")
# What cannot run in a test, by a pattern of the command (re.search), and why.
SKIPPED: dict[str, str] = {
    r"^make demo": "the whole demo (~1 min, installs what is missing); its words are "
                   "tests/clients/python/test_demo_words.py's",
    r"^make (test|vm-test|vm-shell|vm-suites)": "builds kernels and boots qemu guests (make test runs it)",
    r"^flock ": "the paper's experiments and the guest's figures: minutes each, under the shared bench lock",
    r"^sudo ": "installs into /etc/systemd as root",
    r"\[": "a synopsis: the bracketed options and the upper-case words are placeholders",
    r"^cod profile --pid 4242": "a synopsis: pid 4242 is the reader's engine",
    r"^cod rm --config /etc/cod/": "reads /etc/cod/rm.toml, which the systemd install puts there",
    r"^cod rm( |$)(?!.*--socket)": "the default socket (/run/cod/rm.sock as root), shared with any daemon "
                                  "running, and --enforce pins this machine's processes",
    r"topo\.xml": "topo.xml is the reader's hwloc export",
    r"^cod shell( +#|$)|^cod shell -c": "the daemon on the default socket",
    r"^cod shell --socket /tmp/rm\.sock +#": "interactive, with a daemon at /tmp/rm.sock: "
                                            "tests/clients/cli/shell/ drive the shell",
    r"script\.txt": "script.txt is the reader's",
    r"^cc app\.c": "app.c is the reader's program: tests/clients/c/test_cclient_doc.py builds each of "
                   "docs/cclient.md's programs this way",
    r"^clients/cscs/cscs run .*--seconds": "runs the storage engine for 30-60 s; "
                                            "tests/clients/cscs/ run it for shorter",
    r"^clients/cscs/cscs calibrate": "measures this machine for minutes",
    r"^make -C clients/cscs check": "the C tests under ASan, UBSan and valgrind: tests/clients/cscs/test_cscs_engine.py's",
}
# The docs' paths under /tmp and /opt, which a test may not take: they become the test's own.
OWN_PATHS = ("/tmp/rm.sock", "/opt/cod")


@dataclass
class Command:
    doc: str
    line: int
    text: str
    shown: list[str]

    def __str__(self) -> str:
        return f"{self.doc}:{self.line}: {self.text}"


def _is_command(line: str) -> bool:
    return line.split(" ", 1)[0] in PROGRAMS


def blocks() -> list[list[Command]]:
    """The commands of each ```sh block of the README and docs/*.md, with the output each shows."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for m in re.finditer(r"^```sh\n(.*?)^```", text, re.S | re.M):
            first = text[:m.start()].count("\n") + 2
            lines = m.group(1).rstrip("\n").split("\n")
            commands: list[Command] = []
            i = 0
            while i < len(lines):
                start, line = i, lines[i]
                while line.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    line = line[:-1].rstrip() + " " + lines[i].strip()
                if _is_command(line):
                    commands.append(Command(doc.relative_to(REPO).as_posix(), first + start, line, []))
                elif commands and not line.startswith("#"):
                    commands[-1].shown.append(line)
                i += 1
            if commands:
                found.append(commands)
    return found


def why_skipped(command: Command) -> str | None:
    for pattern, why in SKIPPED.items():
        if re.search(pattern, command.text):
            return why
    return None


def without_time(text: str) -> str:
    return re.sub(r"in \d+(\.\d+)? ms", "in T ms", text)


def _script(block: list[Command], own: Path) -> str:
    text = "\n".join(c.text for c in block)
    daemon = re.match(r"cod rm .*--socket (\S+)", text)
    if len(block) == 1 and daemon:  # a daemon runs until stopped: here, until it answers on its socket
        text = (f"{text.split('#', 1)[0]} &\nuntil cod shell --socket {daemon[1]} -c true >/dev/null 2>&1; do\n"
                "  kill -0 $! || { wait $!; exit 1; }\n  sleep 0.2\ndone")
    for path in OWN_PATHS:
        text = text.replace(path, str(own / path.strip("/").replace("/", "_")))
    return "set -e\n" + text + "\n"


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """What the block started in the background (a daemon) goes with it: asked to stop (a daemon
    stops its engine), killed if it has not within 10 s."""
    def signal_group(sig: int) -> bool:
        try:
            os.killpg(proc.pid, sig)
            return True
        except ProcessLookupError:
            return False

    signal_group(signal.SIGTERM)
    deadline = time.monotonic() + load_scaled(10)
    while signal_group(0) and time.monotonic() < deadline:
        proc.poll()  # reaps bash, so that the group is what it left running
        time.sleep(0.05)
    signal_group(signal.SIGKILL)
    proc.wait()


def _run(block: list[Command], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
           "COLUMNS": "100", "XDG_RUNTIME_DIR": str(tmp_path)}
    env.pop("COD_SOCKET", None)
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    # Into files, not pipes: a daemon the block leaves in the background would hold a pipe open.
    with out.open("w") as o, err.open("w") as e:
        proc = subprocess.Popen(["bash", "-c", _script(block, tmp_path)], cwd=REPO, env=env,
                                stdin=subprocess.DEVNULL, stdout=o, stderr=e, start_new_session=True)
    try:
        proc.wait(timeout=load_scaled(300))
    finally:
        _stop_group(proc)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.read_text(), err.read_text())


def _runs() -> list[list[Command]]:
    """What runs: a session block whole, else each command that is not skipped on its own."""
    runs = []
    for block in blocks():
        if any(c.text.rstrip().endswith("&") for c in block):
            runs.append(block)
        else:
            runs += [[c] for c in block if why_skipped(c) is None]
    return runs


@pytest.mark.parametrize("block", _runs(), ids=lambda b: f"{b[0].doc}:{b[0].line}")
def test_the_command_runs_as_shown(block: list[Command], tmp_path: Path) -> None:
    skipped = [f"{c} ({why_skipped(c)})" for c in block if why_skipped(c) is not None]
    assert skipped == [], "a session block runs whole, so none of its commands may be skipped"
    r = _run(block, tmp_path)
    assert r.returncode == 0 and "Traceback" not in r.stderr, f"{block[0]}\n{r.stdout}\n{r.stderr}"
    [*_, last] = block
    if len(block) == 1 and last.shown:
        assert without_time(r.stdout).rstrip("\n").split("\n") == [without_time(s) for s in last.shown]


def test_every_skip_has_a_command() -> None:
    """No stale entry: each pattern of SKIPPED matches a command the docs show."""
    commands = [c for block in blocks() for c in block]
    unused = [p for p in SKIPPED if not any(re.search(p, c.text) for c in commands)]
    assert unused == []


def test_command_blocks_are_marked_sh() -> None:
    """A block of commands without the sh mark would escape this test."""
    unmarked = []
    for doc in DOCS:
        text = doc.read_text()
        for m in re.finditer(r"^```\n(.*?)^```", text, re.S | re.M):
            first = m.group(1).split("\n", 1)[0]
            if _is_command(first):
                unmarked.append(f"{doc.relative_to(REPO)}:{text[:m.start()].count(chr(10)) + 1}: {first}")
    assert unmarked == []


def test_every_example_is_used_by_a_doc() -> None:
    """docs/examples/ holds what the docs run: a file there that no command shown uses is lost."""
    shown = " ".join(c.text for block in blocks() for c in block)
    examples = [p.relative_to(REPO).as_posix() for p in (REPO / "docs" / "examples").rglob("*") if p.is_file()]
    assert [e for e in examples if e not in shown] == []

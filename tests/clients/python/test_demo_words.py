"""`make demo`'s first part (clients/python/examples/demo.py) as a new user reads it (issue 32):
Listing 3's status in words, and a runaway query reported as stopped by the same limit as the shell
says (the demo used to set a 0.5 s time limit of its own and say "time limit" where the shell,
with the defaults, said "inference limit")."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from helpers.paths import REPO

COD = [sys.executable, "-m", "cod.cli.main"]


def test_demo_says_the_status_in_words_and_the_same_limit_as_the_shell() -> None:
    demo = subprocess.run([sys.executable, str(REPO / "clients" / "python" / "examples" / "demo.py")],
                          capture_output=True, text=True, timeout=300)
    assert demo.returncode == 0, demo.stderr
    # Counts agree with their number, and memory is in the units the other lines use (issue 53).
    assert not re.search(r"\b1 (cores|CPUs|PUs|NUMA nodes)\b|\(s\)", demo.stdout), demo.stdout
    memory = demo.stdout.split("get_free_memory(Free)", 1)[1].splitlines()[1]
    assert re.search(r"[KMGT]iB", memory) and not re.search(r"\d{7,}", memory), memory
    sla = [line for line in demo.stdout.splitlines() if line.strip().startswith("SLA ") and "status" in line]
    assert len(sla) == 3, demo.stdout
    words = {"0": "the deployment fits", "1": "not enough free CPUs here", "2": "the data does not fit"}
    for line in sla:
        status = re.search(r"status (\d), (.*)$", line)
        assert status and status.group(2).startswith(words[status.group(1)]), line
    runaway = demo.stdout.split("?- repeat, fail", 1)[1].splitlines()[1]
    shell = subprocess.run([*COD, "shell", "--machine", "magnycours", "-c", "repeat, fail."], capture_output=True,
                           text=True, timeout=120)
    assert shell.returncode == 2
    limit = re.search(r"(time|inference) limit", shell.stderr)
    assert limit and limit.group(0) in runaway, (shell.stderr, runaway)

"""Real test processes: the C spinner (compiled at test time) or a Python fallback."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

PY_SPINNER = r"""
import sys, threading, os, time
n, mode = int(sys.argv[1]), sys.argv[2]
def work(ready):
    ready.append(threading.get_native_id())
    while True:
        if mode != "spin":
            time.sleep(3600)
def start():
    box = []
    threading.Thread(target=work, args=(box,), daemon=True).start()
    while not box: time.sleep(0.001)
    return box[0]
if mode == "spin" and n == 1:
    n = 2  # the main thread reads stdin: one more thread does the spinning
tids = [os.getpid()] + [start() for _ in range(n - 1)]
print("ready", *tids, flush=True)
for line in sys.stdin:
    print("tid", start(), flush=True)
"""


@dataclass
class Spinner:
    proc: subprocess.Popen
    tids: list[int]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def spawn_thread(self) -> int:
        self.proc.stdin.write("spawn\n")
        self.proc.stdin.flush()
        word, tid = self.proc.stdout.readline().split()
        assert word == "tid"
        return int(tid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def spinner_command(tmp_dir: str) -> list[str]:
    """The C spinner when a compiler exists (threads that spin without a GIL), else Python."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc:
        exe = os.path.join(tmp_dir, "spinner")
        if not os.path.exists(exe):
            subprocess.run([cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-pthread", "-o", exe, os.path.join(HERE, "spinner.c")], check=True)
        return [exe]
    return [sys.executable, "-c", PY_SPINNER]


def start_spinner(cmd: list[str], threads: int, mode: str, cpus: Sequence[int] | None = None) -> Spinner:
    """``cpus``: the affinity it starts with (before its first instruction: nothing watching
    the machine sees it anywhere else)."""
    pin = None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))
    proc = subprocess.Popen([*cmd, str(threads), mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            preexec_fn=pin)
    line = proc.stdout.readline().split()
    assert line and line[0] == "ready", f"spinner did not start: {line!r}"
    return Spinner(proc, [int(t) for t in line[1:]])


@pytest.fixture(scope="session")
def spinner_cmd(tmp_path_factory) -> list[str]:
    return spinner_command(str(tmp_path_factory.mktemp("spinner")))


@pytest.fixture
def spawn(spinner_cmd):
    """spawn(threads, mode) -> Spinner; every spinner is killed at the end of the test."""
    started: list[Spinner] = []

    def _spawn(threads: int = 1, mode: str = "sleep", cpus: Sequence[int] | None = None) -> Spinner:
        s = start_spinner(spinner_cmd, threads, mode, cpus)
        started.append(s)
        return s

    yield _spawn
    for s in started:
        s.stop()


def needs_root():
    return pytest.mark.skipif(os.geteuid() != 0, reason="needs root (cgroups, proc connector, pinning others)")


def allowed_list(pid: int, tid: int | None = None) -> str:
    path = f"/proc/{pid}/status" if tid is None else f"/proc/{pid}/task/{tid}/status"
    with open(path) as f:
        for line in f:
            if line.startswith("Cpus_allowed_list:"):
                return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Cpus_allowed_list in {path}")

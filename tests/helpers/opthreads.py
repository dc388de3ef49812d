"""Start tests/helpers/opthreads.c: named operator threads with known duty cycles."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "opthreads.c")
CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-pthread"]


def build(out_dir: str, extra: list[str] | None = None, name: str = "opthreads") -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler")
    exe = os.path.join(out_dir, name)
    subprocess.run([cc, *CFLAGS, *(extra or []), "-o", exe, SOURCE], check=True)
    return exe


@dataclass
class OpThreads:
    proc: subprocess.Popen
    units_per_ms: float
    tids: dict[str, int]  # thread name -> TID

    @property
    def pid(self) -> int:
        return self.proc.pid

    def go(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def results(self, timeout_s: float = 120) -> dict[str, dict]:
        out, _ = self.proc.communicate(timeout=timeout_s)
        rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        return {r["name"]: r for r in rows}

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def start(exe: str, duties: dict[str, float], *, period_ms: float = 10, seconds: float = 5,
          units_per_ms: float = 0, wrapper: list[str] | None = None) -> OpThreads:
    args = [*(wrapper or []), exe, str(period_ms), str(seconds), str(units_per_ms),
            *(f"{name}:{duty}" for name, duty in duties.items())]
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().split()
    if not line or line[0] != "ready":
        proc.kill()
        proc.wait()
        raise RuntimeError(f"opthreads did not start: {line!r}")
    rate = float(line[1])
    return OpThreads(proc, rate, dict(zip(duties, (int(t) for t in line[2:]))))

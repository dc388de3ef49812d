"""A private PostgreSQL server for tests and benchmarks: Debian's binaries, a data directory
and a Unix socket under a temporary directory, no TCP, stopped and removed afterwards.

As root the server runs as the ``postgres`` user (initdb refuses root).  It can be
started inside a given cgroup, so that the postmaster and every backend it forks
(parallel workers included) are in it from the first instant.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence

PORT = 5432  # only names the socket file inside our private directory (no TCP)


def bin_dir() -> str | None:
    """The newest /usr/lib/postgresql/N/bin that has a server."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    return os.path.dirname(found[-1]) if found else None


class Postgres:
    def __init__(self, cgroup: str | None = None, settings: dict[str, str] | None = None,
                 base: str | None = None) -> None:
        self.bin = bin_dir()
        if self.bin is None:
            raise RuntimeError("PostgreSQL is not installed (Debian package postgresql)")
        self.base = tempfile.mkdtemp(prefix="cod-pg-", dir=base)
        self.data = os.path.join(self.base, "data")
        self.sock = os.path.join(self.base, "sock")
        os.mkdir(self.sock)
        self.cgroup = cgroup
        self.settings = {"listen_addresses": "", "shared_buffers": "128MB", "fsync": "off",
                         "synchronous_commit": "off", "full_page_writes": "off",
                         "max_connections": "50", **(settings or {})}
        self.proc: subprocess.Popen | None = None
        self.user = None
        if os.geteuid() == 0:
            self.user = pwd.getpwnam("postgres")
            for d in (self.base, self.sock):
                os.chown(d, self.user.pw_uid, self.user.pw_gid)

    # ---- running its tools -------------------------------------------------------------------
    def _demote(self):
        user, cgroup = self.user, self.cgroup

        def run() -> None:
            if cgroup is not None:  # as root still: join the cgroup, then become postgres
                with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                    f.write(str(os.getpid()))
            if user is not None:
                os.setgroups([])
                os.setgid(user.pw_gid)
                os.setuid(user.pw_uid)
        return run

    def tool(self, name: str) -> str:
        return os.path.join(self.bin, name)

    def start(self, timeout: float = 60.0) -> None:
        env = {**os.environ, "LC_ALL": "C", "LANG": "C"}
        subprocess.run([self.tool("initdb"), "-D", self.data, "-U", "postgres", "--auth=trust",
                        "--no-sync", "-E", "UTF8"], check=True, capture_output=True, env=env,
                       preexec_fn=self._demote_only_user())
        args = [self.tool("postgres"), "-D", self.data, "-k", self.sock, "-p", str(PORT)]
        for key, value in self.settings.items():
            args += ["-c", f"{key}={value}"]
        with open(os.path.join(self.base, "log"), "w") as log:
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log, env=env,
                                         preexec_fn=self._demote(), start_new_session=True)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited at start: {self.log()[-2000:]}")
            if subprocess.run([self.tool("pg_isready"), "-h", self.sock, "-p", str(PORT), "-q"]).returncode == 0:
                return
            time.sleep(0.1)
        raise RuntimeError(f"postgres did not accept connections within {timeout} s: {self.log()[-2000:]}")

    def _demote_only_user(self):
        user = self.user

        def run() -> None:
            if user is not None:
                os.setgroups([])
                os.setgid(user.pw_gid)
                os.setuid(user.pw_uid)
        return run

    def log(self) -> str:
        try:
            with open(os.path.join(self.base, "log")) as f:
                return f.read()
        except FileNotFoundError:
            return ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def conn_args(self) -> list[str]:
        return ["-h", self.sock, "-p", str(PORT), "-U", "postgres"]

    def psql(self, sql: str, timeout: float = 600) -> str:
        out = subprocess.run([self.tool("psql"), *self.conn_args(), "-d", "postgres", "-v", "ON_ERROR_STOP=1",
                              "-Atq", "-c", sql], check=True, capture_output=True, text=True, timeout=timeout)
        return out.stdout

    def pgbench(self, args: Sequence[str], timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run([self.tool("pgbench"), *self.conn_args(), *args, "postgres"],
                              capture_output=True, text=True, timeout=timeout)

    def server_pids(self) -> list[int]:
        """The postmaster and every process it forked (backends, workers)."""
        if self.proc is None or self.proc.poll() is not None:
            return []
        children: dict[int, list[int]] = {}
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as f:
                    data = f.read()
            except OSError:
                continue
            ppid = int(data[data.rindex(b")") + 2:].split()[1])
            children.setdefault(ppid, []).append(int(name))
        out, todo = [], [self.pid]
        while todo:
            pid = todo.pop()
            out.append(pid)
            todo.extend(children.get(pid, []))
        return sorted(out)

    def stop(self, timeout: float = 30.0) -> None:
        """Fast shutdown, then remove everything; kills if it does not stop."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> "Postgres":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

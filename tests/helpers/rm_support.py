"""Shared fixtures of the RM and client tests: a real `cod rm` daemon as a subprocess.

No test functions here; test_rm_*.py and test_client_*.py import from it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from cod.protocol.framing import FrameDecoder, encode
from helpers.waiting import load_scaled

COD = [sys.executable, "-m", "cod.cli.main"]


class Daemon:
    def __init__(self, path: Path, args: list[str], log: Path) -> None:
        self.path = path
        self.args = args
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20.0) -> "Daemon":
        self.logf = open(self.log, "ab")
        self.proc = subprocess.Popen(COD + ["rm", "--socket", str(self.path), *self.args],
                                     stdout=self.logf, stderr=self.logf)
        budget = load_scaled(timeout)
        deadline = time.monotonic() + budget
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {self.proc.returncode}: {self.log.read_text()}")
            try:
                s = socket.socket(socket.AF_UNIX)
                s.connect(str(self.path))
                s.close()
                return self
            except OSError:
                time.sleep(0.05)
        self.proc.kill()  # not left running behind the failed test (daemons leaked so, each with its engine)
        self.proc.wait()
        self.logf.close()
        raise RuntimeError(f"daemon did not start in {budget:.0f} s: {self.log.read_text()}")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.logf.close()
        return self.proc.returncode

    def rss_kib(self) -> int:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def log_text(self) -> str:
        return self.log.read_text()


def start_daemon(tmp_path: Path, *args: str, name: str = "rm.sock") -> Daemon:
    return Daemon(tmp_path / name, list(args), tmp_path / f"{name}.log").start()


@pytest.fixture
def magny(tmp_path: Path):
    """A planning-only daemon for the 48-CPU MagnyCours reference machine."""
    d = start_daemon(tmp_path, "--machine", "magnycours", "--log-level", "debug", "--revoke-deadline", "0.5")
    yield d
    d.stop()


class RawConn:
    """A bare socket speaking frames, for tests of the wire protocol itself."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(path))
        self.sock.settimeout(10)
        self.decoder = FrameDecoder()
        self.inbox: list[dict] = []
        self.next_id = 1

    def send(self, msg: dict) -> None:
        self.sock.sendall(encode(msg))

    def recv(self) -> dict | None:
        """Next message, or None at end of stream."""
        import json

        while not self.inbox:
            data = self.sock.recv(65536)
            if not data:
                return None
            self.inbox.extend(json.loads(b) for b in self.decoder.feed(data))
        return self.inbox.pop(0)

    def call(self, method: str, params: dict | None = None) -> dict:
        rid = self.next_id
        self.next_id += 1
        self.send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params or {}})
        skipped = []
        while True:
            msg = self.recv()
            assert msg is not None, "daemon hung up"
            if msg.get("id") == rid:
                self.inbox[:0] = skipped
                return msg
            skipped.append(msg)

    def hello(self, app: str | None = None) -> dict:
        params = {"version": 1}
        if app:
            params["app"] = app
        reply = self.call("hello", params)
        assert "result" in reply, reply
        return reply["result"]

    def close(self) -> None:
        self.sock.close()


NOBODY = 65534  # the unprivileged uid (nobody) the tests become


@contextlib.contextmanager
def shared_dir(prefix: str = "cod-test-"):
    """A temporary directory every user may enter (pytest's tmp_path is private to root): a
    daemon started there can be reached by a client run ``as_user(NOBODY, ...)``."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        os.chmod(tmp, 0o755)
        yield Path(tmp)


def as_user(uid: int, fn, *args):
    """Run `fn(*args)` in a forked child with the given uid; returns its exit status (0 = passed)."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgid(uid)
            os.setuid(uid)
            fn(*args)
            code = 0
        except BaseException as err:  # report, then exit without running pytest's teardown
            print(f"as_user({uid}) failed: {type(err).__name__}: {err}", file=sys.stderr)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)

"""The real RM daemon (`cod rm`) as the guest tests start it: once per module, since it starts in
tens of seconds to minutes under TCG, with the SKB's start-up limit raised (a guest tests' helper)."""

from __future__ import annotations

import os
import signal
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from cod.rm.enforce.cgroupfs import find_cpuset_mount
from helpers import rm_support
from helpers.rm_support import Daemon, RawConn

SLOW = 300.0  # seconds: generous under TCG, still a failure when nothing happens

# The SKB gives SWI-Prolog 20 s to start (skb/session.py), which TCG on a loaded machine exceeds:
# the guest's daemon gets the generous limit, nothing else of it changes.
RM_MAIN = f"""
import sys
from cod.skb import async_engine, engine, session
for module in (session, engine, async_engine):
    if hasattr(module, "STARTUP_TIMEOUT_S"):
        module.STARTUP_TIMEOUT_S = {SLOW}
from cod.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@contextmanager
def guest_daemon(tmp: Path, *extra: str) -> Iterator[Daemon]:
    """A cpuset-enforcing daemon under a cgroup parent of its own; stopped with SIGTERM at the
    end, which must leave no cgroup behind."""
    parent = f"cod-vm-{tmp.name}-{os.getpid()}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rm_support, "COD", [sys.executable, "-c", RM_MAIN])
        d = Daemon(tmp / "rm.sock", ["--enforce", "cpuset", "--state-dir", str(tmp / "state"), "--cgroup-parent",
                                     parent, "--log-level", "debug",
                                     # the planner process starts in ~0.5 s of CPU, ~25x that under TCG
                                     "--set", f"deploy_plan_timeout_s={SLOW:g}", *extra],
                     tmp / "rm.log").start(timeout=SLOW)
    try:
        yield d
    finally:
        d.proc.send_signal(signal.SIGTERM)
        code = d.proc.wait(SLOW)
        d.logf.close()
    assert code == 0, d.log_text()[-4000:]
    assert not os.path.exists(os.path.join(find_cpuset_mount().path, parent)), "the daemon left its cgroups behind"


@contextmanager
def connection(d: Daemon, app: str) -> Iterator[RawConn]:
    c = RawConn(d.path)
    c.sock.settimeout(SLOW)
    c.hello(app)
    try:
        yield c
    finally:
        c.close()


def result(reply: dict) -> dict:
    assert "result" in reply, reply
    return reply["result"]

"""The scx_cod loader the daemon runs for ``--enforce sched_ext`` (cod.rm.enforce.scxsupervisor,
issue 48): where it is found, when the daemon refuses to start instead, and its restarts, with
stand-in loaders that act on a fake /sys/kernel/sched_ext as the kernel does.  The real
scheduler in the sched_ext guest: tests/vm/test_scx.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from cod.rm.enforce import scxsupervisor
from cod.rm.enforce.errors import EnforceError
from cod.rm.enforce.scxloader import IN_CHECKOUT
from cod.rm.enforce.scxmaps import read_state
from cod.rm.enforce.scxsupervisor import INSTALLED, ScxSupervisor, find_loader, why_it_cannot_run
from helpers.rm_support import COD
from helpers.waiting import wait_until


def sched_ext_dir(tmp_path: Path, state: str | None = "disabled", ops: str | None = None) -> Path:
    d = tmp_path / "sched_ext"
    if state is not None:
        (d / "root").mkdir(parents=True)
        (d / "state").write_text(state + "\n")
        if ops is not None:
            (d / "root" / "ops").write_text(ops + "\n")
    return d


def stand_in(tmp_path: Path, sx: Path, name: str = "scx_cod", *, starts: bool = True) -> Path:
    """A loader that does what scx_cod does to the kernel's state: enabled with ops ``cod`` while
    it runs, disabled once it exits on SIGTERM; or, with ``starts=False``, one that cannot attach."""
    exe = tmp_path / name
    if starts:
        exe.write_text(f"""#!/bin/sh
trap 'echo disabled > {sx}/state; rm -f {sx}/root/ops; exit 0' TERM
echo enabled > {sx}/state; echo cod > {sx}/root/ops
echo "scx_cod: running; maps pinned in /x"
while :; do sleep 0.1; done
""")
    else:
        exe.write_text("#!/bin/sh\necho 'libbpf: failed to attach' >&2\nexit 1\n")
    exe.chmod(0o755)
    return exe


def test_the_loader_is_the_one_named_else_the_checkouts_else_the_installs_else_paths(tmp_path, monkeypatch):
    checkout, prefix, bindir = tmp_path / "src", tmp_path / "prefix", tmp_path / "bin"
    monkeypatch.setenv("PATH", str(bindir))
    assert find_loader(None, checkout=checkout, prefix=prefix) is None
    for where in (bindir / "scx_cod", prefix / INSTALLED, checkout / IN_CHECKOUT):
        where.parent.mkdir(parents=True, exist_ok=True)
        where.write_text("#!/bin/sh\n")
        where.chmod(0o755)
        assert find_loader(None, checkout=checkout, prefix=prefix) == where  # each one ahead of the last
    assert find_loader("/elsewhere/scx_cod", checkout=checkout, prefix=prefix) == Path("/elsewhere/scx_cod")


@pytest.mark.parametrize("state, ops, root, loader, says", [
    (None, None, True, "ok", "this kernel has no sched_ext"),
    ("enabled", "rusty", True, "ok", "is 'rusty', not 'cod'"),
    ("disabled", None, False, "ok", "needs root"),
    ("disabled", None, True, None, "scx_cod is not built"),
    ("disabled", None, True, "missing", "does not exist"),
    ("disabled", None, True, "ok", None),
])
def test_when_the_daemon_may_start_the_loader(tmp_path, state, ops, root, loader, says):
    sx = sched_ext_dir(tmp_path, state, ops)
    path = {"ok": stand_in(tmp_path, sx), "missing": tmp_path / "nothing", None: None}[loader]
    why = why_it_cannot_run(path, str(sx), root=root)
    assert (why is None) if says is None else (says in why[0] and why[1]), why


def test_the_supervisor_starts_and_stops_the_scheduler(tmp_path):
    sx = sched_ext_dir(tmp_path)
    sup = ScxSupervisor(stand_in(tmp_path, sx), str(sx))
    sup.start()
    assert read_state(str(sx)) == ("enabled", "cod")
    sup.stop()
    assert read_state(str(sx)) == ("disabled", None)
    sup.stop()  # twice: nothing more
    assert sup.restart() is False, "a stopped supervisor restarts nothing"


def test_a_loader_that_exits_is_restarted_and_one_that_keeps_exiting_is_given_up(tmp_path, monkeypatch):
    monkeypatch.setattr(scxsupervisor, "RESTART_BACKOFF_S", 0.0)
    sx = sched_ext_dir(tmp_path)
    sup = ScxSupervisor(stand_in(tmp_path, sx), str(sx), max_restarts=2, window_s=600)
    sup.start()
    try:
        assert sup.loader is not None
        sup.loader.proc.terminate()  # the scheduler went away (ejected, killed)
        # The stand-in writes the state, then exits: wait for both, as the kernel's state comes first too.
        wait_until(lambda: read_state(str(sx))[0] == "disabled" and sup.loader.proc.poll() is not None, 10,
                   "the stand-in detaching and exiting")
        assert "exited with status 0" in sup.exited()
        assert sup.restart() is True
        sup.wait_restart(30)
        assert read_state(str(sx)) == ("enabled", "cod") and sup.loader.proc.poll() is None
        # From now on it cannot attach: one more try, then it gives up and says why.
        sup.path = stand_in(tmp_path, sx, "broken", starts=False)
        sup.loader.proc.terminate()
        assert sup.restart() is True
        sup.wait_restart(30)
        assert read_state(str(sx))[0] == "disabled" and sup.gave_up is None
        assert sup.restart() is False
        assert sup.gave_up == "scx_cod exited 3 times within 600 s; not restarted again"
    finally:
        sup.stop()


def test_a_loader_that_cannot_attach_is_an_error_with_its_words(tmp_path):
    sx = sched_ext_dir(tmp_path)
    with pytest.raises(EnforceError, match="scx_cod did not start.*failed to attach"):
        ScxSupervisor(stand_in(tmp_path, sx, starts=False), str(sx)).start()


@pytest.mark.skipif(os.path.exists("/sys/kernel/sched_ext"), reason="this kernel has sched_ext: tests/vm/test_scx.py")
def test_the_daemon_asked_for_sched_ext_where_it_cannot_run_refuses_to_start_naming_it(tmp_path):
    r = subprocess.run([*COD, "rm", "--socket", str(tmp_path / "rm.sock"), "--enforce", "sched_ext",
                        "--state-dir", str(tmp_path / "state")], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and not (tmp_path / "rm.sock").exists()
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "sched_ext" in lines[0] and "--enforce sched_ext,cpuset" in lines[0], r.stderr

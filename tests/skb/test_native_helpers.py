"""The SKB engine's native helpers when they are missing (issue 53, item 1): the daemon says so
once, at its start, with the command that builds them for this install; a one-shot command
(`cod query`) says nothing, as it would on every call.  (That every install builds them is
tests/project/test_install.py's.)

Missing helpers are simulated in a subprocess whose launcher points the engine's paths at a
directory that does not exist; the checkout's own helpers stay as they are."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cod.skb.native_libs import BUILD_NEEDS, fix_command, startup_warning
from helpers import rm_support
from helpers.paths import REPO
from helpers.waiting import load_scaled
from test_rm_write_outcomes import engine_pid

GONE = "/nonexistent/cod-native"

# The launcher: `python launcher.py ARGS...` runs `cod ARGS...` with both helpers missing.
LAUNCHER = f"""
import sys
from pathlib import Path
import cod.skb.lifecycle as lifecycle
gone = Path({GONE!r})
lifecycle.NOEXEC_LIBRARY, lifecycle.FRAMES_LIBRARY = gone / "cod_noexec.so", gone / "cod_frames.so"
try:
    import cod.skb.native_libs as native_libs
    native_libs.NATIVE_DIR = gone
except ImportError:
    pass
from cod.cli.main import main
sys.exit(main(sys.argv[1:]))
"""

PIP = f"{sys.executable} -m pip install --force-reinstall --no-deps"
FIX_ROWS = [
    # (id, the install's direct_url.json, the command)
    ("editable checkout", {"url": f"file://{REPO}", "dir_info": {"editable": True}}, f"make -C {REPO} setup"),
    ("editable, no Makefile", {"url": "file:///srv/cod", "dir_info": {"editable": True}},
     f"install {BUILD_NEEDS}, then {PIP} /srv/cod"),
    ("a checkout, not editable", {"url": "file:///srv/cod", "dir_info": {}}, f"install {BUILD_NEEDS}, then {PIP} /srv/cod"),
    ("an sdist", {"url": "file:///tmp/d/cod_policy_engine-0.1.0.tar.gz", "archive_info": {}},
     f"install {BUILD_NEEDS}, then {PIP} /tmp/d/cod_policy_engine-0.1.0.tar.gz"),
    ("a path with a space", {"url": "file:///tmp/my%20dir/cod.tar.gz", "archive_info": {}},
     f"install {BUILD_NEEDS}, then {PIP} '/tmp/my dir/cod.tar.gz'"),
    ("a wheel", {"url": "file:///w/cod_policy_engine-0.1.0-cp311-cp311-linux_x86_64.whl", "archive_info": {}},
     f"install {BUILD_NEEDS}, then {PIP} SOURCE  (the checkout or sdist "
     "cod_policy_engine-0.1.0-cp311-cp311-linux_x86_64.whl was built from)"),
    ("a repository", {"url": "https://example.org/cod.git", "vcs_info": {"vcs": "git", "commit_id": "abc"}},
     f"install {BUILD_NEEDS}, then {PIP} https://example.org/cod.git"),
    ("an index", None, f"install {BUILD_NEEDS}, then {PIP} --no-binary cod-policy-engine cod-policy-engine"),
]


@pytest.mark.parametrize("record, command", [r[1:] for r in FIX_ROWS], ids=[r[0] for r in FIX_ROWS])
def test_the_fix_names_the_command_for_the_way_it_was_installed(record, command):
    assert fix_command(record, python=sys.executable) == command


def test_the_warning_names_each_missing_helper_and_what_it_costs(tmp_path):
    assert startup_warning(tmp_path, fix="FIX") == (
        "cod_noexec.so is not built: the SKB engine runs without its seccomp filter against execve; "
        "cod_frames.so is not built: the SKB engine reads the direct channel's frames in Prolog, at about "
        "twice the CPU. To build them: FIX")
    (tmp_path / "cod_noexec.so").write_bytes(b"")
    assert startup_warning(tmp_path, fix="FIX") == ("cod_frames.so is not built: the SKB engine reads the direct "
                                                    "channel's frames in Prolog, at about twice the CPU. "
                                                    "To build it: FIX")
    (tmp_path / "cod_frames.so").write_bytes(b"")
    assert startup_warning(tmp_path, fix="FIX") is None


@pytest.fixture
def launcher(tmp_path: Path) -> Path:
    path = tmp_path / "launcher.py"
    path.write_text(LAUNCHER)
    return path


def test_cod_query_says_nothing_of_a_missing_helper(launcher, tmp_path):
    r = subprocess.run([sys.executable, str(launcher), "query", "--machine", "magnycours", "X = 1"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert (r.returncode, r.stdout, r.stderr) == (0, '{"X": 1}\n', "")


def test_the_daemon_says_it_once_at_start_with_the_fix(launcher, tmp_path, monkeypatch):
    monkeypatch.setattr(rm_support, "COD", [sys.executable, str(launcher)])
    d = rm_support.start_daemon(tmp_path, "--machine", "magnycours")
    try:
        first = engine_pid(d.proc.pid)
        assert first is not None
        os.kill(first, signal.SIGKILL)  # the engine's restart must not say it again
        deadline = time.monotonic() + load_scaled(30)
        while engine_pid(d.proc.pid) in (None, first) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine_pid(d.proc.pid) not in (None, first), d.log_text()
        c = rm_support.RawConn(d.path)  # and it still serves
        assert c.hello("probe")["machine"] == "magnycours"
        c.close()
    finally:
        d.stop()
    said = [line for line in d.log_text().splitlines() if "is not built" in line]
    assert len(said) == 1, d.log_text()
    assert " WARNING " in said[0] and "cod_noexec.so is not built: the SKB engine runs without its seccomp" in said[0]
    assert said[0].endswith(f"To build them: make -C {REPO} setup"), said[0]

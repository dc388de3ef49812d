"""`cod rm` that cannot start says why in one line (issue 32: a full state directory gave a traceback)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from helpers.rm_support import COD


@pytest.fixture
def full_dir(tmp_path: Path):
    """A 64 KiB tmpfs of our own, filled up (needs root to mount)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "full"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        fd = os.open(mnt / "fill", os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError:  # ENOSPC: full
            pass
        finally:
            os.close(fd)
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_a_full_state_directory_is_one_line(tmp_path: Path, full_dir: Path) -> None:
    state = full_dir / "state"
    r = subprocess.run([*COD, "rm", "--socket", str(tmp_path / "rm.sock"), "--enforce", "affinity",
                        "--no-busy-detect", "--state-dir", str(state), "--log-level", "warning"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    [line] = r.stderr.strip().splitlines()
    assert f"cannot write to the state directory {state}: No space left on device" in line, line
    assert not (tmp_path / "rm.sock").exists()

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


@pytest.mark.parametrize("umask", [0o000, 0o077])
def test_the_socket_directories_it_creates_are_755(tmp_path: Path, umask: int) -> None:
    """`--socket /a/missing/dir/rm.sock` creates each missing directory 0755 whatever the umask
    (docs/running.md): 0777 would let anyone replace the socket, 0700 would lock every other user out."""
    from rm.transport import SOCKET_DIR_MODE, claim_socket_path

    path = tmp_path / "a" / "missing" / "dir" / "rm.sock"
    old = os.umask(umask)
    try:
        claim_socket_path(str(path))
    finally:
        os.umask(old)
    for d in (tmp_path / "a", tmp_path / "a" / "missing", path.parent):
        assert d.is_dir() and d.stat().st_mode & 0o7777 == SOCKET_DIR_MODE == 0o755, oct(d.stat().st_mode)
    assert tmp_path.stat().st_mode & 0o7777 != 0 and not path.exists()

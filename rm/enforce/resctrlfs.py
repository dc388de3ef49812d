"""The one module that does resctrl's file I/O: the seam a fake kernel stands behind in tests.

Every read, write, mkdir and rmdir the resctrl backend (`cod.rm.enforce.resctrl`)
makes goes through a `ResctrlFS`.  On failure it reads ``info/last_cmd_status``
(the kernel's own words for what it refused, e.g. ``The mask f7 has
non-consecutive 1-bits``) and raises `ResctrlError` carrying the errno, the
file and those words, so the log says why and not only ``Invalid argument``.

Tests pass a subclass (``tests/helpers/fake_resctrl.py``) that applies the
kernel's rules before touching a plain directory; nothing else in the backend
knows the difference.
"""

from __future__ import annotations

import errno
import os

from .errors import EnforceError

LAST_CMD_STATUS = "info/last_cmd_status"


class ResctrlError(EnforceError):
    """The kernel refused a resctrl operation; ``errno`` and the kernel's ``status`` line say why."""

    def __init__(self, op: str, path: str, err: OSError, status: str | None) -> None:
        self.errno = err.errno
        self.path = path
        self.status = status
        why = err.strerror or os.strerror(err.errno or 0)
        said = f" (the kernel says: {status})" if status and status != "ok" else ""
        super().__init__(f"resctrl {op} {path}: {why}{said}")


class ResctrlFS:
    """File operations under one resctrl root; paths are relative to it."""

    def __init__(self, root: str) -> None:
        self.root = root

    def path(self, rel: str) -> str:
        return os.path.join(self.root, rel) if rel else self.root

    # ---- what a fake overrides (the raw operations) -----------------------
    def _read(self, path: str) -> str:
        with open(path) as f:
            return f.read()

    def _write(self, path: str, text: str) -> None:
        # One write(2) per call: the kernel parses a schemata or a tasks write as one command.
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)

    def _mkdir(self, path: str) -> None:
        os.mkdir(path)

    def _rmdir(self, path: str) -> None:
        os.rmdir(path)

    # ---- the backend's calls ----------------------------------------------
    def status(self) -> str | None:
        try:
            return self._read(self.path(LAST_CMD_STATUS)).strip()
        except OSError:
            return None

    def read(self, rel: str) -> str:
        try:
            return self._read(self.path(rel))
        except OSError as err:
            raise ResctrlError("read", self.path(rel), err, None) from err

    def write(self, rel: str, text: str) -> None:
        try:
            self._write(self.path(rel), text)
        except OSError as err:
            raise ResctrlError("write", self.path(rel), err, self.status()) from err

    def mkdir(self, rel: str) -> bool:
        """Create a group; False when it already exists."""
        try:
            self._mkdir(self.path(rel))
        except FileExistsError:
            return False
        except OSError as err:
            raise ResctrlError("mkdir", self.path(rel), err, self.status()) from err
        return True

    def rmdir(self, rel: str) -> bool:
        """Remove a group (its tasks go back to the default group); False when it was gone."""
        try:
            self._rmdir(self.path(rel))
        except FileNotFoundError:
            return False
        except OSError as err:
            raise ResctrlError("rmdir", self.path(rel), err, self.status()) from err
        return True

    def exists(self, rel: str) -> bool:
        return os.path.exists(self.path(rel))

    def isdir(self, rel: str) -> bool:
        return os.path.isdir(self.path(rel))

    def listdir(self, rel: str) -> list[str]:
        try:
            return sorted(os.listdir(self.path(rel)))
        except FileNotFoundError:
            return []

    def mounted(self) -> bool:
        """A resctrl root: it has ``info/`` and a ``schemata``."""
        return self.isdir("info") and self.exists("schemata")


def is_busy(err: Exception) -> bool:
    return isinstance(err, ResctrlError) and err.errno == errno.EBUSY


def is_full(err: Exception) -> bool:
    return isinstance(err, ResctrlError) and err.errno == errno.ENOSPC

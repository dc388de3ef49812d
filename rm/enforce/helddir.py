"""A directory held open by its descriptor: what is checked is what is used (issue 47, item 4).

A path names whatever it names at the moment it is looked up.  A check made through one lookup
(``os.stat``: whose cgroup is this?) and a use through another (``realpath``, then its
``cgroup.procs``) may meet two different directories: a symbolic link swapped in between, or, on
cgroup v1, a rename.  `HeldDir` looks the path up once, one component at a time from ``/``, each
opened relative to the one before with ``O_DIRECTORY | O_NOFOLLOW`` (a symbolic link anywhere on
the path is refused, never followed, as openat2's RESOLVE_NO_SYMLINKS would), keeps the
descriptor of the last one and answers everything after from it: its owner and identity
(``fstat``), its files (opened relative to it, again without following a link).  Once the
directory is removed its files answer ENOENT (or ENODEV), never another directory's.
"""

from __future__ import annotations

import errno
import os
import stat
import weakref

from .errors import EnforceError

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_CHUNK = 65536  # cgroup.procs of a large group exceeds a page


class PathRefused(EnforceError):
    """A path that cannot be looked up safely: relative, with '..' or a symbolic link, not a directory."""


def components(path: str) -> list[str]:
    """The names along an absolute ``path`` ('.' and empty ones dropped); PathRefused for a
    relative path, a '..' (its meaning would depend on what the walk meets) or a NUL.  Pure."""
    if not path.startswith("/"):
        raise PathRefused(f"{path!r} is not an absolute path")
    if "\0" in path:
        raise PathRefused(f"{path!r} holds a NUL character")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise PathRefused(f"{path}: '..' is not accepted; give the directory's own path")
    return parts


def _refusal(walked: str, parent_fd: int, name: str, err: OSError) -> PathRefused:
    """Why ``name`` (at ``walked``) could not be opened as a directory, in words."""
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except OSError:
        st = None
    if st is not None and stat.S_ISLNK(st.st_mode):
        try:
            target = os.readlink(name, dir_fd=parent_fd)
        except OSError:
            target = "?"
        return PathRefused(f"{walked} is a symbolic link (to {target}): give the directory's own path, "
                           f"without symbolic links")
    if st is not None and not stat.S_ISDIR(st.st_mode):
        return PathRefused(f"{walked} is not a directory")
    return PathRefused(f"{walked}: {err.strerror or errno.errorcode.get(err.errno or 0, err)}")


class HeldDir:
    """One directory, opened once without following a symbolic link, used through its descriptor."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path  # how it was reached (no symbolic link on it), for messages and reports
        st = os.fstat(fd)
        self.identity = (st.st_dev, st.st_ino)  # the directory itself, whatever its path names later
        self._close = weakref.finalize(self, os.close, fd)

    @classmethod
    def open(cls, path: str) -> "HeldDir":
        """Walk ``path`` from ``/``; PathRefused saying which component is a link, missing or no directory."""
        parts = components(path)
        fd = os.open("/", DIR_FLAGS)
        walked = ""
        try:
            for name in parts:
                walked += "/" + name
                try:
                    child = os.open(name, DIR_FLAGS, dir_fd=fd)
                except OSError as err:
                    raise _refusal(walked, fd, name, err) from None
                os.close(fd)
                fd = child
            return cls(fd, walked or "/")
        except BaseException:
            os.close(fd)
            raise

    def _held(self) -> int:
        """The descriptor, while it is held: once closed, its number may be another file's."""
        if not self._close.alive:
            raise OSError(errno.EBADF, f"{self.path} is no longer held")
        return self.fd

    def owner_uid(self) -> int:
        """The uid that owns the directory now (``fstat`` of the held descriptor)."""
        return os.fstat(self._held()).st_uid

    def has_file(self, name: str) -> bool:
        """``name`` is a regular file in the directory (a symbolic link is not)."""
        try:
            return stat.S_ISREG(os.stat(name, dir_fd=self._held(), follow_symlinks=False).st_mode)
        except OSError:
            return False

    def read(self, name: str) -> bytes:
        """The whole of file ``name`` in the directory; the OSError as the kernel gives it."""
        fd = os.open(name, FILE_FLAGS, dir_fd=self._held())
        try:
            chunks = []
            while chunk := os.read(fd, READ_CHUNK):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def close(self) -> None:
        self._close()

    @property
    def closed(self) -> bool:
        return not self._close.alive

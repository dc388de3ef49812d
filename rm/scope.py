"""Which processes the RM may report as busy and confine, and which it never touches.

The busy detector sees every process of the machine; acting on all of them
is right for a dedicated database host and wrong for a shared one (or for a
test suite on a developer's machine).  ``busy_scope`` says what may be
reported and confined:

* ``all``: every process;
* ``uids:0,1000``: processes of these uids;
* ``cgroup:/some/path``: processes whose cgroup (any hierarchy, as in
  /proc/PID/cgroup) is that path or below it;
* ``descendants:PID``: PID's descendants (tests give their own pid).

Never touched, whatever the scope: kernel threads (the detector skips
them), the daemon itself and its own children (the SKB engine), and
processes whose name is in ``never_confine``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from cod.facts import procfs


@dataclass(frozen=True)
class ProcessScope:
    kind: str  # all | uids | cgroup | descendants
    uids: frozenset[int] = frozenset()
    cgroup: str = ""
    ancestor: int = 0
    never: frozenset[str] = frozenset()
    proc: str = procfs.PROC

    @classmethod
    def parse(cls, text: str, never: str = "", proc: str = procfs.PROC) -> "ProcessScope":
        never_set = frozenset(c.strip() for c in never.split(",") if c.strip())
        text = text.strip()
        if text == "all":
            return cls("all", never=never_set, proc=proc)
        kind, sep, arg = text.partition(":")
        if not sep:
            raise ValueError(f"{text!r}: use all, uids:UID,..., cgroup:/path or descendants:PID")
        if kind == "uids":
            try:
                uids = frozenset(int(u) for u in arg.split(",") if u.strip())
            except ValueError:
                raise ValueError(f"{text!r}: uids must be numbers") from None
            if not uids:
                raise ValueError(f"{text!r}: give at least one uid")
            return cls("uids", uids=uids, never=never_set, proc=proc)
        if kind == "cgroup":
            if not arg.startswith("/"):
                raise ValueError(f"{text!r}: the cgroup path starts with / (as in /proc/PID/cgroup)")
            return cls("cgroup", cgroup=arg.rstrip("/") or "/", never=never_set, proc=proc)
        if kind == "descendants":
            if not arg.isdigit():
                raise ValueError(f"{text!r}: give a pid")
            return cls("descendants", ancestor=int(arg), never=never_set, proc=proc)
        raise ValueError(f"{text!r}: unknown scope {kind!r}; use all, uids:, cgroup: or descendants:")

    def allows(self, pid: int, comm: str | None = None) -> bool:
        """May ``pid`` be reported and confined?  False for a process that is gone."""
        try:
            if comm is None:
                comm = procfs.comm(pid, self.proc)
            if comm is None or comm.strip() in self.never:
                return False
            me = os.getpid()
            if pid == me or self._descends(pid, me):
                return False
            if self.kind == "all":
                return True
            if self.kind == "uids":
                return self._uid(pid) in self.uids
            if self.kind == "cgroup":
                return any(self._under(path) for path in self._cgroups(pid))
            return self._descends(pid, self.ancestor)
        except (FileNotFoundError, ProcessLookupError, PermissionError, ValueError):
            return False

    def _uid(self, pid: int) -> int:
        try:
            return int(procfs.status_field(pid, "Uid", proc=self.proc).split()[0])  # the real uid
        except KeyError:
            raise ValueError("no Uid line") from None

    def _ppid(self, pid: int) -> int:
        return procfs.read_stat(pid, proc=self.proc).ppid

    def _descends(self, pid: int, ancestor: int) -> bool:
        seen = 0
        while pid > 1 and seen < 4096:
            pid = self._ppid(pid)
            if pid == ancestor:
                return True
            seen += 1
        return False

    def _cgroups(self, pid: int) -> list[str]:
        return [path for _, _, path in procfs.cgroups(pid, self.proc)]

    def _under(self, path: str) -> bool:
        return path == self.cgroup or self.cgroup == "/" or path.startswith(self.cgroup + "/")

"""cpuset enforcement: one cgroup per task under a COD parent, v1 or v2.

Layout: ``MOUNT/PARENT/TASK`` (PARENT is ``cod`` by default).  ``cpuset.cpus``
gets the task's CPUs and ``cpuset.mems`` the memory nodes of those CPUs, so the
kernel allocates the task's memory where it runs.  Every thread (v1 ``tasks``)
or process (v2 ``cgroup.procs``) is moved in; the kernel then resets their
affinity to the cpuset and new threads are born inside it.  Release moves
them back to the cgroup they came from (recorded), restores their original
affinity and removes the directory.
"""

from __future__ import annotations

import base64
import ctypes
import errno
import logging
import os
import re
from collections.abc import Mapping, Sequence

from cod.facts import procfs

from .cgroupfs import CpusetMount, move_into, process_cgroup
from .errors import EnforceError
from .pinning import pin_process
from .recording import RecordingEnforcer, check_task_name
from .state import ProcRecord
from .statecheck import CgroupScope
from .syscalls import syscall_number

log = logging.getLogger("cod.rm.enforce")

TASK_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:-]{0,63}")


def cgroup_dir_name(task: str) -> str:
    """The cgroup directory of a task: its own name when that is a plain word, else an escape.

    Plain words ([A-Za-z0-9_][A-Za-z0-9_.:-]{0,63}) stay readable; any other name becomes
    "~" + base32 of its UTF-8 bytes, which no plain word starts with, so two names never share
    a directory, and never "." or ".." or a "/" (at most 206 bytes, below NAME_MAX)."""
    check_task_name(task)
    if TASK_NAME.fullmatch(task):
        return task
    return "~" + base64.b32encode(task.encode("utf-8")).decode("ascii").rstrip("=").lower()


def cpuset_scope(mount: CpusetMount, parent: str) -> CgroupScope:
    """Where the task cgroups under ``parent`` of ``mount`` are (``MOUNT/PARENT/<dir name>``)."""
    if not TASK_NAME.fullmatch(parent):
        raise EnforceError(f"cgroup parent {parent!r}: use 1-64 of A-Z a-z 0-9 _ . : - (not starting with . : -)")
    parent_dir = os.path.join(mount.path, parent)
    return CgroupScope(mount.version, mount.path, parent_dir,
                       lambda task: os.path.join(parent_dir, cgroup_dir_name(task)))


def migrate_pages_number(machine: str | None = None) -> int:
    return syscall_number("migrate_pages", "memory migration", machine)


def _write(path: str, value: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError as err:
        raise EnforceError(f"cannot write {value!r} to {path}: {err.strerror}") from err


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def migrate_pages(pid: int, old_nodes: Sequence[int], new_nodes: Sequence[int]) -> int:
    """migrate_pages(2): move ``pid``'s pages from old to new nodes; returns pages not moved."""
    width = max([*old_nodes, *new_nodes, 0]) + 1
    words = (width + 63) // 64
    Mask = ctypes.c_ulong * words

    def mask(nodes: Sequence[int]):
        m = Mask()
        for n in nodes:
            m[n // 64] |= 1 << (n % 64)
        return m

    libc = ctypes.CDLL(None, use_errno=True)
    res = libc.syscall(migrate_pages_number(), ctypes.c_int(pid), ctypes.c_ulong(words * 64 + 1),
                       mask(old_nodes), mask(new_nodes))
    if res < 0:
        e = ctypes.get_errno()
        if e == errno.ESRCH:
            return 0
        raise EnforceError(f"migrate_pages({pid}) failed: {os.strerror(e)}")
    return res


def online_nodes(sys_nodes: str = "/sys/devices/system/node") -> tuple[int, ...]:
    return procfs.parse_cpu_list(_read(os.path.join(sys_nodes, "online")))


class CpusetEnforcer(RecordingEnforcer):
    """What v1 and v2 share; subclasses name the files."""

    version = 0
    procs_file = ""

    def __init__(self, mount: CpusetMount, state_dir: str, parent: str = "cod",
                 memory_migrate: bool = False, exclusive: bool = False,
                 proc: str = procfs.PROC) -> None:
        if mount.version != self.version:
            raise EnforceError(f"{type(self).__name__} needs cgroup v{self.version}, got {mount.describe()}")
        scope = cpuset_scope(mount, parent)
        super().__init__(state_dir, proc, memory_migrate=memory_migrate, cgroups=scope)
        self.mount = mount
        self.parent = scope.parent
        self.exclusive = exclusive
        try:
            self._make_parent()
        except EnforceError:
            self.state.close()
            raise

    name = "cpuset"

    def describe(self) -> str:
        extra = ", memory migration on" if self.memory_migrate else ""
        return f"cpuset ({self.mount.describe()}, parent {self.parent}{extra})"

    # ---- cgroup plumbing ------------------------------------------------
    def _make_parent(self) -> None:
        made = False
        if not os.path.isdir(self.parent):
            try:
                os.mkdir(self.parent)
                made = True
            except FileExistsError:
                pass
            except OSError as err:
                raise EnforceError(f"cannot create cgroup {self.parent}: {err.strerror}") from err
        try:
            self._init_parent()
        except EnforceError:
            if made:  # a refused start leaves nothing behind (e.g. an exclusive parent refused)
                try:
                    os.rmdir(self.parent)
                except OSError as err:
                    log.warning("left cgroup %s in place: %s", self.parent, err.strerror)
            raise

    def _init_parent(self) -> None:
        raise NotImplementedError

    def task_dir(self, task: str) -> str:
        return os.path.join(self.parent, cgroup_dir_name(task))

    def _original_cgroup(self, pid: int) -> str | None:
        rel = process_cgroup(pid, self.version, self.proc)
        return None if rel is None else os.path.join(self.mount.path, rel.lstrip("/"))

    def _move(self, cgroup_dir: str, ident: int) -> bool:
        """Move a tid (v1) or pid (v2) into ``cgroup_dir``; False when it is gone.

        One already there is left alone: every write to a ``tasks``/``cgroup.procs`` file takes
        the kernel's threadgroup lock for writing, an RCU grace period (10-20 ms on a busy VM,
        measured), even when nothing moves; re-pinning a task or an elastic group re-applies
        it to processes that are already in place."""
        rel = process_cgroup(ident, self.version, self.proc)
        if rel is not None and os.path.join(self.mount.path, rel.lstrip("/")) == cgroup_dir.rstrip("/"):
            return True
        try:
            return move_into(cgroup_dir, ident)
        except OSError as err:
            if err.errno == errno.EINVAL:
                st = None
                try:
                    st = procfs.read_stat(ident, proc=self.proc)
                except (FileNotFoundError, ProcessLookupError):
                    return False
                if st.is_kernel_thread or st.state in "ZX":
                    return False
            raise EnforceError(f"cannot move {ident} into {cgroup_dir}: {err.strerror}") from err

    # ---- RecordingEnforcer hooks -----------------------------------------
    def _enforce(self, task: str, pids: list[int], cpus: tuple[int, ...], mems: tuple[int, ...],
                 placements: Mapping[int, Mapping[int, tuple[int, ...]]]) -> list[int]:
        path = self.task_dir(task)
        rec = self.state.tasks[task]
        if rec.cgroup is None:
            rec.cgroup = path
            self.state.save()  # recorded before it exists: a crash now still removes it
        self.leftovers.reused(path)  # a busy leftover of an earlier release, holding the task again
        fresh = not os.path.isdir(path)
        if fresh:
            try:
                os.mkdir(path)
            except FileExistsError:
                pass
            except OSError as err:
                raise EnforceError(f"cannot create cgroup {path}: {err.strerror}") from err
        # Memory follows in bounded batches (decision 6): the cpuset first allows every node, so
        # neither the attach nor the new CPUs make the kernel move everything in one go; the
        # PageMover moves the pages in the background; when it is done, the task's own
        # cpuset.mems makes the kernel move what is left (`_memory_moved`).
        moving = self._pids_to_move(task, pids, mems)
        wide = tuple(sorted(set(self._parent_mems()) | set(mems))) if moving else mems
        self._configure(path, cpus, wide, fresh)
        applied = []
        for pid in pids:
            # The kernel resets affinity on attach only when the cpuset's CPUs differ
            # from the old cgroup's (6.x skips the update otherwise): pin explicitly too.
            # A thread's own placement inside the new CPUs is kept (decision 14).
            if self._move_process(path, pid) and pin_process(pid, cpus, self.proc, placements.get(pid)):
                applied.append(pid)
        if not self._move_memory(task, applied, mems) and wide != mems:
            _write(os.path.join(path, "cpuset.mems"), procfs.format_cpu_list(mems))  # nothing left to move
        return applied

    def _memory_moved(self, task: str, mems: tuple[int, ...]) -> None:
        """The move is done (on the mover's thread, under the lock; the task still has ``mems``):
        narrow its cpuset to them."""
        rec = self.state.tasks.get(task)
        if rec is None or rec.cgroup is None or not os.path.isdir(rec.cgroup):
            return
        try:
            _write(os.path.join(rec.cgroup, "cpuset.mems"), procfs.format_cpu_list(mems))
        except EnforceError as err:
            log.warning("task %s: its cpuset stays on every node: %s", task, err)

    def _configure(self, path: str, cpus: tuple[int, ...], mems: tuple[int, ...], fresh: bool) -> None:
        raise NotImplementedError

    def _parent_mems(self) -> tuple[int, ...]:
        """The nodes the COD parent may give (not every online node has memory: a memoryless
        node is online but in no cpuset)."""
        for name in ("cpuset.mems.effective", "cpuset.effective_mems", "cpuset.mems"):
            path = os.path.join(self.parent, name)
            if os.path.exists(path):
                return procfs.parse_cpu_list(_read(path))
        return online_nodes()

    def _move_process(self, path: str, pid: int) -> bool:
        raise NotImplementedError

    def _add_thread(self, task: str, tid: int) -> bool:
        # Threads are born in their creator's cgroup; this covers one moved out meanwhile.
        if self.version == 1 and not self._move(self.task_dir(task), tid):
            return False
        return self._place_new_thread(task, tid)

    def _restore_proc(self, pid: int, rec: ProcRecord) -> bool:
        if not procfs.same_process(pid, rec.start, self.proc):
            return False
        home = rec.cpuset if rec.cpuset and os.path.isdir(rec.cpuset) else self.mount.path
        for ident in self._members_of(pid):
            try:
                self._move(home, ident)
            except EnforceError as err:
                log.warning("could not move %d back to %s: %s", ident, home, err)
        return self._restore_affinity(pid, rec)

    def _members_of(self, pid: int) -> list[int]:
        raise NotImplementedError

    def _remove_parent_if_unused(self, parent: str) -> None:
        if parent != self.parent:  # ours stays until close()
            super()._remove_parent_if_unused(parent)

    def _cleanup_extra(self) -> list[str]:
        """Task cgroups under the parent that no state file names (crash mid-write)."""
        done = []
        try:
            names = sorted(os.listdir(self.parent))
        except FileNotFoundError:
            return done
        for name in names:
            path = os.path.join(self.parent, name)
            if os.path.isdir(path) and name not in {cgroup_dir_name(t) for t in self.state.tasks}:
                if self._remove_cgroup(path):
                    done.append(f"removed unrecorded cgroup {path}")
        return done

    def _close_backend(self) -> None:
        # Remove the parent only if no other task cgroups remain (nothing else should).
        try:
            if not any(os.path.isdir(os.path.join(self.parent, n)) for n in os.listdir(self.parent)):
                os.rmdir(self.parent)
        except OSError as err:
            log.warning("left cgroup %s in place: %s", self.parent, err.strerror)


class CpusetV1Enforcer(CpusetEnforcer):
    version = 1
    procs_file = "tasks"  # v1 moves single threads

    def _init_parent(self) -> None:
        # A v1 cpuset starts with empty cpus/mems; give the parent everything the root has.
        for name in ("cpuset.cpus", "cpuset.mems"):
            if not _read(os.path.join(self.parent, name)):
                _write(os.path.join(self.parent, name), _read(os.path.join(self.mount.path, name)))
        if self.exclusive:
            # v1 lets a cpuset be exclusive only inside an exclusive parent.
            _write(os.path.join(self.parent, "cpuset.cpu_exclusive"), "1")

    def _configure(self, path: str, cpus: tuple[int, ...], mems: tuple[int, ...], fresh: bool) -> None:
        if fresh:
            _write(os.path.join(path, "cpuset.memory_migrate"), "1" if self.memory_migrate else "0")
        _write(os.path.join(path, "cpuset.cpus"), procfs.format_cpu_list(cpus))
        _write(os.path.join(path, "cpuset.mems"), procfs.format_cpu_list(mems))
        if self.exclusive:
            _write(os.path.join(path, "cpuset.cpu_exclusive"), "1")

    def _move_process(self, path: str, pid: int) -> bool:
        moved: set[int] = set()
        for _ in range(4):  # threads born during the move are caught on the next pass
            new = [t for t in procfs.thread_ids(pid, self.proc) if t not in moved]
            if not new:
                break
            for tid in new:
                self._move(path, tid)
                moved.add(tid)
        return procfs.start_time(pid, self.proc) is not None and bool(moved)

    def _members_of(self, pid: int) -> list[int]:
        return procfs.thread_ids(pid, self.proc)


class CpusetV2Enforcer(CpusetEnforcer):
    version = 2
    procs_file = "cgroup.procs"  # v2 moves whole processes

    def _init_parent(self) -> None:
        # Enable the cpuset controller for the parent and for its children.
        for d in (self.mount.path, self.parent):
            ctl = os.path.join(d, "cgroup.subtree_control")
            if "cpuset" not in _read(ctl).split():
                _write(ctl, "+cpuset")

    def _configure(self, path: str, cpus: tuple[int, ...], mems: tuple[int, ...], fresh: bool) -> None:
        if self.exclusive:  # first: CPUs another partition holds are refused before anything changes
            self._claim_exclusive(path, cpus)
        _write(os.path.join(path, "cpuset.cpus"), procfs.format_cpu_list(cpus))
        _write(os.path.join(path, "cpuset.mems"), procfs.format_cpu_list(mems))
        if self.exclusive:
            self._make_partition(path, cpus)

    def _claim_exclusive(self, path: str, cpus: tuple[int, ...]) -> None:
        """A remote partition (Linux 6.7+): our parent is no partition root, so the CPUs must be in
        its ``cpuset.cpus.exclusive``, then in the task's (which the kernel refuses when a sibling
        holds one of them)."""
        parent_x = os.path.join(self.parent, "cpuset.cpus.exclusive")
        held = set(procfs.parse_cpu_list(_read(parent_x) or ""))
        if not set(cpus) <= held:
            _write(parent_x, procfs.format_cpu_list(sorted(held | set(cpus))))
        _write(os.path.join(path, "cpuset.cpus.exclusive"), procfs.format_cpu_list(cpus))

    def _make_partition(self, path: str, cpus: tuple[int, ...]) -> None:
        """The kernel accepts 'root' even when it cannot make the partition and says so only in
        the file ('root invalid (...)'): read it back."""
        _write(os.path.join(path, "cpuset.cpus.partition"), "root")
        state = _read(os.path.join(path, "cpuset.cpus.partition"))
        if state != "root":
            raise EnforceError(f"{path} is not an exclusive partition of CPUs {procfs.format_cpu_list(cpus)}: "
                               f"the kernel says {state!r}")

    def _move_process(self, path: str, pid: int) -> bool:
        return self._move(path, pid)

    def _members_of(self, pid: int) -> list[int]:
        return [pid]

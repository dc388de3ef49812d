"""`RecordingEnforcer`: what every real backend shares, the record of original affinity.

The state file holds each process's original affinity (and cgroup), recorded
the first time COD touches it, so it is restored on release, on close and
after a crash (``cleanup_stale``).  A backend adds how it confines
(``_enforce``): `cod.rm.enforce.affinity.AffinityEnforcer` pins threads,
`cod.rm.enforce.cpuset` moves processes into a cgroup per task.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence

from cod.facts import procfs
from cod.protocol.names import name_problem

from . import cgroupfs
from .errors import EnforceError
from .leftovers import Leftovers
from .movequeue import BackgroundMover, MoveJob
from .pagemove import MoveReport, PageMover
from .pinning import set_thread_affinity, thread_placements
from .state import ProcRecord, StateStore, TaskRecord
from .statecheck import CgroupScope

log = logging.getLogger("cod.rm.enforce")
FORMER_MASKS = 8  # a task's earlier masks remembered: enough for the changes a fork can straddle


def check_task_name(task: str) -> str:
    """A task name the enforcer can record: any name cod.protocol.names accepts."""
    problem = name_problem(task)
    if problem is not None:
        raise EnforceError(f"task name {task!r} {problem}")
    return task


class SteadyMechanism:
    """A backend whose mechanism cannot go away under it (unlike sched_ext's scheduler)."""

    def check(self) -> bool:
        return False

    def degraded(self) -> str | None:
        return None


class RecordingEnforcer(SteadyMechanism):
    """Shared part of the real backends: the record of original affinity."""

    name = "abstract"

    def __init__(self, state_dir: str, proc: str = procfs.PROC, memory_migrate: bool = False,
                 cgroups: CgroupScope | None = None) -> None:
        self.proc = proc
        self.memory_migrate = memory_migrate
        self.mover = PageMover(proc=proc)
        self.background = BackgroundMover(self.mover)  # moves run on its thread, off apply()'s
        self.moves: dict[str, list[MoveReport]] = {}  # the last finished page moves of each task
        self._moved: dict[str, tuple[tuple[int, ...], set[int]]] = {}  # task -> (nodes, pids moved there)
        self._inflight: dict[str, MoveJob] = {}  # task -> its move queued or under way
        # Held by apply()/release() and by a finished move's bookkeeping (on the mover's thread).
        self._lock = threading.RLock()
        self.cgroups = cgroups  # where this enforcer's cgroups are (or a crashed cpuset run's were)
        self.state = StateStore(state_dir, cgroups)
        self.cpus: dict[str, tuple[int, ...]] = {}
        self.mems: dict[str, tuple[int, ...]] = {}
        # the masks each task had before its current one, newest last (decision 18)
        self.former: dict[str, list[tuple[int, ...]]] = {}
        self.leftovers = Leftovers()  # task cgroups removed once their exiting tasks are gone

    # ---- recording -------------------------------------------------------
    def _record(self, task: str, pid: int) -> ProcRecord | None:
        """Record ``pid``'s original state once; None when it does not exist."""
        rec = self.state.tasks.setdefault(task, TaskRecord())
        old = rec.procs.get(pid)
        if old is not None and procfs.same_process(pid, old.start, self.proc):
            return old
        taken = self._take_over(task, pid)
        if taken is not None:
            rec.procs[pid] = taken
            return taken
        try:
            st = procfs.read_stat(pid, proc=self.proc)
            affinity = tuple(sorted(os.sched_getaffinity(pid)))
            threads: dict[int, tuple[int, ...]] = {}
            for tid in procfs.thread_ids(pid, self.proc):
                try:
                    mask = tuple(sorted(os.sched_getaffinity(tid)))
                except ProcessLookupError:
                    continue
                if mask != affinity:
                    threads[tid] = mask
        except (FileNotFoundError, ProcessLookupError):
            rec.procs.pop(pid, None)
            return None
        new = ProcRecord(start=st.start_time, affinity=affinity, threads=threads,
                         cpuset=self._original_cgroup(pid))
        rec.procs[pid] = new
        return new

    def _take_over(self, task: str, pid: int) -> ProcRecord | None:
        """``pid``'s record under another task, moved out of it (None when there is none).

        One process has one original: a busy process the RM confined (``other.PID``) that
        joins an elastic group keeps the mask it had before COD touched it, and releasing the
        confinement afterwards no longer restores that mask over the group's (issue 30)."""
        for name, other in self.state.tasks.items():
            if name == task:
                continue
            prec = other.procs.get(pid) or other.children.get(pid)
            if prec is None or not procfs.same_process(pid, prec.start, self.proc):
                continue
            other.procs.pop(pid, None)
            other.children.pop(pid, None)
            log.info("pid %d moves from task %s to task %s (its original affinity %s goes with it)",
                     pid, name, task, procfs.format_cpu_list(prec.affinity))
            return prec
        return None

    def _original_cgroup(self, pid: int) -> str | None:
        return None  # cpuset backends say where the process was

    # ---- memory follows the cores ------------------------------------------
    def _pids_to_move(self, task: str, pids: Sequence[int], mems: tuple[int, ...]) -> list[int]:
        """The pids whose pages have not been moved to ``mems`` yet (all of them when the task's
        nodes changed); [] when memory migration is off."""
        if not self.memory_migrate:
            return []
        nodes, done = self._moved.get(task, ((), set()))
        if nodes != mems:
            done = set()
        return [p for p in pids if p not in done]

    def _move_memory(self, task: str, pids: Sequence[int], mems: tuple[int, ...]) -> bool:
        """Have the pages of ``pids`` not moved to ``mems`` yet moved there, in the background
        (`BackgroundMover`, batches of bounded time); True while a move of the task is queued or
        under way.  A move already under way for the same nodes and pids goes on; any other is
        superseded (or cancelled when nothing is left to move)."""
        want = self._pids_to_move(task, pids, mems)
        old = self._inflight.get(task)
        if old is not None and old.nodes == mems and set(want) <= set(old.pids) <= set(pids):
            return True
        if not want:
            self._cancel_move(task)
            return False
        self._inflight[task] = self.background.submit(MoveJob(task, tuple(want), mems, self._moves_done))
        return True

    def _moves_done(self, job: MoveJob, reports: list[MoveReport]) -> None:
        """A move ran to its end (on the mover's thread): record it, and let the backend finish
        (`_memory_moved`) if the task still wants these nodes and no newer move replaced it."""
        with self._lock:
            if self._inflight.get(job.task) is not job:
                return  # superseded or released meanwhile
            del self._inflight[job.task]
            if self.mems.get(job.task) != job.nodes:
                return  # an apply() that failed half-way changed them: the next one moves again
            nodes, done = self._moved.get(job.task, ((), set()))
            done = set(done) if nodes == job.nodes else set()
            self._moved[job.task] = (job.nodes, done | {r.pid for r in reports})
            self.moves[job.task] = reports
            self._memory_moved(job.task, job.nodes)

    def _memory_moved(self, task: str, mems: tuple[int, ...]) -> None:
        """The task's pages are on ``mems`` (under the lock, on the mover's thread)."""

    def _cancel_move(self, task: str) -> None:
        if self._inflight.pop(task, None) is not None:
            self.background.cancel(task)

    def moving(self, task: str) -> bool:
        """A move of ``task``'s pages is queued or under way."""
        return task in self._inflight

    def wait_moves(self, timeout: float | None = None) -> bool:
        """Wait until no page move is queued or under way (tests, tools); False on timeout."""
        return self.background.wait(None, timeout)

    def _restore_affinity(self, pid: int, rec: ProcRecord) -> bool:
        """Give ``pid``'s threads back their recorded masks; False if it is gone."""
        if not procfs.same_process(pid, rec.start, self.proc):
            return False
        for tid in procfs.thread_ids(pid, self.proc):
            mask = rec.threads.get(tid, rec.affinity)
            try:
                set_thread_affinity(tid, mask, self.proc)
            except EnforceError as err:
                # The original mask may no longer be possible (CPU offlined): say so, go on.
                log.warning("could not restore affinity of thread %d of pid %d: %s", tid, pid, err)
        return True

    def _restore_proc(self, pid: int, rec: ProcRecord) -> bool:
        """Back to the recorded cgroup (if a cpuset run moved it) and affinity."""
        if not procfs.same_process(pid, rec.start, self.proc):
            return False
        if rec.cpuset and os.path.isdir(rec.cpuset):
            for ident in procfs.thread_ids(pid, self.proc):
                try:
                    cgroupfs.move_into(rec.cpuset, ident)
                except OSError as err:
                    log.warning("could not move %d back to %s: %s", ident, rec.cpuset, err.strerror)
        return self._restore_affinity(pid, rec)

    def _remove_task_cgroup(self, task: str, rec: TaskRecord) -> list[str]:
        """Remove the task's cgroup (``MOUNT/PARENT/TASK``), evicting leftovers to MOUNT."""
        if not rec.cgroup:
            return []
        done = [f"removed cgroup {rec.cgroup}"] if self._remove_cgroup(rec.cgroup) else []
        self._remove_parent_if_unused(os.path.dirname(rec.cgroup))
        return done

    def _remove_parent_if_unused(self, parent: str) -> None:
        # A crashed cpuset run's parent, cleaned by a run that uses no cgroups.
        try:
            if not any(os.path.isdir(os.path.join(parent, n)) for n in os.listdir(parent)):
                os.rmdir(parent)
        except OSError:
            pass

    def _remove_cgroup(self, path: str) -> bool:
        """True if removed now; one still busy with an exiting task is removed later."""
        return self.leftovers.remove(path, evict_to=os.path.dirname(os.path.dirname(path)))

    # ---- Enforcer interface ------------------------------------------------
    def apply(self, task: str, pids: Sequence[int], cpus: Sequence[int], mems: Sequence[int]) -> list[int]:
        """Confine ``task`` (exactly these pids) to ``cpus``/``mems``; returns the live pids.

        Pids the task held before but not now get their original affinity back.
        Pids that exited are skipped (and forgotten).  Returns once the CPUs are enforced: the
        pages follow in the background (`moving`, `wait_moves`)."""
        with self._lock:
            return self._apply(task, pids, cpus, mems)

    def _apply(self, task: str, pids: Sequence[int], cpus: Sequence[int], mems: Sequence[int]) -> list[int]:
        check_task_name(task)
        self.leftovers.retry()
        try:
            cpus = procfs.check_ids("cpus", cpus)
            mems = procfs.check_ids("mems", mems)
        except ValueError as err:
            raise EnforceError(f"task {task}: {err}") from err
        rec = self.state.tasks.setdefault(task, TaskRecord())
        before = {p: r.start for p, r in rec.procs.items()}
        for old_pid in [p for p in rec.procs if p not in set(pids)]:
            self._restore_proc(old_pid, rec.procs.pop(old_pid))
        live = [p for p in pids if self._record(task, p) is not None]
        if {p: r.start for p, r in rec.procs.items()} != before or task not in self.cpus:
            self.state.save()  # before touching anything: a crash from here on is undoable
        # Threads' own placements are read before anything changes (a v1 cpuset's new CPUs
        # may reset the masks of the threads in it); decision 14 of docs/design-enforce.md.
        # The first pin gives every thread the task's CPUs.
        given_before = self.cpus.get(task)
        former = self.former.setdefault(task, [])
        placements = {p: thread_placements(p, given_before, cpus, self.proc, former) for p in live}
        if given_before is not None and given_before != cpus:
            former[:] = [m for m in former if m != given_before][-(FORMER_MASKS - 1):] + [given_before]
        self.cpus[task], self.mems[task] = cpus, mems
        applied = self._enforce(task, live, cpus, mems, placements)
        gone = [p for p in live if p not in applied]
        for p in gone:
            rec.procs.pop(p, None)
        if gone:
            self.state.save()
        return applied

    def _enforce(self, task: str, pids: list[int], cpus: tuple[int, ...], mems: tuple[int, ...],
                 placements: Mapping[int, Mapping[int, tuple[int, ...]]]) -> list[int]:
        """Confine ``pids`` to ``cpus``/``mems``; ``placements[pid][tid]``: a thread's own placement."""
        raise NotImplementedError

    def add_thread(self, task: str, tid: int) -> bool:
        """Pin a thread (or child) that appeared in ``task`` after apply(); False if gone."""
        if task not in self.cpus:
            raise EnforceError(f"task {task!r} has not been applied")
        pinned = self._add_thread(task, tid)
        if pinned:
            self._record_child(task, tid)
        return pinned

    def follow_thread(self, task: str, tid: int) -> bool:
        """Give a thread born inside ``task`` the task's CPUs, unrecorded; False if gone."""
        cpus = self.cpus.get(task)
        if cpus is None:
            raise EnforceError(f"task {task!r} has not been applied")
        return set_thread_affinity(tid, cpus, self.proc)

    def _record_child(self, task: str, pid: int) -> None:
        """A new process (not a thread) of ``task``: remember what to give it back.

        It was forked with the task's CPUs; its original is that of the task's
        process, so that releasing the task frees its children too."""
        rec = self.state.tasks.get(task)
        if rec is None or not rec.procs or pid in rec.procs or pid in rec.children:
            return
        try:
            if int(procfs.status_field(pid, "Tgid", proc=self.proc)) != pid:
                return  # a thread: restored with its process
            start = procfs.read_stat(pid, proc=self.proc).start_time
        except (OSError, KeyError, ValueError):
            return  # already gone
        parent = next(iter(rec.procs.values()))
        rec.children[pid] = ProcRecord(start=start, affinity=parent.affinity, cpuset=parent.cpuset)
        self.state.save()

    def _add_thread(self, task: str, tid: int) -> bool:
        return self._place_new_thread(task, tid)

    def _place_new_thread(self, task: str, tid: int) -> bool:
        """Give a new thread the task's CPUs, unless its mask already lies inside them (decision
        14): then it is left alone, with no write at all, because the program may be pinning it
        at this very moment (CSCS pins each scan thread as it starts; a write of the whole task
        mask after reading the inherited one undid that pin).  False when the thread is gone."""
        cpus = self.cpus[task]
        try:
            mask = set(os.sched_getaffinity(tid))
            # a mask the task had before is the RM's, inherited before a change: it follows (decision 18)
            if mask <= set(cpus) and not any(mask == set(m) for m in self.former.get(task, ())):
                return True
        except ProcessLookupError:
            return False
        except OSError:
            pass  # not readable: set it
        return set_thread_affinity(tid, cpus, self.proc)

    def pin_threads(self, task: str, targets: Mapping[int, Sequence[int]]) -> list[int]:
        """Narrow threads of ``task`` to subsets of its CPUs; the tids pinned (gone ones are skipped).

        Inside a cpuset the kernel accepts any subset; release() and the next
        apply() give every thread the recorded or the whole mask back."""
        held = self.cpus.get(task)
        if held is None:
            raise EnforceError(f"task {task!r} has not been applied")
        pinned = []
        for tid, cpus in targets.items():
            outside = sorted(set(cpus) - set(held))
            if not cpus or outside:
                raise EnforceError(f"task {task}: thread {tid} may only be narrowed to its CPUs "
                                   f"{procfs.format_cpu_list(held)}, not {procfs.format_cpu_list(sorted(cpus))}")
            if set_thread_affinity(tid, tuple(sorted(cpus)), self.proc):
                pinned.append(tid)
        return pinned

    def forget_pid(self, task: str, pid: int) -> None:
        """An exit event: drop ``pid``'s record without touching anything."""
        rec = self.state.tasks.get(task)
        if rec is not None and (rec.procs.pop(pid, None) or rec.children.pop(pid, None)) is not None:
            self.state.save()

    def release(self, task: str) -> None:
        """Undo everything done to ``task`` (its page move is cancelled); unknown tasks are
        ignored (idempotent)."""
        with self._lock:
            self.leftovers.retry()
            self._cancel_move(task)
            rec = self.state.tasks.pop(task, None)
            self.cpus.pop(task, None)
            self.mems.pop(task, None)
            self.former.pop(task, None)
            self._moved.pop(task, None)
            if rec is None:
                return
            for pid, prec in [*rec.procs.items(), *rec.children.items()]:
                self._restore_proc(pid, prec)
            self._remove_task_cgroup(task, rec)
            self.state.save()

    def tasks(self) -> dict[str, list[int]]:
        return {t: sorted(r.procs) for t, r in self.state.tasks.items()}

    def cleanup_stale(self) -> list[str]:
        """Undo what a previous (crashed) owner of the state directory left; says what it did."""
        done: list[str] = []
        for task, rec in sorted(self.state.stale.items()):
            for pid, prec in sorted([*rec.procs.items(), *rec.children.items()]):
                if self._restore_stale(task, rec, pid, prec):
                    done.append(f"restored pid {pid} of task {task} to CPUs {procfs.format_cpu_list(prec.affinity)}")
            done.extend(self._remove_task_cgroup(task, rec))
        self.state.stale.clear()
        done.extend(self._cleanup_extra())
        self.state.save()
        for line in done:
            log.info("cleanup after previous run: %s", line)
        return done

    def _restore_stale(self, task: str, rec: TaskRecord, pid: int, prec: ProcRecord) -> bool:
        """Undo what a crashed run did to ``pid``, no more: a task without a cgroup (an affinity
        run, or a cpuset run that crashed before it made one) moved nobody, so only the mask is
        given back; a task with one gives back a process still in it (`_in_task_cgroup`).  Both
        when its pid and start time still match."""
        if rec.cgroup is None:
            return self._restore_affinity(pid, prec)
        return self._in_task_cgroup(task, rec, pid) and self._restore_proc(pid, prec)

    def _in_task_cgroup(self, task: str, rec: TaskRecord, pid: int) -> bool:
        """Only the daemon moves processes into a task's cgroup, so a process found elsewhere is
        not the daemon's to move back (it was never moved in, or someone moved it out since)."""
        assert self.cgroups is not None and rec.cgroup is not None  # else refused by statecheck
        rel = cgroupfs.process_cgroup(pid, self.cgroups.version, self.proc)
        if rel is not None and os.path.join(self.cgroups.mount, rel.lstrip("/")).rstrip("/") == rec.cgroup:
            return True
        if rel is not None:
            log.info("cleanup after previous run: pid %d of task %s is not in the task's cgroup %s: left as it is",
                     pid, task, rec.cgroup)
        return False

    def _cleanup_extra(self) -> list[str]:
        return []

    def close(self) -> None:
        """Clean exit: stop the page mover (cancels its moves, waits a bounded time), release
        every task, wait a bounded time for cgroups still holding exiting tasks, then drop the
        state file and the lock.  A task that could not be released does not keep the others
        from it: its error is raised at the end (all of them, in one EnforceError)."""
        self.background.close()
        errors: list[EnforceError] = []
        for task in list(self.state.tasks):
            try:
                self.release(task)
            except EnforceError as err:
                errors.append(err)
        self.leftovers.drain()
        self._close_backend()
        if not self.state.stale:
            try:
                os.unlink(self.state.path)
            except FileNotFoundError:
                pass
        self.state.close()
        if errors:
            raise EnforceError("; ".join(map(str, errors))) from errors[0]

    def _close_backend(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

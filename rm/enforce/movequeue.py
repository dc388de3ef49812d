"""Page moves off the caller's thread: one worker thread, one request per task.

Moving a task's pages takes seconds to minutes for gigabytes (`PageMover` keeps each call short
for the task, not the whole move short for the caller).  The daemon enforces on its event loop,
where one client's move must not make every other client wait, so `BackgroundMover` runs the
moves on a thread of its own.  Requests are keyed by task: a newer request for a task replaces
its waiting one and cancels its running one (which stops between two ``move_pages`` calls; what
it moved stays moved), `cancel` drops a task's move, `close` stops the worker within a bound.
When a request has run to its end, its ``done`` callback gets the reports, on the worker.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from cod.facts import procfs

from .errors import EnforceError
from .pagemove import MoveReport, PageMover

log = logging.getLogger("cod.rm.enforce")

CLOSE_WAIT_S = 5.0  # how long close() waits for the move under way to stop (it stops between calls)


@dataclass(eq=False)
class MoveJob:
    """Move the pages of ``pids`` (of ``task``) onto ``nodes``; ``done(job, reports)`` when it ran
    to its end (not when cancelled)."""

    task: str
    pids: tuple[int, ...]
    nodes: tuple[int, ...]
    done: Callable[["MoveJob", list[MoveReport]], None]
    stop: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        self.stop.set()

    @property
    def cancelled(self) -> bool:
        return self.stop.is_set()


class BackgroundMover:
    """Runs `MoveJob`\\ s one after another on one worker thread (started with the first job)."""

    def __init__(self, mover: PageMover) -> None:
        self.mover = mover
        self.before_pid: Callable[[MoveJob, int], None] | None = None  # tests only: on the worker, before each pid
        self._cond = threading.Condition()
        self._pending: dict[str, MoveJob] = {}  # in the order they came
        self._running: MoveJob | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    def submit(self, job: MoveJob) -> MoveJob:
        """Queue ``job``; it supersedes the task's waiting job and cancels its running one."""
        with self._cond:
            if self._closed:
                raise EnforceError("the page mover is closed")
            old = self._pending.pop(job.task, None)
            if old is not None:
                old.cancel()
            if self._running is not None and self._running.task == job.task:
                self._running.cancel()
            self._pending[job.task] = job
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="cod-pagemove", daemon=True)
                self._thread.start()
            self._cond.notify_all()
        return job

    def cancel(self, task: str) -> None:
        """Drop ``task``'s waiting job and stop its running one (between two calls); no wait."""
        with self._cond:
            old = self._pending.pop(task, None)
            if old is not None:
                old.cancel()
            if self._running is not None and self._running.task == task:
                self._running.cancel()
            self._cond.notify_all()

    def busy(self, task: str | None = None) -> bool:
        """A job (of ``task``, or any) is waiting or running."""
        running = self._running
        if task is None:
            return bool(self._pending) or running is not None
        return task in self._pending or (running is not None and running.task == task)

    def wait(self, task: str | None = None, timeout: float | None = None) -> bool:
        """Wait until no job (of ``task``, or any) waits or runs; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self.busy(task), timeout)

    def close(self, timeout: float = CLOSE_WAIT_S) -> bool:
        """Cancel every job and stop the worker, waiting at most ``timeout``; False if it is
        still in a call then (it is a daemon thread: it does not hold the process up)."""
        with self._cond:
            self._closed = True
            for job in self._pending.values():
                job.cancel()
            self._pending.clear()
            if self._running is not None:
                self._running.cancel()
            self._cond.notify_all()
            thread = self._thread
        if thread is None:
            return True
        thread.join(timeout)
        if thread.is_alive():
            log.warning("the page mover did not stop within %.1f s; left it to end with the process", timeout)
            return False
        return True

    def _work(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closed)
                if self._closed:
                    return
                task = next(iter(self._pending))
                job = self._running = self._pending.pop(task)
            try:
                reports = self._run(job)
                if not job.cancelled:
                    job.done(job, reports)
            except Exception:  # a bug must not end the worker: the next moves still run
                log.exception("finishing the page move of task %s failed", job.task)
            finally:
                with self._cond:
                    self._running = None
                    self._cond.notify_all()

    def _run(self, job: MoveJob) -> list[MoveReport]:
        reports = []
        for pid in job.pids:
            if self.before_pid is not None:
                self.before_pid(job, pid)
            if job.cancelled:
                break
            try:
                report = self.mover.move(pid, job.nodes, job.stop.is_set)
            except EnforceError as err:
                log.warning("task %s: pages of pid %d stay where they are: %s", job.task, pid, err)
                continue
            except Exception:  # a bug: said, and the other pids still move
                log.exception("task %s: moving the pages of pid %d failed", job.task, pid)
                continue
            reports.append(report)
            if report.found:
                log.info("task %s: pages to nodes %s: %s", job.task, procfs.format_cpu_list(job.nodes),
                         report.describe())
        return reports

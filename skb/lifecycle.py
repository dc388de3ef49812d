"""One engine process's life, for both drivers: start it without privileges, stop it, restart it.

:class:`EngineProcess` owns everything about the process that is not the
conversation (that is :class:`.session.Session`): the private directory,
the command through :mod:`.lockdown`, the relay of its standard error, the
direct socket's permissions after every start, killing and reaping it, and
which journal entries a restart replays.  The drivers (:mod:`.engine`,
:mod:`.async_engine`) only move the bytes, each its own way.

Started by root, the engine runs as ``config.user`` and reaches its files,
stored procedures and private directory through descriptors opened before
the drop (``/proc/self/fd/N``), so that no directory on the way (a 0700
temporary directory, /root) has to be opened to it.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

from cod.facts import procfs

from . import codec, lockdown, native_libs
from .codec import Op
from .errors import SKBError
from .session import (PROLOG_DIR, STARTUP_MAX_WAIT_S, STARTUP_PROGRESS_CPU_S, STARTUP_TIMEOUT_S, EngineConfig,
                      Session)
from .stderr_log import StderrLog

log = logging.getLogger("cod.skb")

LOCKDOWN = Path(__file__).resolve().parent / "lockdown.py"
# The native helpers, each used when built; a missing one is the daemon's to report, once, at
# its start (native_libs.startup_warning), not each engine's.
NATIVE_DIR = native_libs.NATIVE_DIR
NOEXEC_LIBRARY = native_libs.NOEXEC_LIBRARY
FRAMES_LIBRARY = native_libs.FRAMES_LIBRARY
FIRST_REACH_FD = lockdown.FIRST_REACH_FD
KILL_WAIT_S = 5.0

_warned: set[str] = set()


def _warn_once(key: str, message: str, *args: object) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


def cpu_seconds(pid: int | None) -> float:
    """CPU time (user + system) a process has used so far, 0 if unknown."""
    used = procfs.cpu_seconds(pid) if pid is not None else None
    return used if used is not None else 0.0


def startup_verdict(waited_s: float, cpu_used_s: float) -> str | None:
    """After ``waited_s`` without a ready line, the last STARTUP_TIMEOUT_S of which the engine used
    ``cpu_used_s`` of CPU: None to wait again (it is starting, slowly), else why it did not start."""
    if cpu_used_s < STARTUP_PROGRESS_CPU_S:
        return (f"no ready line in {waited_s:g} s, and it used {cpu_used_s:.2f} s of CPU in the last "
                f"{STARTUP_TIMEOUT_S:g} s (stuck)")
    if waited_s >= STARTUP_MAX_WAIT_S:
        return f"no ready line in {waited_s:g} s, though it kept using CPU (the machine is overloaded)"
    return None


def where_it_waits(pid: int | None) -> str:
    """What a process that does not start is doing, for the error: its name, and each thread's
    state and kernel wait channel, e.g. ``swipl: S in pipe_read``."""
    if pid is None:
        return "no process"
    name = procfs.comm(pid)
    waits: dict[str, int] = {}
    for tid in procfs.thread_ids(pid):
        state, wchan = procfs.thread_state(pid, tid), procfs.thread_wait_channel(pid, tid)
        if state is None or wchan is None:
            continue  # the thread exited meanwhile
        key = f"{state} in {wchan}" if wchan else state
        waits[key] = waits.get(key, 0) + 1
    if name is None or not waits:
        return f"process {pid} is gone"
    return f"{name}: " + ", ".join(k if n == 1 else f"{n} threads {k}" for k, n in waits.items())


class StartupWatch:
    """The wait for a starting engine's ready line, one STARTUP_TIMEOUT_S period at a time (both
    drivers wait so): after each period without it, ``period_over`` says whether to wait again."""

    def __init__(self, pid: int | None) -> None:
        self.pid = pid
        self.waited_s = 0.0
        self._cpu = cpu_seconds(pid)

    def period_over(self) -> str:
        """"" to wait another period (it used CPU: starting, slowly), else why it did not start."""
        self.waited_s += STARTUP_TIMEOUT_S
        cpu = cpu_seconds(self.pid)
        why = startup_verdict(self.waited_s, cpu - self._cpu) or ""
        self._cpu = cpu
        return f"{why}; {where_it_waits(self.pid)}" if why else why


def engine_identity(user: str) -> tuple[int, int]:
    """(uid, gid) the engine runs as when started by root: ``user``, else nobody."""
    try:
        return lockdown.resolve_user(user, fallback=False)
    except KeyError:
        _warn_once(f"user:{user}", "SKB engine user %r does not exist (make setup creates it as root); "
                   "the engine runs as %s", user, lockdown.FALLBACK_USER)
        return lockdown.resolve_user(lockdown.FALLBACK_USER)
    except lockdown.LockdownError as err:
        raise SKBError("engine", str(err)) from None


class EngineProcess:
    """The engine's process and what outlives it: its private directory and the restart count."""

    def __init__(self, config: EngineConfig, session: Session) -> None:
        self.config = config
        self.session = session
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.root = os.geteuid() == 0
        self._identity = engine_identity(config.user) if self.root else (os.getuid(), os.getgid())
        self._own_dir = config.private_dir is None
        self.private_dir = self._make_private_dir()
        self._reach = [str(PROLOG_DIR), self.private_dir]
        if config.load_library and config.library_dir is not None:
            self._reach.append(str(Path(config.library_dir).resolve()))
        elif config.load_library:
            from .session import library_dir

            self._reach.append(str(library_dir().resolve()))
        if NOEXEC_LIBRARY.exists() or FRAMES_LIBRARY.exists():
            self._reach.append(str(NATIVE_DIR))

    # ---- where the engine finds things ---------------------------------------
    def engine_path(self, path: str | Path) -> str:
        """``path`` as the engine reaches it: through an inherited descriptor when it lies in one of
        the engine's directories (which also keeps the direct socket's bind path short)."""
        text = os.path.abspath(str(path))
        for i, d in enumerate(self._reach):
            if text == d or text.startswith(d.rstrip("/") + "/"):
                return f"/proc/self/fd/{FIRST_REACH_FD + i}" + text[len(d):]
        return text

    def _make_private_dir(self) -> str:
        if self.config.private_dir is None:
            path = tempfile.mkdtemp(prefix="cod-skb-")
        else:
            path = os.path.abspath(self.config.private_dir)
            if os.path.lexists(path) and not (os.path.isdir(path) and not os.path.islink(path)):
                os.unlink(path)  # a socket or link left where the directory goes
            os.makedirs(path, mode=0o700, exist_ok=True)
        # Clients reach the direct socket in it; nobody else needs to.
        os.chmod(path, 0o755 if self.config.direct_socket else 0o700)
        if self.root:
            os.chown(path, *self._identity)
        return path

    def command(self) -> list[str]:
        cfg = self.config
        wrapper = [sys.executable, "-I", "-S", str(LOCKDOWN), "--user", str(self._identity[0]),
                   "--private", self.private_dir]
        for d in self._reach:
            wrapper += ["--reach", d]
        if cfg.memory_limit_bytes:
            wrapper += ["--memory", str(cfg.memory_limit_bytes)]
        if NOEXEC_LIBRARY.exists():
            wrapper += ["--env", f"LD_PRELOAD={self.engine_path(NOEXEC_LIBRARY)}"]
        # Empty when not built: the engine then reads its frames in Prolog, without looking for the
        # library elsewhere (cod_frames.pl's ../native is for a swipl run in the checkout).
        frames = self.engine_path(FRAMES_LIBRARY) if FRAMES_LIBRARY.exists() else ""
        wrapper += ["--env", f"COD_FRAMES_LIBRARY={frames}"]
        tmp = self.engine_path(self.private_dir)
        wrapper += ["--env", f"TMPDIR={tmp}", "--env", f"TMP={tmp}"]
        if not cfg.landlock:
            wrapper.append("--no-landlock")
        engine = cfg.command()
        if cfg.direct_socket:
            i = engine.index("--direct-socket")
            engine[i + 1] = self.engine_path(cfg.direct_socket)
        return wrapper + ["--"] + [self.engine_path(a) if a.startswith("/") else a for a in engine]

    def startup_ops(self) -> list[Op]:
        return [codec.load_library(self.engine_path(p)) for p in self.config.library_files()]

    # ---- the process -----------------------------------------------------------
    def spawn(self) -> subprocess.Popen[bytes]:
        """Start a new engine process (its ready line is for the driver to read)."""
        if self.config.direct_socket and os.path.dirname(os.path.abspath(self.config.direct_socket)) \
                != self.private_dir:
            raise SKBError("invalid", f"the direct socket {self.config.direct_socket} must be in the engine's "
                                      f"private directory {self.private_dir}")
        self.session.reset()
        try:
            proc = subprocess.Popen(self.command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE,
                                    start_new_session=True)  # a Ctrl-C for the owner is not for the engine
        except OSError as err:
            raise SKBError("engine", f"cannot start SWI-Prolog ({self.config.swipl}): {err}; "
                                     "install swi-prolog-nox") from err
        assert proc.stderr is not None
        StderrLog(log, proc.pid).relay(proc.stderr)
        proc.stderr = None  # the relay thread owns it
        self.proc = proc
        return proc

    def started(self, line: bytes | None, why: str = "") -> None:
        """The engine's first line arrived (None: none came, for ``why``): it is ready, or it is
        killed and this raises."""
        if not Session.ready(line):
            code = None
            if line is None and not why and self.proc is not None:
                try:  # its output ended: it is exiting (a failure path; a short blocking wait)
                    code = self.proc.wait(timeout=2.0)
                except subprocess.TimeoutExpired:
                    pass
            self.kill()
            if line is None:
                why = why or (f"it exited with status {code}" if code is not None else "no ready line")
            raise SKBError("engine", f"SWI-Prolog did not start: {why if line is None else repr(line)}")
        if self.config.direct_socket and self.config.socket_permissions is not None:
            self._set_socket_permissions(self.config.direct_socket, self.config.socket_permissions)

    def _set_socket_permissions(self, path: str, apply: Callable[[str], None]) -> None:
        """Give the socket the engine made its mode, owner and group: through a descriptor on the
        socket itself, since its directory belongs to the engine's uid (a link put there in its
        place must not make root change another file)."""
        try:
            fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as err:
            self.kill()
            raise SKBError("engine", f"the engine's direct socket {path}: {err.strerror}") from None
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                self.kill()
                raise SKBError("engine", f"{path} is not the engine's socket")
            apply(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)

    def kill(self) -> None:
        """Kill the process group and reap it; close the pipes the driver did not take over."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                proc.wait(KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                log.error("SKB engine %d did not die within %g s of SIGKILL", proc.pid, KILL_WAIT_S)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:  # a request still buffered for a process that is gone
                    pass

    def restart_ops(self, why: str) -> list[Op]:
        """Kill the engine for a restart; the journal entries the new one must replay."""
        self.kill()
        self.restarts += 1
        ops = self.session.replay_ops()
        log.warning("SKB engine restart (%s); replaying %d journal entries", why, len(ops))
        return ops

    @staticmethod
    def replay_failed(op: Op, err: BaseException) -> None:
        log.error("SKB replay of %s failed: %s", op.text[:80], err)  # each op succeeded before

    def close(self) -> None:
        """The process is gone for good: remove the direct socket and the private directory."""
        self.kill()
        direct = self.config.direct_socket
        if direct:
            try:
                os.unlink(direct)
            except FileNotFoundError:
                pass
        if self._own_dir:
            shutil.rmtree(self.private_dir, ignore_errors=True)
        else:
            try:
                os.rmdir(self.private_dir)
            except OSError:
                pass  # something else is in it: leave it

"""Whose turn it is to read the daemon's socket: the lead token and the epoll set its holder waits in.

One thread at a time reads the socket: the holder of the lead token (`ReadTurns`).  A caller
takes the token when nobody holds it, before it sends its request (so that a reply that comes
before the caller waits for it is not read by the reader thread and handed over), and reads until
its own reply comes (:mod:`.reading`); callers that find it taken wait on their own `_Waiter`, and the holder that is
done passes the token to one of them (`_Waiter.promote`), or, when no call waits, back to the
reader thread, which reads only while no caller does.

The socket sits in one epoll set with EPOLLONESHOT: a thread whose wait returns the socket's event
has disarmed it for everyone until it re-arms it (`rearm`, after its read).  Linux hands an
epoll event to the thread that began waiting last, so while a caller waits for its reply the
event goes to it and the reader thread, which has waited longer, sleeps on: a call through the
daemon wakes one thread, the caller, instead of the reader and then the caller.  Who may read
is decided by the token, not by which thread the kernel woke: a thread woken without the token
re-arms and steps aside.  A wake-up descriptor (an eventfd in the same set) rouses the waiters
when the client closes or a caller finds the connection broken.
"""

from __future__ import annotations

import os
import select
import socket
import threading

from .parts import _Waiter

_SOCKET_EVENTS = select.EPOLLIN | select.EPOLLONESHOT


class ReadTurns:
    """The lead token of one client's socket (guarded by the client's pending lock) and its epoll set."""

    def __init__(self, pending: dict[int, _Waiter], pending_lock: threading.Lock) -> None:
        self._pending = pending
        self._lock = pending_lock
        self._leading = False                # someone holds the token
        self._reader_wants = False           # the reader thread waits in reader_wait() for it
        self._reader_turn = threading.Lock()
        self._reader_turn.acquire()
        self._epoll = select.epoll()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._epoll.register(self._wake_fd, select.EPOLLIN)
        self._fd = -1

    # ---- the token ----------------------------------------------------------------------------
    def take(self, rid: int, waiter: _Waiter) -> bool:
        """A caller's bid, before it sends and again after: True when it holds the token now (then
        it is marked promoted, and must `pass_on` once it has its reply or gives up)."""
        with self._lock:
            if waiter.promoted:
                return True
            if self._leading or rid not in self._pending:  # someone reads, or the reply is in already
                return False
            self._leading = waiter.promoted = True
            return True

    def reader_take(self) -> bool:
        """The reader thread's bid: True when it holds the token; else it is next once no call waits."""
        with self._lock:
            if self._leading:
                self._reader_wants = True
                return False
            self._leading = True
            return True

    def reader_queue_if_busy(self) -> bool:
        """Before the reader thread waits in the epoll set: if a caller holds the token, queue for it
        instead, so that the caller stays the newest waiter (the one the kernel wakes).  True when
        the reader thread holds the token on return (handed over once no call waits)."""
        with self._lock:
            if not self._leading:
                return False
            self._reader_wants = True
        self._reader_turn.acquire()
        return True

    def reader_wait(self) -> None:
        """Block the reader thread until a holder passes the token to it (after reader_take() said no)."""
        self._reader_turn.acquire()

    def pass_on(self) -> None:
        """The holder is done: the token goes to a waiting call, else to the reader thread, else to nobody."""
        with self._lock:
            for waiter in self._pending.values():
                if not waiter.promoted:
                    waiter.promote()
                    return
            if self._reader_wants:
                self._reader_wants = False
                self._reader_turn.release()
                return
            self._leading = False

    def abandon(self, rid: int, waiter: _Waiter) -> None:
        """A call gives up (timeout, failed send): forget its waiter, and pass the token on if it held it."""
        with self._lock:
            self._pending.pop(rid, None)
            promoted = waiter.promoted
        if promoted:
            self.pass_on()

    # ---- the epoll set ------------------------------------------------------------------------
    def attach(self, sock: socket.socket) -> None:
        """Watch `sock` (a fresh connection) instead of the previous one."""
        fd = sock.fileno()
        if self._fd >= 0 and self._fd != fd:
            try:
                self._epoll.unregister(self._fd)
            except (OSError, ValueError):
                pass  # closed already, which removed it
        try:
            self._epoll.register(fd, _SOCKET_EVENTS)
        except FileExistsError:
            self._epoll.modify(fd, _SOCKET_EVENTS)
        self._fd = fd

    def wait_readable(self, timeout: float | None) -> bool:
        """Wait until the socket is readable or a wake-up comes; False when `timeout` (seconds) ran out."""
        try:
            return bool(self._epoll.poll(-1 if timeout is None else timeout))
        except (OSError, ValueError):
            return True  # closed under us: the caller finds out by reading

    def rearm(self) -> None:
        """Let the socket's next event through (after reading, or after stepping aside)."""
        try:
            self._epoll.modify(self._fd, _SOCKET_EVENTS)
        except (OSError, ValueError):
            pass  # the socket is closed; its successor is attached by the reconnection

    def wake(self) -> None:
        """Rouse every waiter (closing, or a broken connection for the reader thread to mend)."""
        if self._wake_fd < 0:
            return  # closed: its number may belong to another file by now
        try:
            os.eventfd_write(self._wake_fd, 1)
        except OSError:
            pass

    def drain_wake(self) -> None:
        if self._wake_fd < 0:
            return
        try:
            os.eventfd_read(self._wake_fd)
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        """Once the reader thread has ended (Client.close)."""
        fd, self._wake_fd = self._wake_fd, -1
        self._epoll.close()
        if fd >= 0:
            os.close(fd)

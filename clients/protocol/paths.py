"""Where the daemon listens unless told otherwise."""

from __future__ import annotations

import os


def default_socket_path() -> str:
    """`$COD_SOCKET`, else /run/cod/rm.sock for root, else `$XDG_RUNTIME_DIR/cod/rm.sock`."""
    env = os.environ.get("COD_SOCKET")
    if env:
        return env
    if os.geteuid() == 0:
        return "/run/cod/rm.sock"
    runtime = os.environ.get("XDG_RUNTIME_DIR") or f"/tmp/cod-{os.geteuid()}"
    return os.path.join(runtime, "cod", "rm.sock")


# What every client says when nothing answers on the socket: the Python client, the shell, the
# C client (clients/c/src/conn.c), its preload library and the Go NRI plugin use these words
# (tests/clients/cli/test_cli_exit_codes.py runs each and compares).
NO_DAEMON = "no COD daemon answers on {path}: {why}"


def no_daemon(path: str, why: str) -> str:
    """The one sentence for a socket nothing answers on, with the system's reason."""
    return NO_DAEMON.format(path=path, why=why)

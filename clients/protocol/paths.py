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

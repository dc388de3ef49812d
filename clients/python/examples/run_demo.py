#!/usr/bin/env python3
"""`make demo`: start the RM on this machine, run the Listing 1 example against it, stop the RM.

Prints the facts pushed, the deployment the SKB derived and the allocation
upcall received (from listing1.py), then the daemon's own log.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="cod-demo-") as tmp:
        sock = os.path.join(tmp, "rm.sock")
        log_path = os.path.join(tmp, "rm.log")
        with open(log_path, "wb") as log:
            rm = subprocess.Popen([sys.executable, "-m", "cod.cli.main", "rm", "--socket", sock],
                                  stderr=log, stdout=log)
            try:
                deadline = time.monotonic() + 30
                while True:
                    if rm.poll() is not None or time.monotonic() > deadline:
                        print(Path(log_path).read_text(), file=sys.stderr)
                        print("demo: the RM did not start", file=sys.stderr)
                        return 1
                    try:
                        with socket.socket(socket.AF_UNIX) as probe:
                            probe.connect(sock)
                        break
                    except OSError:
                        time.sleep(0.05)
                print(f"== RM started on {sock} (pid {rm.pid})", flush=True)
                rc = subprocess.call([sys.executable, str(HERE / "listing1.py"), "--socket", sock])
            finally:
                rm.send_signal(signal.SIGTERM)
                rm.wait(10)
        print("== RM log", flush=True)
        print(Path(log_path).read_text(), end="")
        print(f"== RM stopped (exit {rm.returncode}); socket removed: {not os.path.exists(sock)}")
        return rc


if __name__ == "__main__":
    sys.exit(main())

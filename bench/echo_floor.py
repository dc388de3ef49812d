"""The floor of a query's round trip: a framed echo between two processes over a Unix socket.

Three servers answer the same request frame the clients send:

* ``c``: ``clients/c/build/echo_server``, blocking ``read``/``write`` in C (the true floor);
* ``python``: the same blocking loop in Python (``recv_into``/``sendall``), one process;
* ``asyncio``: an asyncio server decoding frames (the floor the benches used before issue 31,
  kept as a labelled second column: it costs a loop wake-up and a decoder on top of the socket).

The Python side of the measurement is a blocking socket in this process; the C side is
``cod_bench echo``.  Each server runs in its own process, started and stopped by ``EchoServers``.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import time
from pathlib import Path

from cod.protocol.framing import FrameDecoder, encode

CDIR = Path(__file__).resolve().parents[1] / "clients" / "c"
C_ECHO = CDIR / "build" / "echo_server"
QUERY = "bench_fact(X)"
FRAME = encode({"jsonrpc": "2.0", "id": 1, "method": "execute_query", "params": {"goal": QUERY}})


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def summary_us(xs: list[float]) -> dict[str, float]:
    return {"n": len(xs), "median_us": round(statistics.median(xs) * 1e6, 1),
            "p99_us": round(pct(xs, 99) * 1e6, 1), "max_us": round(max(xs) * 1e6, 1)}


def _blocking_echo_server(path: str) -> None:
    """Blocking framed echo in Python: read the 4-byte length, the body, write the frame back."""
    ls = socket.socket(socket.AF_UNIX)
    ls.bind(path)
    ls.listen(8)
    buf = bytearray(65536)
    view = memoryview(buf)
    while True:
        s, _ = ls.accept()
        with s:
            while True:
                if not _recv_exact(s, view, 0, 4):
                    break
                n = int.from_bytes(buf[:4], "big")
                if n + 4 > len(buf) or not _recv_exact(s, view, 4, n):
                    break
                s.sendall(view[:n + 4])


def _recv_exact(s: socket.socket, view: memoryview, at: int, n: int) -> bool:
    end = at + n
    while at < end:
        k = s.recv_into(view[at:end])
        if k == 0:
            return False
        at += k
    return True


def _asyncio_echo_server(path: str) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        dec = FrameDecoder()
        while data := await reader.read(65536):
            for body in dec.feed(data):
                writer.write(len(body).to_bytes(4, "big") + body)
        writer.close()

    async def main() -> None:
        server = await asyncio.start_unix_server(handle, path=path)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


class EchoServers:
    """The three echo servers, each in its own process, for the length of a ``with`` block."""

    def __init__(self, tmp: Path) -> None:
        self.paths = {k: str(tmp / f"echo_{k}.sock") for k in ("c", "python", "asyncio")}
        self._procs: list = []

    def __enter__(self) -> "EchoServers":
        if not C_ECHO.exists():
            r = subprocess.run(["make", "-s", "-C", str(CDIR), "build/echo_server"])
            if r.returncode:
                raise SystemExit("building clients/c/build/echo_server failed (see above)")
        self._procs.append(subprocess.Popen([str(C_ECHO), self.paths["c"]]))
        for key, target in (("python", _blocking_echo_server), ("asyncio", _asyncio_echo_server)):
            p = mp.Process(target=target, args=(self.paths[key],), daemon=True)
            p.start()
            self._procs.append(p)
        for path in self.paths.values():
            for _ in range(500):
                if os.path.exists(path):
                    break
                time.sleep(0.01)
            else:
                raise SystemExit(f"echo server did not start on {path}")
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self._procs:
            p.terminate()
        for p in self._procs:
            p.wait(10) if isinstance(p, subprocess.Popen) else p.join(10)

    def python_client(self, server: str, n: int) -> dict[str, float]:
        """Round trips of the request frame from a blocking Python socket to one server."""
        s = socket.socket(socket.AF_UNIX)
        s.connect(self.paths[server])
        back = bytearray(len(FRAME))
        view = memoryview(back)
        times = []
        with s:
            for i in range(n + 200):
                t0 = time.perf_counter()
                s.sendall(FRAME)
                _recv_exact(s, view, 0, len(FRAME))
                if i >= 200:
                    times.append(time.perf_counter() - t0)
        assert bytes(back) == FRAME, "the echo changed the frame"
        return summary_us(times)

    def all_python(self, n: int) -> dict[str, dict[str, float]]:
        """The Python client to each server: the blocking Python echo is the Python floor."""
        return {"python_to_python_blocking": self.python_client("python", n),
                "python_to_c_blocking": self.python_client("c", n),
                "python_to_asyncio_server": self.python_client("asyncio", n)}

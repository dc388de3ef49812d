#!/usr/bin/env python3
"""RM speed, side by side in one run; prints JSON.

* echo: raw Unix-socket round trip of a framed message to an asyncio echo server (the floor);
* query: `execute_query` of a single fact through `cod.client` (target: median <= 100 us),
  and the same request over a bare socket (no client threads);
* listing1: connect -> allocation upcall for the whole Listing 1 initialisation in one call
  (target < 5 ms);
* many_clients: 200 clients connected at once, each doing 500 queries;
* during_recompute: query latency while another client keeps forcing recomputations.

    python bench/rm_bench.py [--machine magnycours] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from cod.client import Client
from cod.protocol.framing import FrameDecoder, encode

QUERY = "bench_fact(X)"


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def summary_us(xs: list[float]) -> dict[str, float]:
    return {"n": len(xs), "median_us": round(statistics.median(xs) * 1e6, 1),
            "p99_us": round(pct(xs, 99) * 1e6, 1), "max_us": round(max(xs) * 1e6, 1)}


# ---- the floor: a framed echo over a Unix socket ------------------------------------------------
def _echo_server(path: str) -> None:
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


def bench_echo(tmp: Path, n: int) -> dict[str, float]:
    path = str(tmp / "echo.sock")
    proc = mp.Process(target=_echo_server, args=(path,), daemon=True)
    proc.start()
    while not os.path.exists(path):
        time.sleep(0.01)
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    frame = encode({"jsonrpc": "2.0", "id": 1, "method": "execute_query", "params": {"goal": QUERY}})
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        s.sendall(frame)
        got = 0
        while got < len(frame):
            got += len(s.recv(65536))
        times.append(time.perf_counter() - t0)
    s.close()
    proc.terminate()
    return summary_us(times)


# ---- the daemon -------------------------------------------------------------------------------
def start_daemon(tmp: Path, machine: str | None) -> subprocess.Popen:
    sock = tmp / "rm.sock"
    source = ["--machine", machine] if machine else ["--no-enforce"]
    proc = subprocess.Popen([sys.executable, "-m", "cod.cli.main", "rm", "--socket", str(sock), *source,
                             "--log-level", "warning"], stderr=open(tmp / "rm.log", "wb"))
    for _ in range(400):
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(sock))
            s.close()
            return proc
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"daemon did not start: {(tmp / 'rm.log').read_text()}")


def bench_query_client(sock: str, n: int) -> dict[str, float]:
    with Client.connect(sock, app="bench") as c:
        c.add_facts(["bench_fact(42)"])
        for _ in range(200):
            c.execute_query(QUERY)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            c.execute_query(QUERY)
            times.append(time.perf_counter() - t0)
    return summary_us(times)


def bench_query_raw(sock: str, n: int) -> dict[str, float]:
    s = socket.socket(socket.AF_UNIX)
    s.connect(sock)
    dec = FrameDecoder()

    def call(rid: int, method: str, params: dict) -> None:
        s.sendall(encode({"jsonrpc": "2.0", "id": rid, "method": method, "params": params}))
        while not dec.feed(s.recv(65536)):
            pass

    call(0, "hello", {"version": 1, "app": "benchraw"})
    call(0, "add_facts", {"facts": ["bench_fact(42)"]})
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        call(i, "execute_query", {"goal": QUERY})
        times.append(time.perf_counter() - t0)
    s.close()
    return summary_us(times)


LISTING1_FACTS = ["db_ntuple(3750000)", "db_tsize(315)", "db_nquery(2048)", "db_nupdate(256)", "db_rtime(3000)"]
COST_FN = "db_cost_fn(X, Y, Z, NrCores) :- NrCores is (X * ((0.47 * Y) + 265.29)) / (3750000 * Z)."


def bench_listing1(sock: str, n: int) -> dict[str, float]:
    """Connect, then one register_task carrying properties, facts and cost function; stop at the upcall."""
    times = []
    for i in range(n):
        got = threading.Event()
        t0 = time.perf_counter()
        c = Client.connect(sock, app=f"cscs{i}")
        c.register_task(f"cscs{i}", max_cores=2, bound="cpu", sensitive=["cache", "numa"],
                        facts=LISTING1_FACTS, procedures=[COST_FN], on_allocation=lambda e: got.set())
        got.wait(5)
        times.append(time.perf_counter() - t0)
        c.close()
        time.sleep(0.01)  # let the daemon forget the task before the next round
    out = summary_us(times)
    out["calls"] = 2  # hello (inside connect) + register_task
    return out


def _many_worker(sock: str, clients: int, queries: int, barrier, out) -> None:
    lat: list[float] = []
    errors = 0
    conns = [Client.connect(sock, app=f"m{os.getpid()}_{k}") for k in range(clients)]
    for c in conns:
        c.add_facts(["bench_fact(42)"])
    barrier.wait()

    def run(c: Client) -> None:
        nonlocal errors
        for _ in range(queries):
            t0 = time.perf_counter()
            try:
                if c.execute_query(QUERY) != [{"X": 42}]:
                    errors += 1
            except Exception:
                errors += 1
            lat.append(time.perf_counter() - t0)

    threads = [threading.Thread(target=run, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for c in conns:
        c.close()
    out.put((lat, errors))


def bench_many(sock: str, clients: int, queries: int, procs: int = 4) -> dict[str, float]:
    barrier = mp.Barrier(procs + 1)
    out: mp.Queue = mp.Queue()
    workers = [mp.Process(target=_many_worker, args=(sock, clients // procs, queries, barrier, out))
               for _ in range(procs)]
    for w in workers:
        w.start()
    barrier.wait()
    t0 = time.perf_counter()
    lat: list[float] = []
    errors = 0
    for _ in workers:
        got, err = out.get()
        lat.extend(got)
        errors += err
    wall = time.perf_counter() - t0
    for w in workers:
        w.join()
    res = summary_us(lat)
    res.update(clients=clients, queries_per_client=queries, errors=errors,
               throughput_qps=round(len(lat) / wall), wall_s=round(wall, 2))
    return res


def bench_during_recompute(sock: str, n: int) -> dict[str, dict[str, float]]:
    """Query latency with no recomputation running, then while another client forces them nonstop."""
    with Client.connect(sock, app="probe") as probe, Client.connect(sock, app="churn") as churn:
        probe.add_facts(["bench_fact(42)"])
        for k in range(2):
            churn.register_task(f"churn{k}", min_cores=1, max_cores=8, sensitive=["numa"], exclusive=False)
        idle = []
        for _ in range(n):
            t0 = time.perf_counter()
            probe.execute_query(QUERY)
            idle.append(time.perf_counter() - t0)
        stop = threading.Event()
        recomputes = 0

        def force() -> None:
            nonlocal recomputes
            k = 0
            while not stop.is_set():
                churn.update_task(f"churn{k % 2}", max_cores=1 + (k % 4))
                churn.request_allocation(f"churn{k % 2}")
                recomputes += 2
                k += 1

        t = threading.Thread(target=force)
        t.start()
        busy = []
        for _ in range(n):
            t0 = time.perf_counter()
            probe.execute_query(QUERY)
            busy.append(time.perf_counter() - t0)
        stop.set()
        t.join()
    return {"idle": summary_us(idle), "while_recomputing": summary_us(busy) | {"recomputations": recomputes}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", default=None,
                    help="plan for a reference machine instead of this one (default: this machine)")
    ap.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    args = ap.parse_args()
    n = 1000 if args.quick else 10_000
    with tempfile.TemporaryDirectory(prefix="cod-rm-bench-") as tmpd:
        tmp = Path(tmpd)
        results: dict[str, object] = {"machine": args.machine or "this machine", "cpus_here": os.cpu_count(),
                                      "loadavg_before": os.getloadavg()[0]}
        results["echo_round_trip"] = bench_echo(tmp, n)
        proc = start_daemon(tmp, args.machine)
        try:
            sock = str(tmp / "rm.sock")
            results["execute_query_client"] = bench_query_client(sock, n)
            results["execute_query_raw_socket"] = bench_query_raw(sock, n)
            results["listing1_connect_to_upcall"] = bench_listing1(sock, 20 if args.quick else 100)
            results["many_clients"] = bench_many(sock, 200, 50 if args.quick else 500)
            results["query_latency_vs_recompute"] = bench_during_recompute(sock, 500 if args.quick else 3000)
        finally:
            proc.terminate()
            proc.wait(10)
    q = results["execute_query_client"]["median_us"]  # type: ignore[index]
    l1 = results["listing1_connect_to_upcall"]["median_us"]  # type: ignore[index]
    results["targets"] = {"query_median_le_100us": q <= 100, "listing1_lt_5ms": l1 < 5000,
                          "many_clients_no_error": results["many_clients"]["errors"] == 0}  # type: ignore[index]
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

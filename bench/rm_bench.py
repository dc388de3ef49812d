#!/usr/bin/env python3
"""RM and SKB speed, side by side in one run; prints JSON with the load average.

* echo: round trip of the same request frame from a blocking Python socket to a blocking echo
  between two processes (bench/echo_floor.py: Python and C servers; the floor), before and after
  the query blocks; an asyncio echo server (the floor used before issue 31) as a labelled column;
* query: `execute_query` of a single fact through `cod.client`, on the direct channel to the SKB
  server and through the daemon, in alternating blocks (target: direct median <= 5x the blocking
  Python echo);
  and through the daemon over a bare socket (no client threads);
* listing3: the paper's Listing 3 stored procedure on MagnyCours from the client, beside its time
  inside the engine (target: median <= 5x the Python echo + in-engine time);
* listing1: connect -> allocation upcall for the whole Listing 1 initialisation in one call;
* many_clients: 200 clients x 500 queries, direct and through the daemon (target: direct >= 2.5x);
* runaway: single-fact queries of one application while another runs queries that never end
  (target: median within 1.5x of idle), and the daemon's answers to other calls meanwhile
  (target: p99 <= 20 ms for ack_allocation, register_task, get_allocation, list_tasks);
* during_recompute: query latency while another client keeps forcing recomputations.

    python bench/rm_bench.py [--machine magnycours] [--quick] [--only listing1|many]
"""

from __future__ import annotations

import argparse
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from echo_floor import QUERY, EchoServers, summary_us  # noqa: E402

from cod.client import Client  # noqa: E402
from cod.protocol.framing import FrameDecoder, encode  # noqa: E402


# ---- the daemon -------------------------------------------------------------------------------
def start_daemon(tmp: Path, machine: str | None) -> subprocess.Popen:
    sock = tmp / "rm.sock"
    source = ["--machine", machine] if machine else ["--no-enforce"]
    proc = subprocess.Popen([sys.executable, "-m", "cod.cli.main", "rm", "--socket", str(sock), *source,
                             "--log-level", "warning"], stderr=open(tmp / "rm.log", "wb"))
    return listening(proc, sock, tmp / "rm.log")


def listening(proc: subprocess.Popen, sock: Path, log: Path, seconds: float = 30.0) -> subprocess.Popen:
    """``proc`` once its socket accepts a connection (exits the bench with its log if not)."""
    for _ in range(int(seconds / 0.05)):
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(str(sock))
            s.close()
            return proc
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"daemon did not start: {log.read_text()}")


def via_rm(c: Client) -> Client:
    """The same client with its direct channel turned off: every query goes through the daemon."""
    c.direct_queries = False
    if c._direct is not None:
        c._drop_direct(c._direct)
    return c


def bench_query_client(sock: str, n: int, block: int = 500) -> dict[str, dict[str, float]]:
    """Direct and through the daemon, in alternating blocks so both see the same load."""
    with Client.connect(sock, app="bench") as d, via_rm(Client.connect(sock, app="bench_rm")) as r:
        assert d.direct, "the daemon offers no direct channel"
        for c in (d, r):
            c.add_facts(["bench_fact(42)"])
            for _ in range(200):
                c.execute_query(QUERY)
        times: dict[str, list[float]] = {"direct": [], "through_rm": []}
        for _ in range(max(1, n // block)):
            for key, c in (("direct", d), ("through_rm", r)):
                for _ in range(block):
                    t0 = time.perf_counter()
                    c.execute_query(QUERY)
                    times[key].append(time.perf_counter() - t0)
    return {k: summary_us(v) for k, v in times.items()}


def bench_listing3(sock: str, machine: str | None, n: int) -> dict[str, object]:
    """dbos_cost_function from the client, and the same goal's time inside an engine."""
    from cod.facts import from_args, machines
    from cod.skb import SKB

    goal = "dbos_cost_function(S, N, P)"
    facts = ["db_ntuple(30000000)", "db_tsize(315)", "db_nquery(2048)", "db_nupdate(0)", "db_rtime(2000)"]
    cost = ("db_cost_fn(NTuples, NRequests, RTimeMs, Cores) :- "
            "Cores is (NTuples * (0.85 * NRequests + 106.37)) / (3750000 * RTimeMs).")
    with Client.connect(sock, app="listing3") as c:
        c.add_facts(facts)
        c.add_procedure(cost)
        answer = c.execute_query(goal)
        for _ in range(100):
            c.execute_query(goal)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            c.execute_query(goal)
            times.append(time.perf_counter() - t0)
    with SKB() as skb:
        skb.load_machine(machines.load(machine) if machine else from_args())
        skb.add_facts("listing3", facts)
        skb.add_procedure("listing3", cost)
        inside = skb.time_query("listing3", goal, 2000)
    return {"answer": answer, "client": summary_us(times),
            "in_engine_median_us": round(statistics.median(inside["wall_us"]), 1)}


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


def bench_listing1(sock: str, n: int) -> dict[str, object]:
    """Connect, then one register_task carrying properties, facts and cost function; stop at the upcall.

    Beside the total, where it goes: connect (hello, and the direct channel's hello), the
    register_task call until its reply, and the upcall after that reply."""
    times: list[float] = []
    parts: dict[str, list[float]] = {"connect": [], "register_task_reply": [], "upcall_after_reply": []}
    for i in range(n):
        got = threading.Event()
        at: list[float] = []
        t0 = time.perf_counter()
        c = Client.connect(sock, app=f"cscs{i}")
        t1 = time.perf_counter()
        c.register_task(f"cscs{i}", max_cores=2, bound="cpu", sensitive=["cache", "numa"],
                        facts=LISTING1_FACTS, procedures=[COST_FN],
                        on_allocation=lambda e: (at.append(time.perf_counter()), got.set()))
        t2 = time.perf_counter()
        got.wait(5)
        times.append(time.perf_counter() - t0)
        parts["connect"].append(t1 - t0)
        parts["register_task_reply"].append(t2 - t1)
        parts["upcall_after_reply"].append(max(0.0, at[0] - t2) if at else 5.0)
        c.close()
        time.sleep(0.01)  # let the daemon forget the task before the next round
    out: dict[str, object] = dict(summary_us(times))
    out["calls"] = 2  # hello (inside connect) + register_task
    out["parts_median_us"] = {k: summary_us(v)["median_us"] for k, v in parts.items()}
    return out


def _many_worker(sock: str, clients: int, queries: int, direct: bool, barrier, out) -> None:
    lat: list[float] = []
    errors = 0
    conns = [Client.connect(sock, app=f"m{os.getpid()}_{k}") for k in range(clients)]
    if not direct:
        conns = [via_rm(c) for c in conns]
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


def bench_many(sock: str, clients: int, queries: int, direct: bool, procs: int = 4) -> dict[str, float]:
    barrier = mp.Barrier(procs + 1)
    out: mp.Queue = mp.Queue()
    workers = [mp.Process(target=_many_worker, args=(sock, clients // procs, queries, direct, barrier, out))
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


def bench_runaway(sock: str, n: int, n_tasks: int) -> dict[str, object]:
    """Another application's queries and the daemon's other calls while queries never end."""
    def probe_queries(c: Client) -> list[float]:
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            c.execute_query(QUERY)
            times.append(time.perf_counter() - t0)
        return times

    with Client.connect(sock, app="victim") as v:
        v.add_facts(["bench_fact(42)"])
        for _ in range(200):
            v.execute_query(QUERY)
        idle = probe_queries(v)
        stop = threading.Event()

        def runaway(direct: bool) -> None:
            with Client.connect(sock, app="runaway") as a:
                if not direct:
                    via_rm(a)
                while not stop.is_set():
                    try:
                        a.execute_query("repeat, sleep(0.01), fail", timeout_s=5)
                    except Exception:
                        pass

        threads = [threading.Thread(target=runaway, args=(k % 2 == 0,), daemon=True) for k in range(2)]
        for t in threads:
            t.start()
        time.sleep(0.5)
        busy = probe_queries(v)
        calls: dict[str, list[float]] = {"register_task": [], "ack_allocation": [], "get_allocation": [],
                                         "list_tasks": []}
        with Client.connect(sock, app="writer") as w:
            sleepers = [subprocess.Popen(["sleep", "600"]) for _ in range(n_tasks)]
            try:
                for i in range(100):
                    if i < n_tasks:
                        t0 = time.perf_counter()
                        w.register_task(f"hol{i}", pid=sleepers[i].pid, max_cores=2)
                        calls["register_task"].append(time.perf_counter() - t0)
                    for name, fn in (("ack_allocation", lambda: w.call("ack_allocation", {"task": "hol0", "epoch": 1})),
                                     ("get_allocation", lambda: w.get_allocation("hol0")),
                                     ("list_tasks", w.list_tasks)):
                        t0 = time.perf_counter()
                        fn()
                        calls[name].append(time.perf_counter() - t0)
            finally:
                for s in sleepers:
                    s.kill()
        stop.set()
    idle_s, busy_s = summary_us(idle), summary_us(busy)
    return {"idle": idle_s, "during_runaway": busy_s,
            "ratio_median": round(busy_s["median_us"] / idle_s["median_us"], 2),
            "calls_during_runaway": {k: summary_us(v) for k, v in calls.items()}}


def judge(results: dict) -> None:
    """The ratios to the floor and the targets of issue 31, added to ``results``."""
    def echo_median(server: str) -> float:
        return statistics.median([results[k][server]["median_us"]  # type: ignore[index]
                                  for k in ("echo_round_trip", "echo_round_trip_after")])

    echo = echo_median("python_to_python_blocking")
    echo_asyncio = echo_median("python_to_asyncio_server")
    direct = results["execute_query_client"]["direct"]["median_us"]  # type: ignore[index]
    l3 = results["listing3"]  # type: ignore[assignment]
    many_d = results["many_clients_direct"]["throughput_qps"]  # type: ignore[index]
    many_r = results["many_clients_through_rm"]["throughput_qps"]  # type: ignore[index]
    hol = results["runaway"]["calls_during_runaway"]  # type: ignore[index]
    results["ratios"] = {
        "direct_query_over_python_blocking_echo": round(direct / echo, 2),
        "direct_query_over_asyncio_echo_old_floor": round(direct / echo_asyncio, 2),
        "listing3_over_echo_plus_engine": round(l3["client"]["median_us"] / (echo + l3["in_engine_median_us"]), 2),
        "many_clients_direct_over_through_rm": round(many_d / many_r, 2),
        "runaway_over_idle": results["runaway"]["ratio_median"],  # type: ignore[index]
    }
    results["targets"] = {
        "direct_query_le_5x_python_blocking_echo":
            results["ratios"]["direct_query_over_python_blocking_echo"] <= 5.0,  # type: ignore[index]
        "listing3_le_5x_echo_plus_engine": results["ratios"]["listing3_over_echo_plus_engine"] <= 5.0,  # type: ignore[index]
        "listing1_median_le_1_5ms":
            results["listing1_connect_to_upcall"]["median_us"] <= 1500,  # type: ignore[index]
        "many_clients_direct_ge_2_5x": results["ratios"]["many_clients_direct_over_through_rm"] >= 2.5,  # type: ignore[index]
        "runaway_le_1_5x_idle": results["ratios"]["runaway_over_idle"] <= 1.5,  # type: ignore[index]
        "calls_during_runaway_p99_le_20ms": all(v["p99_us"] <= 20_000 for v in hol.values()),
        "many_clients_no_error": results["many_clients_direct"]["errors"] == 0  # type: ignore[index]
        and results["many_clients_through_rm"]["errors"] == 0,  # type: ignore[index]
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--machine", default=None,
                    help="plan for a reference machine instead of this one (default: this machine)")
    ap.add_argument("--quick", action="store_true", help="fewer iterations (a smoke run)")
    ap.add_argument("--only", choices=["listing1", "many"], default=None,
                    help="run one section alone (listing1: connect -> first upcall, 100 registrations; "
                         "many: 200 clients x 500 queries through the daemon, then direct)")
    args = ap.parse_args()
    n = 1000 if args.quick else 10_000
    with tempfile.TemporaryDirectory(prefix="cod-rm-bench-") as tmpd:
        tmp = Path(tmpd)
        results: dict[str, object] = {"machine": args.machine or "this machine", "cpus_here": os.cpu_count(),
                                      "loadavg_before": os.getloadavg()[0]}
        proc = start_daemon(tmp, args.machine)
        try:
            sock = str(tmp / "rm.sock")
            if args.only == "listing1":
                results["listing1_connect_to_upcall"] = bench_listing1(sock, 20 if args.quick else 100)
            if args.only == "many":
                q = 50 if args.quick else 500
                results["many_clients_through_rm"] = bench_many(sock, 200, q, direct=False)
                results["many_clients_direct"] = bench_many(sock, 200, q, direct=True)
                results["many_clients_direct_over_through_rm"] = round(
                    results["many_clients_direct"]["throughput_qps"]  # type: ignore[index]
                    / results["many_clients_through_rm"]["throughput_qps"], 2)  # type: ignore[index]
            if args.only is not None:
                results["loadavg_after"] = os.getloadavg()[0]
                print(json.dumps(results, indent=1))
                return 0
            with EchoServers(tmp) as echo:
                results["echo_round_trip"] = echo.all_python(n)
                results["execute_query_client"] = bench_query_client(sock, n)
                results["echo_round_trip_after"] = echo.all_python(n)
            results["execute_query_raw_socket_through_rm"] = bench_query_raw(sock, n)
            results["listing3"] = bench_listing3(sock, args.machine, 1000 if args.quick else 5000)
            results["listing1_connect_to_upcall"] = bench_listing1(sock, 20 if args.quick else 100)
            q = 50 if args.quick else 500
            results["many_clients_through_rm"] = bench_many(sock, 200, q, direct=False)
            results["many_clients_direct"] = bench_many(sock, 200, q, direct=True)
            # each task needs a CPU of its own (min_cores 1): at most 5, fewer on a small machine
            n_tasks = 5 if args.machine else min(5, os.cpu_count() or 1)
            results["runaway"] = bench_runaway(sock, 500 if args.quick else 2000, n_tasks)
            results["query_latency_vs_recompute"] = bench_during_recompute(sock, 500 if args.quick else 3000)
        finally:
            proc.terminate()
            proc.wait(10)
    results["loadavg_after"] = os.getloadavg()[0]
    judge(results)
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

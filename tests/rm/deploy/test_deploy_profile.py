"""`cod profile`'s parts on a fake /proc tree and fake windows; the PMU plumbing on a software event."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from cod.rm.deploy import parse_graph
from cod.rm.deploy.measure import perf
from cod.rm.deploy.measure.threads import ProfileError, ThreadSample, detect_source, sample_process, start_time
from cod.rm.deploy.measure.profile import Window, locality_from_counters, to_graph


def fake_proc(root: Path, pid: int, threads: dict[int, tuple[str, int, int | None]], born: int = 4242) -> None:
    """threads: tid -> (comm, run_ns, wait_ns or None for no schedstat)."""
    stat_tail = " ".join(["S"] + ["0"] * 18 + [str(born)] + ["0"] * 30)
    (root / str(pid)).mkdir(parents=True, exist_ok=True)
    (root / str(pid) / "stat").write_text(f"{pid} (engine) {stat_tail}\n")
    for tid, (comm, run_ns, wait_ns) in threads.items():
        t = root / str(pid) / "task" / str(tid)
        t.mkdir(parents=True, exist_ok=True)
        (t / "comm").write_text(comm + "\n")
        ticks = run_ns * os.sysconf("SC_CLK_TCK") // 1_000_000_000
        fields = ["S"] + ["0"] * 10 + [str(ticks), "0"] + ["0"] * 40
        (t / "stat").write_text(f"{tid} ({comm}) {' '.join(fields)}\n")
        if wait_ns is not None:
            (t / "schedstat").write_text(f"{run_ns} {wait_ns} 7\n")


def test_schedstat_and_comm(tmp_path):
    fake_proc(tmp_path, 100, {100: ("engine", 5_000_000, 10), 101: ("scan (a)", 2_000_000_000, 30)})
    assert detect_source(100, tmp_path) == "schedstat"
    s = sample_process(100, "schedstat", tmp_path)
    assert s[101] == ThreadSample(101, "scan (a)", 2_000_000_000, 30)
    assert start_time(100, tmp_path) == 4242


def test_stat_fallback_in_clock_ticks(tmp_path):
    fake_proc(tmp_path, 100, {100: ("engine", 3_000_000_000, None)})
    assert detect_source(100, tmp_path) == "stat"
    assert sample_process(100, "stat", tmp_path)[100].run_ns == 3_000_000_000


def test_missing_process_and_vanishing_thread(tmp_path):
    with pytest.raises(ProfileError, match="process 7: no such process"):
        sample_process(7, "schedstat", tmp_path)
    fake_proc(tmp_path, 100, {100: ("engine", 1, 1), 101: ("gone", 1, 1)})
    (tmp_path / "100" / "task" / "101" / "comm").unlink()  # exited between listing and reading
    assert set(sample_process(100, "schedstat", tmp_path)) == {100}


def window(before, after, seconds=2.0, counters=None, pmu=(False, "none")) -> Window:
    def samples(d):
        return {tid: ThreadSample(tid, comm, run, wait) for tid, (comm, run, wait) in d.items()}
    return Window(1, seconds, "schedstat", samples(before), samples(after), counters or {}, pmu)


def test_cpu_util_is_time_on_cpu_over_the_window():
    w = window({1: ("main", 0, 0), 2: ("scan0", 1_000_000_000, 0), 3: ("join", 0, 0)},
               {1: ("main", 10_000_000, 0), 2: ("scan0", 1_500_000_000, 600_000_000), 3: ("join", 2_500_000_000, 0),
                4: ("late", 400_000_000, 0)})
    g = to_graph(w)
    ops = {o["id"]: o for o in g["operators"]}
    assert ops["scan0"]["cpu_util"] == 0.25 and ops["scan0"]["runqueue_wait"] == 0.3
    assert ops["join"]["cpu_util"] == 1.0  # capped at one core
    assert ops["late"]["cpu_util"] == 0.2 and ops["late"]["started_in_window"]
    assert all(o["mem_bw"] is None for o in ops.values())
    assert g["profile"]["pmu"]["available"] is False
    assert "1 thread(s) waited for a CPU more than 25% of the window (up to 30%)" in g["profile"]["warnings"][0]
    parse_graph(g)  # what deploy-plan reads


def test_threads_sharing_a_name_are_siblings():
    w = window({}, {5: ("scan", 1, 0), 6: ("scan", 1, 0), 7: ("join", 1, 0)})
    g = to_graph(w)
    assert [(o["id"], o.get("siblings")) for o in g["operators"]] == [
        ("scan#5", "scan"), ("scan#6", "scan"), ("join", None)]


def test_template_gives_edges_blocking_siblings_and_full_names():
    long_name = "groupby_bestsellers"  # longer than a comm: the thread is "groupby_bestsel"
    template = {"operators": [
        {"id": "scan", "cpu_util": 0, "mem_bw": 1e9, "siblings": "scan_item"},
        {"id": long_name, "cpu_util": 0, "mem_bw": None, "blocking": True},
        {"id": "absent", "cpu_util": 0}],
        "edges": [["scan", long_name], ["absent", "scan"]]}
    w = window({}, {5: ("scan", 1, 0), 6: ("scan", 1, 0), 7: (long_name[:15], 1, 0), 8: ("main", 1, 0)})
    g = to_graph(w, template)
    ops = {o["id"]: o for o in g["operators"]}
    assert ops[long_name]["blocking"] is True and ops[long_name]["comm"] == "groupby_bestsel"
    assert ops["scan#5"]["siblings"] == "scan_item" and ops["scan#5"]["mem_bw"] == 1e9
    assert ops["scan#5"]["mem_bw_from"] == "template"
    assert sorted(g["edges"]) == [["scan#5", long_name], ["scan#6", long_name]]
    assert g["profile"]["template_operators_not_running"] == ["absent"]
    assert to_graph(w, template, threads="^scan")["profile"]["threads"] == 2
    parse_graph(g)


def test_counters_give_ipc_and_bandwidth_by_eq2():
    w = window({}, {5: ("scan", 1, 0)}, seconds=2.0,
               counters={5: {"instructions": 3000, "cycles": 2000, "llc_misses": 1_000_000}}, pmu=(True, "ok"))
    [op] = to_graph(w)["operators"]
    assert op["ipc"] == 1.5 and op["mem_bw"] == 1_000_000 * 64 / 2.0


@pytest.mark.parametrize("instructions,misses,expected", [
    (1_000_000, 0, ("strong", 0.0)),
    (1_000_000, 999, ("strong", 0.999)),
    (1_000_000, 1_000, ("moderate", 1.0)),    # STRONG_MPKI is the first moderate value
    (1_000_000, 9_999, ("moderate", 9.999)),
    (1_000_000, 10_000, ("weak", 10.0)),      # WEAK_MPKI is the first weak value
    (1_000, 900, ("weak", 900.0)),            # an index join: a miss on nearly every lookup
    (0, 5, None),                             # no instruction counted: nothing to say
    (None, 5, None),                          # no counters
    (1_000, None, None),
])
def test_locality_is_estimated_from_llc_misses_per_kilo_instruction(instructions, misses, expected):
    assert locality_from_counters(instructions, misses) == expected


def test_the_profile_gives_each_counted_thread_a_locality_and_says_how():
    w = window({}, {5: ("probe", 1, 0), 6: ("scan", 1, 0)}, seconds=1.0,
               counters={5: {"instructions": 4_000_000, "cycles": 2_000_000, "llc_misses": 2_000},
                         6: {"instructions": 1_000_000, "cycles": 3_000_000, "llc_misses": 40_000}},
               pmu=(True, "ok"))
    g = to_graph(w)
    by_id = {op["id"]: op for op in g["operators"]}
    assert (by_id["probe"]["locality"], by_id["probe"]["llc_mpki"]) == ("strong", 0.5)
    assert (by_id["scan"]["locality"], by_id["scan"]["llc_mpki"]) == ("weak", 40.0)
    assert "LLC misses per 1,000 instructions" in g["profile"]["pmu"]["locality"]
    # Without counters nothing is guessed.
    [op] = to_graph(window({}, {5: ("probe", 1, 0)}))["operators"]
    assert "locality" not in op


def test_perf_event_open_plumbing_on_a_software_event():
    fd = perf.perf_event_open(perf.PERF_TYPE_SOFTWARE, perf.PERF_COUNT_SW_TASK_CLOCK, threading.get_native_id())
    try:
        sum(range(2_000_000))
        ns = perf.read_scaled(fd)
    finally:
        os.close(fd)
    assert ns is not None and ns > 1_000_000  # task-clock counts nanoseconds on the CPU


def test_probe_says_whether_there_is_a_pmu():
    ok, detail = perf.probe()
    has_pmu = os.path.isdir("/sys/bus/event_source/devices/cpu") or os.path.isdir(
        "/sys/bus/event_source/devices/cpu_core")
    assert ok == has_pmu, detail
    if not ok:
        assert "PMU" in detail or "permitted" in detail

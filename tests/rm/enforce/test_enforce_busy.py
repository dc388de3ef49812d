"""Busy (CPU-hog) detection on real processes."""

from __future__ import annotations

import os
import time

import pytest

from cod.facts.procfs import PF_EXITING
from cod.rm.enforce import AffinityEnforcer, EnforceError
from cod.rm.enforce.busy import BusyDetector, confine
from helpers.procs import allowed_list, spawn, spinner_cmd  # noqa: F401 (fixtures)

CPUS = sorted(os.sched_getaffinity(0))
INTERVAL = 0.1
# Low enough that a spinner on this shared 2-CPU box (others run tests too) is always
# above it, while a sleeper (0.00 cores) is always below it.
THRESHOLD = 0.2


def run(detector: BusyDetector, samples: int, spin_self: bool = False) -> list[list[int]]:
    """``samples`` samples ``INTERVAL`` apart (spinning between them if asked); the pids reported."""
    seen = []
    for _ in range(samples):
        seen.append([b.pid for b in detector.sample()])
        if spin_self:
            end = time.monotonic() + INTERVAL
            while time.monotonic() < end:
                pass
        else:
            time.sleep(INTERVAL)
    return seen


@pytest.mark.parametrize("window", [2, 3])
def test_spinner_found_within_its_window_sleeper_ignored(spawn, window):
    hog, idle = spawn(3, "spin"), spawn(2, "sleep")  # two spinners: robust on a shared box
    det = BusyDetector(threshold=THRESHOLD, window=window)
    seen = run(det, window + 3)
    # The first sample only sets the baseline: window samples later the hog is known.
    assert all(hog.pid not in s for s in seen[:window])
    assert all(hog.pid in s for s in seen[window + 1:])
    assert all(idle.pid not in s for s in seen)
    found = next(b for b in det.sample() if b.pid == hog.pid)
    assert found.cpu >= THRESHOLD and found.cpus == tuple(sorted(os.sched_getaffinity(hog.pid)))
    assert found.last_cpu in found.cpus


def test_spinners_sharing_one_cpu_are_each_busy_by_what_they_wait_for(spawn):
    """Four spinners on one CPU each get a quarter of it (under a 0.5 threshold) but want a whole
    core: their run-queue wait counts, so each is reported, with the demand it has."""
    hogs = [spawn(1, "spin") for _ in range(4)]
    for h in hogs:
        for tid in h.tids:
            os.sched_setaffinity(tid, CPUS[-1:])
    det = BusyDetector(threshold=0.5, window=2, always_scan=True)
    run(det, 5)
    found = {b.pid: b for b in det.sample()}
    for h in hogs:
        assert h.pid in found, (h.pid, found)
        assert found[h.pid].cpu >= 0.5
    # what they got is a quarter each: the CPU time alone would have hidden them
    assert all(found[h.pid].cpu <= 1.5 for h in hogs)


def test_registered_pids_and_self_are_never_reported(spawn):
    hog = spawn(1, "spin")
    registered = {hog.pid}
    det = BusyDetector(threshold=THRESHOLD, window=1, registered=lambda: registered)
    seen = run(det, 4, spin_self=True)  # this process is a hog too
    assert all(hog.pid not in s and os.getpid() not in s for s in seen)
    registered.clear()  # the same detector sees the hog once it is no longer registered
    assert hog.pid in run(det, 3)[-1]


@pytest.mark.parametrize("threshold,window,needle", [(0, 3, "threshold"), (-1, 3, "threshold"), (0.5, 0, "window")])
def test_bad_settings_are_named(threshold, window, needle):
    with pytest.raises(EnforceError, match=needle):
        BusyDetector(threshold=threshold, window=window)


@pytest.mark.skipif(len(CPUS) < 2, reason="needs two CPUs")
def test_confine_keeps_the_hog_on_the_cores_left_over(spawn, tmp_path):
    hog = spawn(2, "spin")
    det = BusyDetector(threshold=THRESHOLD, window=2)
    found = []
    for _ in range(10):
        found = [b for b in det.sample() if b.pid == hog.pid]
        if found:
            break
        time.sleep(INTERVAL)
    assert found, "hog not detected"
    with AffinityEnforcer(str(tmp_path / "state")) as enf:
        task = confine(enf, found[0], [CPUS[1]], [0])
        assert task == f"other.{hog.pid}"
        assert {allowed_list(hog.pid, t) for t in hog.tids} == {str(CPUS[1])}
    assert {allowed_list(hog.pid, t) for t in hog.tids} == {allowed_list(os.getpid())}


# ---- the /proc/stat gate, on a /proc tree we write (deterministic ticks) -------------

def write_stat(root, pid: int, ticks: int, start: int = 1000, flags: int = 0, threads: int = 1) -> None:
    rest = ["0"] * 50
    rest[0], rest[1], rest[6], rest[11], rest[19], rest[17] = "R", "1", str(flags), str(ticks), str(start), str(threads)
    (root / str(pid)).mkdir(exist_ok=True)
    (root / str(pid) / "stat").write_text(f"{pid} (fake {pid}) {' '.join(rest)}\n")


def write_machine(root, busy_ticks: int) -> None:
    (root / "stat").write_text(f"cpu  {busy_ticks} 0 0 100000 0 0 0 0 0 0\ncpu0 {busy_ticks} 0 0 50000 0 0 0 0 0 0\n")


# ticks the unregistered process uses per 1 s sample; 100 ticks = one core; threshold 0.15
QUIET, NOISE, HOG = 0, 5, 20


@pytest.mark.parametrize("other_ticks,scans,reported", [
    # all busy time is the registered task's: no process scan at all
    ([QUIET] * 7, 0, [False] * 7),
    # 0.05 cores unexplained (noise): below the threshold, still no scan
    ([NOISE] * 7, 0, [False] * 7),
    # a hog: scan 1 = baseline, scans 2-3 fill the window of 2; once reported it is
    # followed alone (its time is explained), so scanning stops
    ([HOG] * 7, 3, [False, False, False, True, True, True, True]),
    # a hog that goes quiet stays reported until it has been quiet for the quiet window (2 here)
    ([HOG] * 4 + [QUIET] * 3, 3, [False, False, False, True, True, True, False]),
    # hysteresis: a hog measured just under the threshold (it shares its CPU) is not forgotten,
    # only one below half the threshold for the quiet window is
    ([HOG] * 4 + [NOISE * 2] * 3, 3, [False, False, False, True, True, True, True]),
])
def test_full_scan_only_when_cpu_time_is_unexplained(tmp_path, spawn, other_ticks, scans, reported):
    registered, other = 7, spawn(1, "sleep").pid  # a real pid, so its affinity can be read
    t = [0.0]
    det = BusyDetector(threshold=0.15, window=2, registered=lambda: {registered}, proc=str(tmp_path),
                       clock=lambda: t[0], quiet_window=2)
    det.me = 1  # this process's own ticks are not in the fake tree
    busy, reg, oth = 0, 0, 0
    seen = []
    for extra in other_ticks:
        write_machine(tmp_path, busy)
        write_stat(tmp_path, registered, reg)
        write_stat(tmp_path, other, oth)
        write_stat(tmp_path, 2, 0, flags=0x00200000)  # a kernel thread: never reported
        seen.append([b.pid for b in det.sample()])
        t[0] += 1.0  # one second per sample: ticks/100 = cores
        reg += 50
        oth += extra
        busy += 50 + extra
    assert det.scans == scans
    assert seen == [[other] if r else [] for r in reported]


def test_a_hog_that_exited_is_forgotten_at_once_not_after_the_quiet_window(tmp_path, spawn):
    """Killed, and not yet reaped by its parent (a zombie, PF_EXITING, its CPU time frozen): it was
    reported for the whole quiet window after its exit event, and the RM, which had removed it on
    that event, took it back in as a newcomer (epochs for nothing; test_cscs_cod under load)."""
    registered, other = 7, spawn(1, "sleep").pid
    t = [0.0]
    det = BusyDetector(threshold=0.15, window=2, registered=lambda: {registered}, proc=str(tmp_path),
                       clock=lambda: t[0], quiet_window=2)
    det.me = 1
    busy = reg = oth = 0
    seen = []
    for step in range(7):
        exiting = step >= 4
        write_machine(tmp_path, busy)
        write_stat(tmp_path, registered, reg)
        write_stat(tmp_path, other, oth, flags=PF_EXITING if exiting else 0)
        seen.append([b.pid for b in det.sample()])
        t[0] += 1.0
        reg += 50
        oth += 0 if exiting else HOG
        busy += 50 + (0 if exiting else HOG)
    assert seen == [[], [], [], [other], [], [], []]


# ---- what a thread wanted, from two readings (schedstat adds a wait only when the thread next runs) ----

def sched(run_ms: int, delay_ms: int, runnable: bool = True, voluntary: int = 0):
    from cod.facts.procfs import ThreadSched
    return ThreadSched(run_ms * 10**6, delay_ms * 10**6, runnable, voluntary)


MS = 10**6


@pytest.mark.parametrize("old,new,wanted_ms", [
    # starved the whole sample: runnable at both readings, never blocked, no CPU and no wait yet
    # in schedstat (measured at ten spinners a CPU): it wanted all 100 ms, not 0
    ({1: sched(40, 300)}, {1: sched(40, 300)}, 100),
    # a spinner that ran 4 ms and had 140 ms of wait added (part of it from the sample before):
    # still runnable and never blocked, so exactly the sample
    ({1: sched(40, 300)}, {1: sched(44, 440)}, 100),
    # it blocked in between (a voluntary switch): what schedstat says
    ({1: sched(40, 300)}, {1: sched(50, 320, voluntary=1)}, 30),
    # asleep at either reading: what schedstat says, at most the sample
    ({1: sched(40, 300, runnable=False)}, {1: sched(50, 320)}, 30),
    ({1: sched(40, 300)}, {1: sched(90, 500, runnable=False, voluntary=1)}, 100),
    ({1: sched(40, 300, False)}, {1: sched(40, 300, False)}, 0),
    # a thread born since the last reading is its baseline; one gone counts nothing
    ({1: sched(40, 300)}, {1: sched(40, 300), 2: sched(5, 5)}, 100),
    ({1: sched(40, 300), 2: sched(5, 5)}, {2: sched(5, 5, False, 1)}, 0),
    # two starved spinners: two cores
    ({1: sched(1, 1), 2: sched(1, 1)}, {1: sched(1, 1), 2: sched(3, 90)}, 200),
])
def test_what_threads_wanted_between_two_readings(old, new, wanted_ms):
    from cod.rm.enforce.busy import wanted_ns
    assert wanted_ns(old, new, 100 * MS) == wanted_ms * MS


def test_machine_stat_gives_cpus_and_runnable_threads():
    from cod.facts.procfs import machine_runnable, machine_ticks, per_cpu_ticks
    stat = (b"cpu  10 1 4 100 5 0 0 0 0 0\ncpu0 5 0 2 50 0 0 0 0 0 0\ncpu1 5 1 2 50 5 0 0 0 0 0\n"
            b"intr 1\nctxt 5\nprocs_running 9\nprocs_blocked 0\n")
    assert machine_ticks(stat) == (15, 105) and machine_runnable(stat) == (2, 9)
    assert per_cpu_ticks(stat) == {0: (7, 50), 1: (8, 55)}
    assert machine_runnable(b"cpu  1 0 0 1 0 0 0 0\ncpu0 1 0 0 1 0 0 0 0\n") == (1, 0)  # no procs_running


def big_machine_stat(cpus: int, irqs: int, running: int) -> bytes:
    """/proc/stat of a machine with many CPUs and interrupt lines: several pages long."""
    lines = [b"cpu  100 0 0 900 0 0 0 0 0 0"] + [b"cpu%d 1 0 0 9 0 0 0 0 0 0" % i for i in range(cpus)]
    lines.append(b"intr 12345 " + b" ".join(b"%d" % (i % 97) for i in range(irqs)))
    lines += [b"ctxt 5", b"procs_running %d" % running, b"procs_blocked 0", b""]
    return b"\n".join(lines)


def test_kept_files_read_a_stat_file_longer_than_a_page(tmp_path):
    # The detector reads /proc/stat through KeptFiles. A machine with 64 CPUs and ~2,000
    # interrupts writes ~8 KB; one page read lost the CPU lines past it and procs_running, and
    # with it every "saturated machine" verdict.
    from cod.facts.procfs import KeptFiles, machine_runnable
    path = tmp_path / "stat"
    path.write_bytes(big_machine_stat(64, 2000, 200))
    assert path.stat().st_size > 4096
    kept = KeptFiles()
    try:
        for _ in range(2):  # the first read finds the size, the second starts from it
            data = kept.read(str(path))
            assert data == path.read_bytes()
            assert machine_runnable(data) == (64, 200)
        path.write_bytes(big_machine_stat(2, 10, 3))  # shorter again: read whole, nothing stale
        assert kept.read(str(path)) == path.read_bytes()
    finally:
        kept.close()


@pytest.mark.parametrize("idle,runnable,cpus,hidden", [
    (0.0, 9, 2, True),  # saturated, more runnable than CPUs: CPU time hides who wants more
    (0.0, 2, 2, False),  # exactly full: every runnable thread has its CPU
    (1.0, 9, 2, False),  # idle time left: a hog gets what it wants, CPU time tells
    (0.0, 0, 0, False),  # a /proc/stat without the figures
])
def test_demand_is_hidden_only_on_a_saturated_machine(idle, runnable, cpus, hidden):
    from cod.rm.busy import BusyPolicy
    assert BusyPolicy(threshold=0.5).demand_hidden(idle, runnable, cpus) is hidden


@pytest.mark.parametrize("recent,threads,demand", [
    ([0.8, 1.0, 0.9], 1, 0.9),  # the window's mean
    ([6.67, 1.0, 1.0], 1, 1.0),  # a clock's artefact: one thread uses one core at most
    ([3.0, 3.2, 2.8], 2, 2.0),
    ([3.0, 3.0, 3.0], 4, 3.0),  # under the bound: as measured
    ([1.0], 0, 1.0),  # a thread count the kernel did not give: no bound
])
def test_a_process_demands_at_most_a_core_per_thread(recent, threads, demand):
    from cod.rm.busy import BusyPolicy
    assert BusyPolicy(threshold=0.5).demand(recent, threads) == pytest.approx(demand)


def test_a_one_thread_hog_measured_above_a_core_is_reported_at_one(tmp_path, spawn):
    # A loaded TCG guest's clocks made a one-thread spinner measure 6.67 cores in one sample
    # (CI-like clean-clone run, tests/vm/test_rm_numa.py); the report must not pass that on.
    other = spawn(1, "sleep").pid  # a real pid, so its affinity can be read
    t = [0.0]
    det = BusyDetector(threshold=0.15, window=2, registered=lambda: set(), proc=str(tmp_path),
                       clock=lambda: t[0], quiet_window=2)
    det.me = 1
    busy = oth = 0
    reported = []
    for extra in (0, 20, 667, 20):
        oth += extra
        busy += extra
        write_machine(tmp_path, busy)
        write_stat(tmp_path, other, oth)  # num_threads 1
        reported = det.sample()
        t[0] += 1.0
    assert [b.pid for b in reported] == [other]
    assert reported[0].cpu == 1.0  # the window (6.67, 0.2) means 3.4 cores: bounded by its one thread


def test_a_reading_delayed_within_a_sample_is_divided_by_its_own_time(tmp_path, spawn):
    # A loaded machine delays the scan between a sample's start and its reading of a process:
    # samples 2 s apart, readings 0, 0.9, 1.8 and 2.7 s late, of a two-thread process using one
    # core all along.  Its CPU time over the samples' interval said 1.45 cores (and a one-thread
    # spinner of test_rm_newcomer.py took a registered task's CPU); over its readings' own, 1.
    other = spawn(1, "sleep").pid
    t, calls = [0.0], [0]
    late = 0.0

    def clock() -> float:  # the sample's start first, then the readings, `late` after it
        calls[0] += 1
        return t[0] if calls[0] == 1 else t[0] + late

    det = BusyDetector(threshold=0.15, window=2, registered=lambda: set(), proc=str(tmp_path), clock=clock,
                       quiet_window=2)
    det.me = 1
    reported = []
    for sample in range(4):
        late = 0.9 * sample
        write_machine(tmp_path, round(100 * (t[0] + late)))
        write_stat(tmp_path, other, round(100 * (t[0] + late)), threads=2)  # one core since 0
        calls[0] = 0
        reported = det.sample()
        t[0] += 2.0
    assert [b.pid for b in reported] == [other]
    assert reported[0].cpu == pytest.approx(1.0)


@pytest.mark.parametrize("cores,age,read", [(0.3, 60.0, True), (0.2, 60.0, False), (0.0, 0.5, True), (0.0, 5.0, False)])
def test_wait_baseline_for_processes_busy_over_their_life_or_young(cores, age, read):
    from cod.rm.busy import BusyPolicy
    assert BusyPolicy(threshold=0.5).worth_a_wait_baseline(cores, age) is read


def test_thread_sched_reads_schedstat_state_and_voluntary_switches(tmp_path):
    from cod.facts import procfs
    task = tmp_path / "7" / "task"
    for tid, state, vol in [(7, "S", 12), (8, "R", 0)]:
        (task / str(tid)).mkdir(parents=True)
        (task / str(tid) / "schedstat").write_text(f"{tid * 1000} {tid * 10} 4\n")
        (task / str(tid) / "stat").write_text(f"{tid} (a b) c) {state} 1 " + "0 " * 40 + "\n")
        (task / str(tid) / "status").write_text(f"Name:\tx\nvoluntary_ctxt_switches:\t{vol}\nnonvoluntary_ctxt_switches:\t99\n")
    assert procfs.threads_sched(7, str(tmp_path)) == {
        7: procfs.ThreadSched(7000, 70, False, 12), 8: procfs.ThreadSched(8000, 80, True, 0)}
    assert procfs.threads_sched(9, str(tmp_path)) == {} and procfs.thread_sched(7, 9, str(tmp_path)) is None

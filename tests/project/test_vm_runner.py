"""The guest runner's decisions on the host: when a guest is booted again, when its console is
shown, and how its stderr is split (tests/vm/guestconsole.py). The guests themselves run in
make test's vm-suites."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers.paths import TESTS

sys.path.insert(0, str(TESTS / "vm"))
from guestconsole import (BOOT_ATTEMPTS, CONSOLE_TAIL_LINES, FIRST_ALARMS_KEPT, SCRIPT_STARTED,  # noqa: E402
                          MEMORY_MAP_RACE, PATCHING_RACE, Outcome, StderrSplitter, headline, kept_console,
                          outcome)
from vmrun import KEPT_CPUSET, ROOT, VmError, guest_pytest, run_tests, rw_dirs  # noqa: E402

PANIC = ["[    4.030108] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI",
         "[    4.032216] RIP: 0010:sched_clock_cpu+0x9/0x190",
         "[    4.032745] Kernel panic - not syncing: Fatal exception in interrupt"]
OTHER_PANIC = ["[    0.021879] Kernel panic - not syncing: kernel: panic_on_warn set ..."]
QUIET = ["[    4.440918] Invalid ELF header magic: != ELF"]
WARNING = ["[  120.1] BUG: soft lockup - CPU#1 stuck for 22s! [python:301]"]
# As the CI's console ended on 2026-11-28 (loglevel=4: the boot's first lines, then QEMU's abort).
QEMU_ABORT = ["printk: legacy bootconsole [earlyser0] enabled",
              "qemu-system-x86_64: ../../hw/pci/msix.c:218: msix_table_mmio_write: Assertion "
              "`addr + size <= dev->msix_entries_nr * PCI_MSIX_ENTRY_SIZE' failed."]
QEMU_ERROR = ["qemu-system-x86_64: -numa node,memdev=m0: memdev=m0 is ambiguous"]  # not an abort

OUTCOMES = [
    # rc, script started, console, attempt -> boot again, show console
    (0, True, QUIET, 1, Outcome(False, False)),
    (0, True, PANIC, 1, Outcome(False, False)),          # the tests passed: nothing to say
    (255, False, PANIC, 1, Outcome(True, False, PATCHING_RACE)),        # the boot race: boot again
    (255, False, PANIC, BOOT_ATTEMPTS - 1, Outcome(True, False, PATCHING_RACE)),
    (255, False, PANIC, BOOT_ATTEMPTS, Outcome(False, True)),   # attempts used up
    (255, True, PANIC, 1, Outcome(True, True, PATCHING_RACE)),  # the race during the tests: run again, console shown
    (255, False, QEMU_ABORT, 1, Outcome(True, False, MEMORY_MAP_RACE)),  # QEMU aborted booting: boot again
    (255, False, QEMU_ABORT, BOOT_ATTEMPTS, Outcome(False, True)),      # attempts used up
    (255, True, QEMU_ABORT, 1, Outcome(True, True, MEMORY_MAP_RACE)),   # during the tests: run again
    (255, True, PANIC + QEMU_ABORT, 1, Outcome(True, True, MEMORY_MAP_RACE)),  # the abort named first
    (0, True, QEMU_ABORT, 1, Outcome(False, False)),     # cannot be, but a pass is a pass
    (255, False, QEMU_ERROR, 1, Outcome(False, True)),   # QEMU refused its options: reported, never retried
    (255, True, PANIC, BOOT_ATTEMPTS, Outcome(False, True)),    # attempts used up
    (255, True, OTHER_PANIC, 1, Outcome(False, True)),   # another panic during the tests: reported
    (255, False, OTHER_PANIC, 1, Outcome(False, True)),  # another boot panic: reported
    (255, False, QUIET, 1, Outcome(False, True)),        # died, no panic (qemu, OOM): reported
    (1, False, QUIET, 1, Outcome(False, False)),         # pytest's own failure before 'started'?
    (1, True, QUIET, 1, Outcome(False, False)),          # tests failed, kernel said nothing
    (1, True, WARNING, 1, Outcome(False, True)),         # tests failed, kernel complained
    (124, True, QUIET, 1, Outcome(False, True)),         # timeout
]


@pytest.mark.parametrize("rc,started,console,attempt,expected", OUTCOMES)
def test_outcome(rc, started, console, attempt, expected):
    assert outcome(rc, started, console, attempt) == expected


def test_headline_is_the_first_alarm():
    assert headline(QUIET + PANIC) == PANIC[0].strip()
    assert headline(PANIC[1:] + PANIC[:1]) == PANIC[0].strip()  # the Oops, though its RIP came first
    assert headline(QUIET) == QUIET[0]
    assert headline([]) == "(the console said nothing)"
    assert headline(PANIC + QEMU_ABORT) == QEMU_ABORT[1]  # the emulator's abort is the cause


def test_the_guest_script_announces_its_start_first():
    script = guest_pytest("2x2", ["-x", "tests/vm"])
    assert script.startswith(f"echo '{SCRIPT_STARTED}' >&2 && ")


@pytest.mark.parametrize("cgroupfs_is_a_dir", [True, False])
def test_the_guest_script_keeps_a_cpuset_before_pytest_and_goes_on_if_it_cannot(tmp_path, cgroupfs_is_a_dir):
    # The script's first part (up to pytest), run on a stand-in for /sys/fs/cgroup: a directory
    # (the controller enabled, the cpuset made) or a plain file (both refused: said, and pytest
    # still starts).
    before_pytest = guest_pytest("2x2", ["-x", "tests/vm"]).split(" && cd ", 1)[0]
    fake = tmp_path / "cgroup"
    fake.mkdir() if cgroupfs_is_a_dir else fake.write_text("")
    done = subprocess.run(["bash", "-c", before_pytest.replace("/sys/fs/cgroup", str(fake)) + " && echo next"],
                          capture_output=True, text=True, timeout=30)
    assert done.stdout == "next\n"
    kept = fake / os.path.basename(KEPT_CPUSET)
    if cgroupfs_is_a_dir:
        assert (fake / "cgroup.subtree_control").read_text() == "+cpuset\n" and kept.is_dir()
        assert "no cpuset kept" not in done.stderr
    else:
        assert "no cpuset kept" in done.stderr and not kept.exists()


def test_the_splitter_keeps_the_boot_and_console_and_passes_the_scripts_lines(capfd):
    read_fd, write_fd = os.pipe()
    with os.fdopen(read_fd, "rb") as reader:
        splitter = StderrSplitter(reader)
        with os.fdopen(write_fd, "wb") as writer:
            writer.write(b"Probing EDD (edd=off to disable)... ok\n"
                         b"[    0.000000] Linux version 6.12\n"
                         + SCRIPT_STARTED.encode() + b"\n"
                         b"Traceback: from the script\n"
                         b"[   30.5] BUG: soft lockup\n")
        console = splitter.join()
    assert splitter.script_started
    assert console == ["Probing EDD (edd=off to disable)... ok", "[    0.000000] Linux version 6.12",
                       "[   30.5] BUG: soft lockup"]
    assert capfd.readouterr().err == "Traceback: from the script\n"


def test_the_splitter_keeps_qemus_abort_during_the_tests(capfd):
    # After the script's start only console lines are kept; QEMU's abort is kept too, or a race
    # during the tests would look like a guest that died saying nothing.
    read_fd, write_fd = os.pipe()
    with os.fdopen(read_fd, "rb") as reader:
        splitter = StderrSplitter(reader)
        with os.fdopen(write_fd, "wb") as writer:
            writer.write((SCRIPT_STARTED + "\n" + "tests/vm/test_memory.py ...\n" + QEMU_ABORT[1] + "\n").encode())
        console = splitter.join()
    assert console == [QEMU_ABORT[1]]
    assert outcome(255, True, console, 1) == Outcome(True, True, MEMORY_MAP_RACE)
    assert capfd.readouterr().err == "tests/vm/test_memory.py ...\n"


def console_line(n: int, text: str = "ok") -> str:
    return f"[{n:5d}.000000] {text}"


@pytest.mark.parametrize("alarms,tail,seen,kept", [
    # everything still in the tail: the tail alone
    ([(2, "Oops #1")], ["a", "Oops #1", "b"], 3, ["a", "Oops #1", "b"]),
    # the first Oops scrolled out of the tail: it comes first, then how much was left out
    ([(1, "Oops #1"), (90, "Oops #2")], ["Oops #2", "z"], 91, ["Oops #1", "... (88 more console lines left out)", "Oops #2", "z"]),
    ([], ["z"], 500, ["z"]),  # no alarm at all
])
def test_the_first_alarms_outlive_the_tail(alarms, tail, seen, kept):
    assert kept_console(alarms, tail, seen) == kept


def test_a_panics_first_oops_is_its_headline_after_a_long_trace():
    # Three Oopses with 40-line traces each: the tail of 60 lines holds only the last, and the
    # headline must still be the first (the cause), as it was not in a CI log before this fix.
    read_fd, write_fd = os.pipe()
    with os.fdopen(read_fd, "rb") as reader:
        splitter = StderrSplitter(reader)
        with os.fdopen(write_fd, "wb") as writer:
            n = 0
            for k in (1, 2, 3):
                n += 1
                writer.write((console_line(n, f"Oops: int3: 0000 [#{k}] PREEMPT SMP NOPTI") + "\n").encode())
                for _ in range(40):
                    n += 1
                    writer.write((console_line(n, "  ? trace_frame+0x1/0x2") + "\n").encode())
            n += 1
            writer.write((console_line(n, "Kernel panic - not syncing: Fatal exception") + "\n").encode())
        console = splitter.join()
    assert n > CONSOLE_TAIL_LINES and 3 <= FIRST_ALARMS_KEPT
    assert headline(console) == console_line(1, "Oops: int3: 0000 [#1] PREEMPT SMP NOPTI")
    assert outcome(255, False, console, 1) == Outcome(True, False, PATCHING_RACE)  # still the boot race
    # the Oopses #1 and #2 (the tail starts within #3's trace), the count, the tail
    assert console[:3] == [console_line(1, "Oops: int3: 0000 [#1] PREEMPT SMP NOPTI"),
                           console_line(42, "Oops: int3: 0000 [#2] PREEMPT SMP NOPTI"),
                           f"... ({n - CONSOLE_TAIL_LINES - 2} more console lines left out)"]
    assert len(console) == CONSOLE_TAIL_LINES + 3


def test_the_guest_writes_through_only_to_directories_of_the_project():
    assert rw_dirs(("bench/experiments/results",)) == [os.path.join(ROOT, "bench", "experiments", "results")]
    for bad in ("/tmp", "..", ".", "bench/experiments/no-such-dir"):
        with pytest.raises(VmError, match="not an existing directory inside the project"):
            rw_dirs((bad,))


def test_a_guest_that_qemu_aborted_is_booted_again(tmp_path, capfd):
    # A stand-in for virtme-ng: QEMU's abort the first time (as at the CI's), the tests' start
    # and a pass the second. The runner boots again once, says why, and returns the pass.
    boots, abort = tmp_path / "boots", tmp_path / "abort"
    abort.write_text(QEMU_ABORT[1] + "\n")  # quotes and a backquote: cat, not echo
    fake_vng = tmp_path / "vng"
    fake_vng.write_text(f"""#!/bin/sh
echo x >> {boots}
if [ "$(wc -l < {boots})" -eq 1 ]; then
  cat {abort} >&2
  exit 255
fi
echo '{SCRIPT_STARTED}' >&2
echo 'the tests passed'
""")
    fake_vng.chmod(0o755)
    assert run_tests("2x2", [str(fake_vng)], dict(os.environ), timeout=60, verbose=False) == 0
    assert boots.read_text() == "x\nx\n"
    err = capfd.readouterr().err
    assert f"{MEMORY_MAP_RACE} while booting, before any test ran" in err
    assert "booting it again" in err

"""The guest's stderr: its kernel console until the test script starts, the script's stderr after.

virtme-ng writes both the kernel console (warnings and worse: ``loglevel=4``) and the script's
stderr to its own stderr. Everything before the script's start marker is the boot (console,
boot loader, qemu's and virtme-ng's own errors): kept, not shown. After it, console lines are
kept and the script's lines pass through. When the guest ends, ``outcome()`` decides from what
was kept whether to boot again, and whether the console is worth showing.

Why boot again: QEMU 7.2's multi-threaded TCG sometimes lets a vCPU run the int3 the kernel
plants while patching its own code after the patch is done (``Oops: int3`` in
``sched_clock_cpu`` as the kernel marks its clock stable, or in ``pv_native_safe_halt``, then
``Kernel panic - not syncing``),
2 of 48 4x2 boots here, and one at the CI's. It happens before any test ran, so a new boot
loses nothing. The same race struck once during the tests (1 of 2 2x2 suites of one
clean-clone pair, session 6): ``Oops: int3`` in ``__alloc_pages`` at a static branch (a 5-byte
NOP the kernel patches when a static key flips; there most likely ``cpusets_enabled()``, which
flips whenever the number of cpusets goes from 0 to 1 or back, as the enforcement tests make
and remove theirs). Then the whole suite runs again in a new guest
(each test touches only what it made), up to BOOT_ATTEMPTS guests in all, and the console is
shown. Any other panic is reported and never retried.

The same goes for QEMU itself aborting on one of its own assertions (``qemu-system-x86_64:
../../hw/pci/msix.c:218: msix_table_mmio_write: Assertion ... failed``, at the CI's, 2 s into a
boot, as the guest's virtio drivers set up their MSI-X vectors). A guest cannot legitimately
make its emulator abort; QEMU 7.2's multi-threaded TCG can: when the memory map changes (a PCI
BAR or MSI-X enabled at boot), the thread that changes it installs the new dispatch table for
every vCPU while another vCPU still holds TLB entries whose section numbers index the old one,
so its next MMIO write lands in another device's region at an offset past its end.  Upstream
fixed it in QEMU 8.1.1 (0d58c660689f, "softmmu: Use async_run_on_cpu in tcg_commit": each vCPU
switches tables itself, with its TLB flush), and made such a lookup assert (86e4f93d827);
Debian 12 ships 7.2.
"""

from __future__ import annotations

import collections
import re
import sys
import threading
from dataclasses import dataclass

# The guest prints this on its stderr first: the boot is over and the script runs.
SCRIPT_STARTED = "cod-vm: the script starts"
BOOT_ATTEMPTS = 3
CONSOLE_TAIL_LINES = 60
FIRST_ALARMS_KEPT = 8  # a panic's first Oops is its cause; later ones can push it out of the tail
PYTEST_EXIT_CODES = range(0, 6)  # pytest's own: ok, failed, interrupted, internal, usage, none
_CONSOLE_LINE = re.compile(r"^\[\s*\d+\.\d+\] ")
# QEMU's own assertion: the emulator aborted, whatever the guest's kernel was doing.
_EMULATOR_ABORT = re.compile(r"^qemu-system-\S+: .*Assertion .* failed")
_ALARM = re.compile(r"Kernel panic|Oops|BUG:|general protection|RIP: |" + _EMULATOR_ABORT.pattern)
_HEADLINES = ("qemu-system-", "Oops", "BUG:", "general protection", "Kernel panic", "RIP: ")  # the most telling first


@dataclass(frozen=True)
class Outcome:
    boot_again: bool
    show_console: bool
    race: str = ""  # which of QEMU's TCG races ended the guest, when it is booted again


PATCHING_RACE = "the kernel panicked in QEMU's code-patching race"
MEMORY_MAP_RACE = "QEMU aborted in its TCG's memory-map race"


def tcg_race(rc: int, console: list[str]) -> str:
    """Which known race of QEMU 7.2's TCG (the module's doc) ended a guest, or "". Pure."""
    if rc == 0:
        return ""
    if any(_EMULATOR_ABORT.search(line) for line in console):
        return MEMORY_MAP_RACE
    panicked = any("Kernel panic" in line for line in console)
    if panicked and any("Oops: int3" in line for line in console):
        return PATCHING_RACE
    return ""


def outcome(rc: int, script_started: bool, console: list[str], attempt: int) -> Outcome:
    """What to do once a guest ended with ``rc``; ``attempt`` counts from 1. Pure."""
    race = tcg_race(rc, console)
    if race and attempt < BOOT_ATTEMPTS:
        # Before the tests: nothing lost. During them: the whole suite runs again in a new guest
        # (each test touches only what it made), and the console is shown, for the record.
        return Outcome(boot_again=True, show_console=script_started, race=race)
    if rc == 0:
        return Outcome(boot_again=False, show_console=False)
    alarming = any(_ALARM.search(line) for line in console)
    return Outcome(boot_again=False, show_console=alarming or rc not in PYTEST_EXIT_CODES)


def kept_console(first_alarms: list[tuple[int, str]], tail: list[str], seen: int) -> list[str]:
    """The console as kept: the first alarming lines that the tail no longer holds (each with its
    line number, counting from 1), a line saying how many were left out, then the tail of the
    ``seen`` lines.  Pure."""
    tail_starts = seen - len(tail) + 1
    early = [line for number, line in first_alarms if number < tail_starts]
    if not early:
        return list(tail)
    return early + [f"... ({tail_starts - 1 - len(early)} more console lines left out)"] + list(tail)


def headline(console: list[str]) -> str:
    """The first line that says what went wrong (an Oops, a BUG, a panic), for a one-line log."""
    for what in _HEADLINES:
        for line in console:
            if what in line:
                return line.strip()
    return console[-1].strip() if console else "(the console said nothing)"


class StderrSplitter:
    """Reads the guest's stderr pipe in a thread: the console kept (its last lines), the
    script's lines copied to this program's stderr."""

    def __init__(self, pipe, echo_console: bool = False) -> None:
        self.script_started = False
        self._echo_console = echo_console
        self.console: collections.deque[str] = collections.deque(maxlen=CONSOLE_TAIL_LINES)
        self.first_alarms: list[tuple[int, str]] = []  # (line number, line)
        self.seen = 0  # console lines read
        self._pipe = pipe
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for raw in iter(self._pipe.readline, b""):
            line = raw.decode("utf-8", "replace")
            if self._echo_console:  # --verbose: the whole console, as it comes
                sys.stderr.write(line)
                sys.stderr.flush()
            if not self.script_started:
                if line.strip() == SCRIPT_STARTED:
                    self.script_started = True
                else:
                    self._keep(line.rstrip("\n"))
            elif _CONSOLE_LINE.match(line) or _EMULATOR_ABORT.search(line):
                self._keep(line.rstrip("\n"))
            elif not self._echo_console:
                sys.stderr.write(line)
                sys.stderr.flush()

    def _keep(self, line: str) -> None:
        self.seen += 1
        self.console.append(line)
        if len(self.first_alarms) < FIRST_ALARMS_KEPT and _ALARM.search(line):
            self.first_alarms.append((self.seen, line))

    def join(self) -> list[str]:
        """Once the guest is gone: everything read, and the console as kept (``kept_console``)."""
        self._thread.join()
        return kept_console(self.first_alarms, list(self.console), self.seen)

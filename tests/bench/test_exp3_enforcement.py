"""bench/experiments/enforcement.py's accounting: a newcomer's run time set against the samples of
the CPUs the RM kept for a task (Figure 6 in the sched_ext guest)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from helpers.paths import REPO

sys.path.insert(0, str(REPO / "bench" / "experiments"))
from enforcement import kept_throughout, newcomer_figures  # noqa: E402

MS = 1_000_000
# (sent, received, cores): the task holds 0-2, then from the third sample 0 and 2 only, then nothing.
SAMPLES = [(0, 10 * MS, frozenset({0, 1, 2})), (200 * MS, 210 * MS, frozenset({0, 1, 2})),
           (400 * MS, 410 * MS, frozenset({0, 2})), (600 * MS, 610 * MS, frozenset())]


@pytest.mark.parametrize("start, end, kept", [
    (20 * MS, 60 * MS, {0, 1, 2}),      # between two samples that agree
    (220 * MS, 260 * MS, {0, 2}),       # CPU 1 left before the next sample: not counted as held
    (5 * MS, 60 * MS, None),            # before the first sample was answered
    (420 * MS, 460 * MS, set()),        # the task held nothing afterwards
    (610 * MS, 650 * MS, None),         # after the last sample
    (20 * MS, 250 * MS, {0, 2}),        # across three samples
])
def test_kept_throughout(start, end, kept):
    got = kept_throughout(SAMPLES, start, end)
    assert (got if got is None else set(got)) == kept


def test_a_newcomer_is_charged_only_on_cpus_held_over_its_whole_slice():
    out = {"ns_per_cpu": {"1": 30 * MS, "3": 50 * MS},
           "slices": [[20 * MS, 60 * MS, 1, 10 * MS, 0],    # held: counted
                      [220 * MS, 260 * MS, 1, 10 * MS, 0],  # CPU 1 was being taken away: not counted
                      [420 * MS, 460 * MS, 1, 10 * MS, 0],  # the task held nothing
                      [20 * MS, 60 * MS, 3, 50 * MS, 0]]}   # never the task's CPU
    figures, rows = newcomer_figures(out, SAMPLES, t0_ns=0, arrival_s=0.01)
    assert figures["ms_on_task_cpus"] == 10 and figures["ms_total"] == 80
    assert figures["on_task_cpus_from_s"] == 0.01 and figures["on_task_cpus_until_s"] == 0.05
    assert figures["ms_while_task_held_none"] == 10 and figures["ms_unattributed"] == 0
    assert [(r["cpu"], r["on_task_cpus"], r["task_cpus"]) for r in rows] == [
        (1, True, "0 1 2"), (1, False, "0 2"), (1, False, "")]

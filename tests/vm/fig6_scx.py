"""Figure 6's scenario in the sched_ext guest, in both enforcement modes (issue 27): CSCS under
COD with an SLA, three CPU-bound newcomers arriving unpinned, once with the RM enforcing by
cpuset and once by sched_ext (scx_cod loaded), in one guest, one after the other.

Not collected by any suite (its name is not test_*.py): it runs alone, for its figures, with
the results directory written through to the host:

    flock /work/wt/vm.lock make vm-test VM_KERNEL=scx VM_RW=bench/experiments/results \\
        PYTEST_ARGS='-s tests/vm/fig6_scx.py'

It is bench/experiments/exp3_adaptability.py's COD variant, scaled for TCG (a small table, a
cost function calibrated here, an SLA from it), CSCS left 3 of the 4 CPUs, the newcomers
percpu programs that record where they ran.  It writes results/exp3_scx_guest.{json,csv,png}
and asserts only what TCG cannot blur: under sched_ext no newcomer ran on a CPU the RM kept
for CSCS; under cpuset they did (until the busy detector confined them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
EXP3 = os.path.join(ROOT, "bench", "experiments", "exp3_adaptability.py")
RESULTS = os.path.join(ROOT, "bench", "experiments", "results")
OUT = "exp3_scx_guest"
SLOW = 300  # seconds: the RM's start and an SKB query under TCG on a loaded host
# About 15 minutes of guest time in all at a moderate host load: the calibration, then
# 100 s of CSCS per mode with newcomers at 25, 50 and 75 s.
ARGS = ["--variants", "COD", "--enforce", "cpuset,sched_ext", "--percpu", "--calibrate",
        "--seconds", "100", "--every", "25", "--tuples-per-core", "150000", "--cscs-cpus", "3",
        "--sla-factor", "2.5", f"--rm-args=--set query_timeout_s={SLOW}", "--rm-start-timeout", str(SLOW),
        "--out", OUT]


@pytest.mark.timeout(3600)
def test_figure_6_under_cpuset_and_under_scx_cod(topo):
    assert os.path.exists("/sys/kernel/sched_ext/state"), "this guest's kernel has no sched_ext (VM_KERNEL=scx?)"
    proc = subprocess.run([sys.executable, EXP3, *ARGS], capture_output=True, text=True, timeout=3000)
    print(proc.stderr[-3000:])
    assert proc.returncode == 0, proc.stderr[-4000:]
    with open(os.path.join(RESULTS, f"{OUT}.json")) as f:
        figures = json.load(f)
    summary = figures["summary"]
    print(json.dumps({"sla_ms": figures["sla_ms"], "min_cores": figures["min_cores"],
                      "loadavg_guest": figures["machine_state_after"]["loadavg"],
                      **{mode: {k: v for k, v in s.items() if k not in ("cod_lines",)} for mode, s in summary.items()}},
                     indent=1))
    cpuset, scx = summary["COD cpuset"], summary["COD sched_ext"]
    assert cpuset["enforcement"]["in_force"].startswith("cpuset"), cpuset["enforcement"]
    assert scx["enforcement"]["in_force"].startswith("sched_ext (scheduler scx_cod"), scx["enforcement"]
    for s in (cpuset, scx):
        assert s["poller_error"] is None and s["allocation_samples"] > 0, s
        assert len(s["newcomers"]) == 3 and all(n["ms_total"] > 0 for n in s["newcomers"]), s["newcomers"]
    assert all(n["ms_on_task_cpus"] == 0 for n in scx["newcomers"]), scx["newcomers"]
    assert cpuset["newcomers_ms_on_cscs_cpus"] > 0, cpuset["newcomers"]

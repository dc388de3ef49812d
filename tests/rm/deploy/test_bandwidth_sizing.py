"""`cod bandwidth`'s arrays sized to the free memory (issue 32: 3 x 1,200 MiB on a machine with
4.7 GiB free, without a word): the pure rule, table-driven, and the command's lines."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cod.rm.deploy import DeployError
from cod.rm.deploy.measure.bandwidth import MIB, MIN_ARRAY_BYTES, Sizing, mem_available, size_arrays

GIB = 1 << 30
COD = [sys.executable, "-m", "cod.cli.main"]


@pytest.mark.parametrize("wanted, available, asked, array", [
    (1200 * MIB, 22 * GIB, False, 1200 * MIB),            # plenty: STREAM's rule as it is
    (1200 * MIB, int(4.7 * GIB), False, 802 * MIB),       # the machine: half of 4.7 GiB over 3
    (1200 * MIB, None, False, 1200 * MIB),                # MemAvailable unknown: as asked
    (64 * MIB, 384 * MIB, False, 64 * MIB),               # exactly the least that fits
    (4 * MIB, 1 * GIB, True, 4 * MIB),                    # a small --size-mib is kept
])
def test_sizes(wanted, available, asked, array):
    s = size_arrays(wanted, available, asked=asked)
    assert s.array_bytes == array and s.array_bytes % MIB == 0
    assert 3 * s.array_bytes <= (available or 3 * array) // 2 or available is None
    assert s.shrunk == (array < wanted)


@pytest.mark.parametrize("wanted, available, asked, says", [
    (1200 * MIB, 300 * MIB, False, "too little free memory to measure: 0.29 GiB available (MemAvailable)"),
    (4096 * MIB, 8 * GIB, True, "--size-mib 4096: 3 arrays of 4096 MiB need more than half of the 8.0 GiB "
                                "available (MemAvailable); at most 1365 MiB per array"),
])
def test_refusals_say_why(wanted, available, asked, says):
    with pytest.raises(DeployError, match="^" + says.replace("(", r"\(").replace(")", r"\)")):
        size_arrays(wanted, available, asked=asked)


def test_the_sentence_says_what_it_uses_and_what_shrinking_costs():
    assert Sizing(1200 * MIB, 1200 * MIB, 22 * GIB).sentence() == \
        "memory: 3 x 1200 MiB (3.5 GiB) of 22.0 GiB available (MemAvailable)"
    small = Sizing(802 * MIB, 1200 * MIB, int(4.7 * GIB)).sentence()
    assert small.startswith("memory: 3 x 802 MiB (2.3 GiB) of 4.7 GiB available (MemAvailable); 1200 MiB per array")
    assert "the figure may be high" in small
    assert MIN_ARRAY_BYTES == 64 * MIB


def test_the_command_says_what_it_uses_and_refuses_what_does_not_fit(tmp_path):
    run = subprocess.run([*COD, "bandwidth", "--no-store", "--size-mib", "2", "--iterations", "2"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "memory: 3 x 2 MiB (0.0 GiB) of " in run.stdout and "available (MemAvailable)" in run.stdout
    available = mem_available()
    assert available and available > 0
    too_much = available // MIB  # 3 arrays of all the available memory
    refused = subprocess.run([*COD, "bandwidth", "--no-store", "--size-mib", str(too_much)],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    [line] = refused.stderr.strip().splitlines()
    assert f"--size-mib {too_much}: 3 arrays of {too_much} MiB need more than half of the" in line
    assert "GB/s" not in refused.stdout  # nothing measured, nothing allocated


def test_the_matrix_pairs_each_cpu_node_with_every_node_or_itself():
    from cod.cli.bandwidth_cmd import pairs
    from cod.facts import machines

    m = machines.load("magnycours")
    assert pairs(m, [0, 5], local=False) == [(c, n) for c in (0, 5) for n in range(8)]
    assert pairs(m, [0, 5], local=True) == [(0, 0), (5, 5)]


def test_the_matrix_table_has_a_row_per_cpu_node_and_a_column_per_memory_node():
    from cod.cli.bandwidth_cmd import matrix_lines

    cells = [{"node": c, "memory_node": n, "bandwidth_bytes_per_s": (10 if c == n else 5) * 1e9 + c}
             for c in (0, 1) for n in (0, 1, 2) if (c, n) != (1, 2)]
    assert matrix_lines(cells) == ["GB/s triad, threads on the row's CPUs, memory on the column's node:",
                                   "cpu\\mem        0       1       2",
                                   "       0    10.00    5.00    5.00",
                                   "       1     5.00   10.00       -"]


def test_the_facts_of_a_run_are_written_by_the_one_writer():
    from cod.rm.deploy.measure.bandwidth import fact, matrix_fact

    assert fact(2, 7.9e9) == "numa_bandwidth(2, 7900000000)"
    assert matrix_fact({"node": 0, "memory_node": 3, "bandwidth_bytes_per_s": 4.5e9}) == "memory_bandwidth(0, 3, 4500000000)"

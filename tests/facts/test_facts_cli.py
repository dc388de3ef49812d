"""`cod facts` end to end, through the installed console command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cod.facts import machines, text
from helpers.data import HWLOC_DIR

COD = Path(sys.executable).with_name("cod")


def cod(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(COD), "facts", *args], capture_output=True, text=True, timeout=60)


def test_json_of_this_machine_has_the_documented_keys():
    out = cod("--format", "json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    for key in ("packages", "numa_nodes", "caches", "cores", "pus"):
        assert data[key], key
    assert {"id", "cpus", "memory_bytes", "free_bytes", "distances"} <= set(data["numa_nodes"][0])
    assert {"level", "size_bytes", "cpus"} <= set(data["caches"][0])
    assert {"id", "package", "numa_node", "pus"} <= set(data["cores"][0])


@pytest.mark.parametrize("name", machines.names())
def test_prolog_of_a_reference_machine(name):
    out = cod("--machine", name, "--format", "prolog")
    assert out.returncode == 0, out.stderr
    m = machines.load(name)
    assert out.stdout.count("\npu(") == len(m.pus)
    assert out.stdout.startswith("machine_name(")


def test_text_of_an_hwloc_file():
    out = cod("--hwloc", str(HWLOC_DIR / "64amd64-4p2n4ca2co.xml"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("Machine 64amd64-4p2n4ca2co")
    assert sum(line.strip().startswith("Package P#") for line in lines) == 4
    assert sum(line.strip().startswith("NUMANode P#") for line in lines) == 8
    assert sum(line.strip().startswith("L3 (") for line in lines) == 8


@pytest.mark.parametrize("args, complaint", [
    (["--hwloc", "{tmp}/bad.xml"], "bad.xml: not well-formed XML"),
    (["--hwloc", "{tmp}/absent.xml"], "absent.xml: no such file"),
    (["--machine", "nosuch"], "unknown machine 'nosuch'"),
    (["--sysfs-root", "{tmp}/nosuchdir"], "nosuchdir: no such directory"),
    (["--sysfs-root", "{tmp}"], "no cpuN directories"),
])
def test_errors_are_one_line_without_traceback(tmp_path, args, complaint):
    (tmp_path / "bad.xml").write_text('<topology version="2.0"><object type="Machine"')
    out = cod(*[a.format(tmp=tmp_path) for a in args])
    assert out.returncode != 0
    assert out.stdout == ""
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    assert complaint in out.stderr


def test_sources_are_mutually_exclusive():
    out = cod("--machine", "magnycours", "--hwloc", "x.xml")
    assert out.returncode == 2
    assert "not allowed with" in out.stderr


@pytest.mark.parametrize("name, outer, inner", [
    ("magnycours", "Package P#0", "NUMANode P#0"),  # two nodes per package
    ("nehalem-ex", "Package P#0", "NUMANode P#0"),  # equal sets: package outside
])
def test_text_nests_by_containment(name, outer, inner):
    lines = text.render(machines.load(name)).splitlines()
    i = next(k for k, line in enumerate(lines) if line.strip().startswith(outer + " "))
    j = next(k for k, line in enumerate(lines) if line.strip().startswith(inner + " "))
    indent = lambda s: len(s) - len(s.lstrip())  # noqa: E731
    assert j == i + 1 and indent(lines[j]) > indent(lines[i])


def test_text_keeps_equal_nodes_side_by_side():
    # KNL: DRAM node 0 and MCDRAM node 1 cover the same CPUs; neither holds the other.
    from cod.facts import hwloc_xml
    m = hwloc_xml.load(HWLOC_DIR / "8intel64-fakeKNL-A2A-hybrid.rootattachednumas.xml")
    node_lines = [line for line in text.render(m).splitlines() if "NUMANode P#" in line]
    assert len(node_lines) == 2
    assert len({len(line) - len(line.lstrip()) for line in node_lines}) == 1

"""Prolog facts for the SKB: exact schema, quoting, determinism, and that SWI-Prolog loads them."""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cod.facts import hwloc_xml, machines
from cod.facts.model import Machine
from cod.facts.prolog import atom, to_prolog
from helpers.data import HWLOC_DIR


# name -> arity: the schema the SKB loads (see cod.facts.prolog).
SCHEMA = {
    "machine_name": 1, "package": 2, "numa_node": 3, "numa_free": 2, "numa_bandwidth": 2,
    "node_distance": 3,
    "core": 4, "pu": 4, "pu_offline": 1, "cache": 4, "allowed_cpus": 1, "allowed_mems": 1,
    "total_memory": 1,
}


def sample_machines() -> list[Machine]:
    ms = [machines.load(n) for n in machines.names()]
    # Files with unknowns: no node memory (16em64t), no packages (KNL), a v1 file.
    for name in ("16em64t-4s2c2t.xml", "8intel64-fakeKNL-A2A-hybrid.rootattachednumas.xml",
                 "28intel64-2p2g7c-CoDgroups.v1.xml"):
        if (HWLOC_DIR / name).is_file():
            ms.append(hwloc_xml.load(HWLOC_DIR / name))
    # Offline PUs and restricted sets.
    base = machines.load("shanghai")
    ms.append(dataclasses.replace(
        base, name="it's odd",
        pus=tuple(dataclasses.replace(p, online=p.id != 15) for p in base.pus),
        allowed_cpus=(0, 1, 2, 3), allowed_mems=(0,)))
    return ms


SAMPLES = sample_machines()


@pytest.mark.parametrize("text, quoted", [
    ("magnycours", "magnycours"),
    ("nehalem-ex", "'nehalem-ex'"),
    ("Big", "'Big'"),
    ("it's", "'it\\'s'"),
    ("a\\b", "'a\\\\b'"),
    ("", "''"),
    ("192em64t-24n8c2t", "'192em64t-24n8c2t'"),
])
def test_atom_quoting(text, quoted):
    assert atom(text) == quoted


@pytest.mark.parametrize("machine", SAMPLES, ids=lambda m: m.name)
def test_every_line_is_one_fact_of_the_schema(machine):
    text = to_prolog(machine)
    assert text.endswith(".\n")
    seen = set()
    for line in text.splitlines():
        m = re.fullmatch(r"([a-z_]+)\((.*)\)\.", line)
        assert m, line
        name, args = m.groups()
        assert name in SCHEMA, line
        # Arity: count top-level commas (lists and quoted atoms hold commas too).
        depth, commas, quoted = 0, 0, False
        for ch in args:
            if ch == "'":
                quoted = not quoted
            elif not quoted and ch == "[":
                depth += 1
            elif not quoted and ch == "]":
                depth -= 1
            elif not quoted and ch == "," and depth == 0:
                commas += 1
        assert commas + 1 == SCHEMA[name], line
        seen.add(name)
    assert {"machine_name", "numa_node", "core", "pu", "total_memory"} <= seen
    assert ("pu_offline" in seen) == any(not p.online for p in machine.pus)
    assert ("allowed_cpus" in seen) == (machine.allowed_cpus is not None)


@pytest.mark.parametrize("machine", SAMPLES, ids=lambda m: m.name)
def test_text_does_not_depend_on_input_order(machine):
    shuffled = dataclasses.replace(
        machine, packages=machine.packages[::-1], numa_nodes=machine.numa_nodes[::-1],
        caches=machine.caches[::-1], cores=machine.cores[::-1], pus=machine.pus[::-1])
    assert to_prolog(shuffled) == to_prolog(machine)


def test_unknowns_are_the_atom_unknown():
    knl = [m for m in SAMPLES if m.name.startswith("8intel64-fakeKNL")]
    uma = [m for m in SAMPLES if m.name == "16em64t-4s2c2t"]
    if not knl or not uma:
        pytest.skip("hwloc test files not present")
    assert "pu(0,0,unknown,0)." in to_prolog(knl[0])  # no Package object in that file
    assert "numa_node(0,unknown,[" in to_prolog(uma[0])  # no local_memory in that file
    assert "total_memory(unknown)." in to_prolog(uma[0])


SWIPL = shutil.which("swipl")


@pytest.mark.skipif(SWIPL is None, reason="swi-prolog not installed")
def test_swi_prolog_loads_the_facts(tmp_path):
    """One swipl run loads every sample and answers counting queries about it."""
    goals = []
    # The SKB declares the schema dynamic: a machine without a distance matrix or
    # offline PUs has no such facts, and a query must fail, not raise.
    declared = ",".join(f"{name}/{arity}" for name, arity in SCHEMA.items())
    for i, machine in enumerate(SAMPLES):
        path = tmp_path / f"m{i}.pl"
        path.write_text(to_prolog(machine))
        goals.append(
            f"forall(member(PI, [{declared}]), dynamic(m{i}:PI)),"
            f"load_files(m{i}:'{path}', []),"
            f"m{i}:machine_name(N{i}), aggregate_all(count, m{i}:pu(_,_,_,_), P{i}),"
            f"aggregate_all(count, m{i}:core(_,_,_,_), C{i}),"
            f"aggregate_all(count, m{i}:node_distance(_,_,_), D{i}),"
            f"format('~w|~w|~w|~w~n', [N{i}, P{i}, C{i}, D{i}])")
    script = ", ".join(goals)
    out = subprocess.run([SWIPL, "-q", "-g", script, "-t", "halt"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Warning" not in out.stderr and "error" not in out.stderr.lower(), out.stderr
    rows = out.stdout.splitlines()
    assert rows == [
        f"{m.name}|{sum(p.online for p in m.pus)}|{len(m.cores)}|"
        f"{sum(len(n.distances) for n in m.numa_nodes)}"
        for m in SAMPLES
    ]

"""`cod deploy-plan`: formats, options and errors."""

from __future__ import annotations

import io
import json

import pytest

from cod.cli.main import main
from helpers.data import DATA

TPCW = str(DATA / "plans" / "tpcw_magnycours.json")


def run(argv, capsys, stdin: str | None = None, monkeypatch=None):
    if stdin is not None:
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))  # with .buffer, as stdin
    status = main(argv)
    out, err = capsys.readouterr()
    return status, out, err


def test_json_has_the_keys_of_the_issue(capsys):
    status, out, _ = run(["deploy-plan", "--graph", TPCW, "--machine", "magnycours", "--format", "json"], capsys)
    assert status == 0
    d = json.loads(out)
    for key in ("compound_operators", "clusters", "cores", "cores_optimal", "numa_nodes", "placement"):
        assert key in d
    assert len(d["compound_operators"]) == 32 and d["cores"] == 6 and d["cores_optimal"] == 6
    assert d["numa_nodes"]["nodes"] == [0] and "density" in d["numa_nodes"]
    assert len(d["placement"]) == 44 and set(d["placement"].values()) <= set(range(6))
    assert "explain" not in d
    c = d["clusters"][0]
    assert {"operators", "members", "cpu_util", "mem_bw", "cpu", "numa_node"} <= set(c)


def test_text_is_a_table_per_numa_node_and_explain_tells_the_phases(capsys):
    status, out, _ = run(["deploy-plan", "--graph", TPCW, "--machine", "magnycours", "--explain"], capsys)
    assert status == 0
    assert "phase 1: 44 operators -> 32 compound operators" in out
    assert "phase 2: FFD by cpu_util packs 32 compound operators onto 6 cores" in out
    assert "phase 4: densest 1-subgraph" in out
    assert "NUMA node 0: 6 of 6 cores" in out
    assert "44 operators -> 32 compound operators -> 6 cores (optimal 6)" in out


def test_stdin_and_node_bandwidth(capsys, monkeypatch):
    graph = json.dumps({"operators": [{"id": f"o{i}", "cpu_util": 0.9, "mem_bw": 5e9} for i in range(4)]})
    status, out, _ = run(["deploy-plan", "--graph", "-", "--machine", "magnycours", "--format", "json"],
                         capsys, graph, monkeypatch)
    assert status == 0 and json.loads(out)["numa_nodes"]["count"] == 2
    status, out, _ = run(["deploy-plan", "--graph", "-", "--machine", "magnycours", "--format", "json",
                          "--node-bandwidth", "3e10"], capsys, graph, monkeypatch)
    assert status == 0 and json.loads(out)["numa_nodes"]["count"] == 1


# Status 2 (ExitStatus.BAD_INPUT) for a bad file or argument, 4 (DOES_NOT_FIT) for a graph the
# machine cannot hold.
@pytest.mark.parametrize("argv, stdin, status, message", [
    (["--graph", "/nonexistent/g.json"], None, 2, "graph /nonexistent/g.json: No such file"),
    (["--graph", "-"], "{not json", 2, "graph stdin: not valid JSON"),
    (["--graph", "-"], '{"operators": [{"id": "a", "cpu_util": 2}]}', 2, "cpu_util: must be a number in [0, 1]"),
    (["--graph", "-", "--capacity", "0"], '{"operators": [{"id": "a", "cpu_util": 0.5}]}', 2, "capacity"),
    (["--graph", "-", "--node-bandwidth", "9=1e9"], '{"operators": [{"id": "a", "cpu_util": 0.5}]}', 2,
     "has no NUMA node 9"),
    (["--graph", "-", "--node-bandwidth", "fast"], '{"operators": [{"id": "a", "cpu_util": 0.5}]}', 2,
     "not a number"),
    (["--graph", "-", "--unavailable", "x"], '{"operators": [{"id": "a", "cpu_util": 0.5}]}', 2, "--unavailable"),
    (["--graph", "-", "--unavailable", "0-15"], '{"operators": [{"id": "a", "cpu_util": 0.5}]}', 4,
     "needs 1 cores; shanghai has 0 usable"),
])
def test_errors_are_one_line_with_a_status(argv, stdin, status, message, capsys, monkeypatch):
    got, out, err = run(["deploy-plan", "--machine", "shanghai", *argv], capsys, stdin, monkeypatch)
    assert got == status
    assert out == ""
    assert message in err and err.count("\n") == 1

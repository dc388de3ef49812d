"""TaskSpec parsing, the result shape, and `cod plan` end to end."""

from __future__ import annotations

import json
import re

import pytest

from cod.cli.main import main
from cod.cli.plan_cmd import render_text
from cod.facts import machines
from cod.rm.allocator import TaskSpec, TaskSpecError, allocate
from helpers.data import HWLOC_DIR
from helpers.waiting import PROVING_S

GIB = 1 << 30


@pytest.mark.parametrize(
    "data, words",
    [
        ({"name": "a", "min_cores": 0}, ["'a'", "min_cores"]),
        ({"name": "a", "min_cores": 4, "max_cores": 2}, ["'a'", "max_cores"]),
        ({"name": "a", "bound": "io"}, ["'a'", "bound"]),
        ({"name": "a", "sensitive": ["numa", "disk"]}, ["'a'", "sensitive", "disk"]),
        ({"name": "a", "sensitive": "numa"}, ["'a'", "sensitive"]),
        ({"name": "a", "exclusive": "yes"}, ["'a'", "exclusive"]),
        ({"name": "a", "working_set_bytes": -1}, ["'a'", "working_set_bytes"]),
        ({"name": "a", "priority": 1.5}, ["'a'", "priority"]),
        ({"name": "a", "min_core": 2}, ["'a'", "min_core"]),
        ({"min_cores": 2}, ["name"]),
        ({"name": "a", "min_cores": True}, ["'a'", "min_cores"]),
    ],
)
def test_bad_task_names_task_and_key(data, words):
    with pytest.raises(TaskSpecError) as err:
        TaskSpec.from_dict(data)
    for w in words:
        assert w in str(err.value)


def test_defaults_and_round_trip():
    t = TaskSpec.from_dict({"name": "cscs", "sensitive": ["numa", "cache"]})
    assert (t.min_cores, t.max_cores, t.exclusive, t.bound, t.priority) == (1, None, True, "cpu", 0)
    assert TaskSpec.from_dict(t.to_dict()) == t


def test_duplicate_task_names_are_refused():
    m = machines.load("barcelona")
    with pytest.raises(TaskSpecError, match="'a'"):
        allocate(m, [TaskSpec("a"), TaskSpec("a")])


@pytest.mark.parametrize("solver", ["cpsat", "naive", "greedy"])
def test_result_shape(solver):
    m = machines.load("magnycours")
    r = allocate(m, [TaskSpec("a", min_cores=2, max_cores=4), TaskSpec("b", min_cores=3, max_cores=3)],
                 solver=solver, time_limit_s=PROVING_S)
    d = r.to_dict()
    assert set(d) == {"status", "solver", "solve_ms", "tasks", "reason"}
    assert d["status"] in ("optimal", "feasible")
    assert [t["name"] for t in d["tasks"]] == ["a", "b"]
    assert len(r.cores_of("a")) == 4 and len(r.cores_of("b")) == 3
    assert "max" in r.tasks[0].binding


def test_memory_binds_and_is_explained():
    """The paper's example: 4 GB per core on 16 GB nodes: at most 4 cores per node."""
    m = machines.load("magnycours")
    r = allocate(m, [TaskSpec("big", min_cores=8, working_set_bytes=4 * GIB, sensitive=frozenset({"numa"}))],
                 time_limit_s=PROVING_S)
    assert r.status == "optimal"
    per_node = {}
    node_of = m.node_of_cpu()
    for c in r.cores_of("big"):
        per_node[node_of[c]] = per_node.get(node_of[c], 0) + 1
    assert max(per_node.values()) == 4 and len(r.cores_of("big")) == 32
    assert any(b.startswith("memory of node") for b in r.tasks[0].binding)


def test_infeasible_names_the_task():
    m = machines.load("barcelona")
    n = len(m.cpu_ids())
    r = allocate(m, [TaskSpec("big", min_cores=n), TaskSpec("late", min_cores=1, priority=-1)],
                 time_limit_s=PROVING_S)
    assert r.status == "infeasible" and r.tasks == ()
    assert "'late'" in r.reason


@pytest.fixture
def task_file(tmp_path):
    def write(name, text):
        p = tmp_path / name
        p.write_text(text)
        return str(p)
    return write


def test_plan_json_toml(task_file, capsys):
    toml = task_file("t.toml", '[[tasks]]\nname = "cscs"\nmin_cores = 8\nmax_cores = 12\n'
                     'working_set_bytes = 1073741824\nsensitive = ["numa", "cache"]\n'
                     '[[tasks]]\nname = "hog"\nmax_cores = 1\npollutes_cache = true\n')
    cur = task_file("cur.json", json.dumps({"hog": [0]}))
    assert main(["plan", "--machine", "magnycours", "--tasks", toml, "--current", cur, "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "optimal"
    tasks = {t["name"]: t for t in out["tasks"]}
    assert tasks["hog"]["cores"] == [0]  # nothing forced it to move
    assert len(tasks["cscs"]["cores"]) == 12 and len(tasks["cscs"]["numa_nodes"]) == 2
    assert not set(tasks["cscs"]["cores"]) & set(range(6))  # no L3 shared with the polluter


@pytest.mark.parametrize("solver", ["cpsat", "naive", "greedy"])
def test_plan_text_matrix(task_file, capsys, solver):
    js = task_file("t.json", json.dumps({"tasks": [{"name": "a", "min_cores": 2, "max_cores": 2}]}))
    assert main(["plan", "--machine", "barcelona", "--tasks", js, "--solver", solver]) == 0
    out = capsys.readouterr().out
    row = "".join(line for line in out.splitlines() if line.startswith("a "))  # every folded block's
    assert row.count("X") == 2
    assert "NUMA" in out and "L3" in out and "bound by: min, max" in out


@pytest.mark.parametrize("width", [40, 60, 80, 120, 400])
def test_plan_text_matrix_folds_to_the_width_and_marks_under_each_cpu(width):
    """The shell's matrix, in plain text: each line fits; each mark stands in its CPU's column;
    the CPUs given as unavailable are marked in a row of their own."""
    machine = machines.load("magnycours")
    spec = TaskSpec("db", min_cores=4, max_cores=4)
    result = allocate(machine, [spec], unavailable=[5, 47])
    lines = render_text(machine, result, [5, 47], width=width).splitlines()
    assert all(len(line) <= width for line in lines if line.endswith(" |"))  # the matrix's lines
    marks: dict[str, dict[int, str]] = {"db": {}, "unavailable": {}}
    for i, line in enumerate(lines):
        if line.startswith("CPU "):
            cpu_line = line
        for name, found in marks.items():
            if line.startswith(name + " "):
                for m in re.finditer(r"\S", line[len(name):]):
                    col = m.start() + len(name)
                    if m.group() != "|":  # the CPU number's last digit stands in the same column
                        found[int(re.search(r"\d+$", cpu_line[:col + 1]).group())] = m.group()
    assert sorted(marks["db"]) == list(range(48))
    assert sorted(c for c, m in marks["db"].items() if m == "X") == list(result.tasks[0].cores)
    assert sorted(c for c, m in marks["unavailable"].items() if m == "#") == [5, 47]
    assert lines[-2].startswith("X held by the row's task") and "# busy" in lines[-2]


def test_plan_text_matrix_names_a_small_node_whole(task_file, capsys):
    """A node of two CPUs is narrower than its name: the column widens ("node 0"), as the
    shell's matrix does; it used to be cut to "nod"."""
    js = task_file("t.json", json.dumps({"tasks": [{"name": "a", "min_cores": 1}]}))
    assert main(["plan", "--hwloc", str(HWLOC_DIR / "2i386-2c-nohugepage.xml"), "--tasks", js]) == 0
    lines = capsys.readouterr().out.splitlines()
    numa, cpu, row = (next(line for line in lines if line.startswith(p)) for p in ("NUMA ", "CPU ", "a "))
    assert numa.split("|")[1].strip() == "node 0"
    assert len(numa) == len(cpu) == len(row) and row.split("|")[1].split() == ["X", "X"]


def test_plan_infeasible_exits_4(task_file, capsys):
    js = task_file("t.json", json.dumps({"tasks": [{"name": "huge", "min_cores": 1000}]}))
    assert main(["plan", "--machine", "barcelona", "--tasks", js, "--format", "json"]) == 4  # ExitStatus.DOES_NOT_FIT
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "infeasible" and "'huge'" in out["reason"]


@pytest.mark.parametrize(
    "text, words",
    [
        ('{"tasks": [{"name": "x", "colour": 1}]}', ["'x'", "colour"]),
        ('{"tasks": [{"name": "x", "max_cores": "lots"}]}', ["'x'", "max_cores"]),
        ('{"task": []}', ["tasks"]),
        ("not json [", ["neither valid JSON nor TOML"]),
    ],
)
def test_plan_bad_task_file(task_file, capsys, text, words):
    path = task_file("bad.json", text)
    assert main(["plan", "--machine", "barcelona", "--tasks", path]) == 2  # ExitStatus.BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("cod plan: error:") and err.count("\n") == 1
    for w in words:
        assert w in err


@pytest.mark.parametrize(
    "tasks, words",
    [
        # 4 GiB per CPU on MagnyCours' 16 GiB nodes: 4 CPUs per node, 32 in all
        ([TaskSpec("big", min_cores=33, working_set_bytes=4 * GIB)],
         ["'big'", "min_cores=33", "4 GiB per CPU", "at most 32", "8 nodes with 16 GiB free -> 4 each"]),
        ([TaskSpec("fat", min_cores=1, working_set_bytes=20 * GIB)], ["'fat'", "20 GiB per CPU", "at most 0"]),
        ([TaskSpec("db", min_cores=40), TaskSpec("late", min_cores=10, priority=-1)],
         ["50 CPUs", "'db' 40", "'late' 10", "48 are available"]),
        ([TaskSpec("a", min_cores=1, working_set_bytes=10 * GIB) for _ in range(1)]
         + [TaskSpec(f"w{i}", min_cores=4, working_set_bytes=4 * GIB) for i in range(8)],
         ["working sets", "128 GiB free"]),
    ],
)
def test_refusal_reasons_give_the_figures(tasks, words):
    """Issue #19: a refusal for per-node memory says so with the figures, and
    never counts CPUs that other tasks' placement happened to take."""
    r = allocate(machines.load("magnycours"), tasks, time_limit_s=PROVING_S)
    assert r.status == "infeasible"
    for w in words:
        assert w in r.reason, r.reason
    assert "available CPUs can be given" not in r.reason

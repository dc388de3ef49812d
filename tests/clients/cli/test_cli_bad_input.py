"""Bad input to the `cod` command (issue 47, item 10), through the real command in a subprocess.

Each row is one bad input: the command answers one line on stderr, no traceback, and its
documented failing status (2, bad input, for a bad file, machine source or daemon setting alike:
cod.cli.errors.ExitStatus, the README's table); in the shell a refusal, and the next statement
still runs.  Every run is capped at 2 GiB of address space (a soft limit, which the SKB engine
may raise for itself), so that a reader without a bound, which reads ``/dev/zero`` until memory
runs out, fails its row with a MemoryError instead of taking the machine's memory; an endless
FIFO's writer stops at 64 MiB for the same reason.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import threading
from pathlib import Path

import pytest

from cod.facts.user_input import MAX_INPUT_BYTES, MAX_NESTING
from helpers.rm_support import COD, start_daemon

ADDRESS_SPACE = 2 << 30
FIFO_BYTES = 64 << 20  # what an "endless" FIFO's writer gives at most (4 x the limit)

# A small valid hwloc v2 export: one package, one NUMA node, an L2, one core of two PUs.
TOPOLOGY = """<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
 <object type="Machine" os_index="0" cpuset="0x3" local_memory="1048576">
  <object type="Package" os_index="0" cpuset="0x3">
   <object type="NUMANode" os_index="0" cpuset="0x3" local_memory="1048576"/>
   <object type="L2Cache" cpuset="0x3" cache_size="1048576">
    <object type="Core" os_index="0" cpuset="0x3">
     <object type="PU" os_index="0" cpuset="0x1"/>
     <object type="PU" os_index="1" cpuset="0x2"/>
    </object>
   </object>
  </object>
 </object>
</topology>
"""
PU1 = '<object type="PU" os_index="1" cpuset="0x2"/>'
NODE = '<object type="NUMANode" os_index="0" cpuset="0x3" local_memory="1048576"/>'
PACKAGE = '<object type="Package" os_index="0" cpuset="0x3">'


def topology(old: str = "", new: str = "") -> str:
    assert old in TOPOLOGY
    return TOPOLOGY.replace(old, new, 1)


def nested_topology(levels: int) -> str:
    """An export whose elements nest ``levels`` deep (<topology> is level 1, Machine 2)."""
    groups = levels - 3  # topology, Machine and the PU
    return ('<topology version="2.0"><object type="Machine" os_index="0">'
            + '<object type="Group">' * groups + '<object type="PU" os_index="0"/>'
            + "</object>" * groups + "</object></topology>")


def graph(edges: list[list[str]], extra: object = None) -> str:
    ids = sorted({x for e in edges for x in e} or {"a"})
    ops = [{"id": x, "cpu_util": 0.1, "mem_bw": 1e8, **({"raw": extra} if extra is not None else {})} for x in ids]
    return json.dumps({"operators": ops, "edges": edges})


def nested_list(levels: int) -> str:
    return "[" * levels + "]" * levels


INPUTS = {
    "deep.xml": nested_topology(5000),
    "deep65.xml": nested_topology(MAX_NESTING + 1),
    "entity.xml": topology('<!DOCTYPE topology SYSTEM "hwloc2.dtd">', '<!DOCTYPE topology [<!ENTITY one "1">]>')
                  .replace('os_index="1" cpuset="0x2"', 'os_index="&one;" cpuset="0x2"'),
    "negative_memory.xml": topology(NODE, NODE.replace('local_memory="1048576"', 'local_memory="-1048576"')),
    "negative_cache.xml": topology('cache_size="1048576"', 'cache_size="-1"'),
    "negative_pu.xml": topology(PU1, PU1.replace('os_index="1"', 'os_index="-3"')),
    "negative_node.xml": topology(NODE, NODE.replace('os_index="0"', 'os_index="-2"')),
    "negative_package.xml": topology(PACKAGE, PACKAGE.replace('os_index="0"', 'os_index="-7"')),
    "huge_pu.xml": topology(PU1, PU1.replace('os_index="1"', 'os_index="4294967296"')),
    "duplicate_pu.xml": topology(PU1, PU1.replace('os_index="1"', 'os_index="0"')),
    "duplicate_package.xml": topology(
        '  </object>\n </object>\n</topology>',
        '  </object>\n  <object type="Package" os_index="0" cpuset="0x4"><object type="PU" os_index="2" '
        'cpuset="0x4"/></object>\n </object>\n</topology>'),
    "tasks.json": json.dumps({"tasks": [{"name": "a", "min_cores": 1}]}),
    "deep.json": '{"tasks": ' + nested_list(100_000) + "}",
    "deep.toml": "tasks = " + nested_list(100_000),
    "graph65.json": graph([["a", "b"]], json.loads(nested_list(MAX_NESTING - 2))),
    "cycle2.json": graph([["a", "b"], ["b", "a"]]),
    "cycle3.json": graph([["a", "b"], ["b", "c"], ["c", "a"]]),
}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("bad")
    for name, text in INPUTS.items():
        (d / name).write_text(text)
    # a regular file one byte over the limit, well-formed XML all the same
    head, tail = TOPOLOGY.encode().rsplit(b"</topology>", 1)
    pad = MAX_INPUT_BYTES + 1 - len(head) - len(b"<!---->") - len(b"</topology>") - len(tail)
    (d / "big.xml").write_bytes(head + b"<!--" + b"x" * pad + b"-->" + b"</topology>" + tail)
    assert (d / "big.xml").stat().st_size == MAX_INPUT_BYTES + 1
    return d


def _cap_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, resource.RLIM_INFINITY))


def cod(args: list[str], stdin: str | Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    source = open(stdin, "rb") if isinstance(stdin, Path) else None
    try:
        r = subprocess.run(COD + args, input=stdin.encode() if isinstance(stdin, str) else None, stdin=source,
                           capture_output=True, timeout=timeout, preexec_fn=_cap_memory,
                           env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"})
    finally:
        if source is not None:
            source.close()
    return subprocess.CompletedProcess(r.args, r.returncode, r.stdout.decode(errors="replace"),
                                       r.stderr.decode(errors="replace"))


class EndlessFifo:
    """A FIFO whose writer gives ``head`` then ``chunk`` over and over (up to FIFO_BYTES)."""

    def __init__(self, path: Path, head: bytes, chunk: bytes) -> None:
        self.path = path
        os.mkfifo(path)
        self.thread = threading.Thread(target=self._write, args=(head, chunk), daemon=True)
        self.thread.start()

    def _write(self, head: bytes, chunk: bytes) -> None:
        try:
            with open(self.path, "wb") as f:
                f.write(head)
                for _ in range(FIFO_BYTES // len(chunk)):
                    f.write(chunk)
        except BrokenPipeError:
            pass  # the reader stopped: what a bounded reader does

    def close(self) -> None:
        if self.thread.is_alive():  # nobody opened it: open the read end so the writer's open returns
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
            os.close(fd)
        self.thread.join(30)


FIFOS = {
    "xml": (TOPOLOGY.encode().split(b"</topology>")[0], b"<!--" + b"x" * 65536 + b"-->"),
    "json": (b'{"tasks": [', b" " * 65536),
}

MACHINE = ["--machine", "magnycours"]
TOO_LARGE = f"larger than {MAX_INPUT_BYTES >> 20} MiB (or endless)"
TOO_DEEP = f"nested deeper than {MAX_NESTING} levels"

# (id, arguments, standard input, exit status, what stderr's one line says)
ROWS = [
    ("hwloc nested 5000 deep", ["facts", "--hwloc", "{d}/deep.xml"], None, 2,
     f"deep.xml: elements nested deeper than {MAX_NESTING} levels"),
    ("hwloc nested one past the limit", ["facts", "--hwloc", "{d}/deep65.xml"], None, 2, "nested deeper"),
    ("hwloc one byte over the size limit", ["facts", "--hwloc", "{d}/big.xml"], None, 2, f"big.xml: {TOO_LARGE}"),
    ("hwloc /dev/zero", ["facts", "--hwloc", "/dev/zero"], None, 2, f"/dev/zero: {TOO_LARGE}"),
    ("hwloc endless FIFO", ["facts", "--hwloc", "{fifo:xml}"], None, 2, TOO_LARGE),
    ("hwloc entity declaration", ["facts", "--hwloc", "{d}/entity.xml"], None, 2, "declares no entities"),
    ("hwloc negative memory", ["facts", "--hwloc", "{d}/negative_memory.xml"], None, 2,
     "NUMANode object (os_index 0): attribute local_memory='-1048576' is negative"),
    ("hwloc negative cache size", ["facts", "--hwloc", "{d}/negative_cache.xml"], None, 2,
     "L2Cache object: attribute cache_size='-1' is negative"),
    ("hwloc negative PU os_index", ["facts", "--hwloc", "{d}/negative_pu.xml"], None, 2,
     "PU object: attribute os_index='-3' is negative"),
    ("hwloc negative NUMANode os_index", ["facts", "--hwloc", "{d}/negative_node.xml"], None, 2,
     "NUMANode object: attribute os_index='-2' is negative"),
    ("hwloc negative Package os_index", ["facts", "--hwloc", "{d}/negative_package.xml"], None, 2,
     "Package object: attribute os_index='-7' is negative"),
    ("hwloc os_index past 32 bits", ["facts", "--hwloc", "{d}/huge_pu.xml"], None, 2,
     "PU object (os_index 4294967296): attribute os_index='4294967296' is out of range"),
    ("hwloc duplicate PU os_index", ["facts", "--hwloc", "{d}/duplicate_pu.xml"], None, 2,
     "two PU objects with os_index 0"),
    ("hwloc duplicate Package os_index", ["facts", "--hwloc", "{d}/duplicate_package.xml"], None, 2,
     "two Package objects with os_index 0"),
    ("plan --hwloc negative os_index", ["plan", "--hwloc", "{d}/negative_pu.xml", "--tasks", "{d}/tasks.json"],
     None, 2, "is negative"),
    ("tasks JSON nested 100000 deep", ["plan", *MACHINE, "--tasks", "{d}/deep.json"], None, 2,
     f"task file {{d}}/deep.json: {TOO_DEEP}"),
    ("tasks TOML nested 100000 deep", ["plan", *MACHINE, "--tasks", "{d}/deep.toml"], None, 2, TOO_DEEP),
    ("tasks /dev/zero", ["plan", *MACHINE, "--tasks", "/dev/zero"], None, 2, f"task file /dev/zero: {TOO_LARGE}"),
    ("tasks endless FIFO", ["plan", *MACHINE, "--tasks", "{fifo:json}"], None, 2, TOO_LARGE),
    ("current /dev/zero", ["plan", *MACHINE, "--tasks", "{d}/tasks.json", "--current", "/dev/zero"], None, 2,
     f"current allocation /dev/zero: {TOO_LARGE}"),
    ("others /dev/zero", ["plan", *MACHINE, "--tasks", "{d}/tasks.json", "--others", "/dev/zero"], None, 2,
     TOO_LARGE),
    ("a file name with a newline", ["plan", *MACHINE, "--tasks", "{d}/a\nb.json"], None, 2,
     "a\\nb.json: No such file or directory"),
    ("graph JSON nested 100000 deep", ["deploy-plan", *MACHINE, "--graph", "{d}/deep.json"], None, 2, TOO_DEEP),
    ("graph nested one past the limit in an ignored key", ["deploy-plan", *MACHINE, "--graph", "{d}/graph65.json"],
     None, 2, TOO_DEEP),
    ("graph /dev/zero", ["deploy-plan", *MACHINE, "--graph", "/dev/zero"], None, 2, f"graph /dev/zero: {TOO_LARGE}"),
    ("graph /dev/zero on stdin", ["deploy-plan", *MACHINE, "--graph", "-"], Path("/dev/zero"), 2,
     f"graph stdin: {TOO_LARGE}"),
    ("graph endless FIFO", ["deploy-plan", *MACHINE, "--graph", "{fifo:json}"], None, 2, TOO_LARGE),
    ("graph two-operator cycle", ["deploy-plan", *MACHINE, "--graph", "{d}/cycle2.json"], None, 2,
     "edges: 'b' -> 'a' -> 'b' is a cycle of 2 operators"),
    ("graph three-operator cycle", ["deploy-plan", *MACHINE, "--graph", "{d}/cycle3.json"], None, 2,
     "is a cycle of 3 operators"),
    ("query --load /dev/zero", ["query", *MACHINE, "--load", "/dev/zero", "true"], None, 2,
     f"/dev/zero: {TOO_LARGE}"),
    ("rm --config /dev/zero", ["rm", "--socket", "{d}/rm.sock", *MACHINE, "--config", "/dev/zero"], None, 2,
     TOO_LARGE),
    ("rm --config nested 100000 deep", ["rm", "--socket", "{d}/rm.sock", *MACHINE, "--config", "{d}/deep.toml"],
     None, 2, TOO_DEEP),
    ("shell script /dev/zero on stdin", ["shell", *MACHINE], Path("/dev/zero"), 2,
     f"the script on standard input is {TOO_LARGE}"),
]


@pytest.mark.parametrize("args, stdin, status, complaint", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_input_is_one_line_and_a_failing_status(inputs, tmp_path, args, stdin, status, complaint):
    args, fifos = list(args), []
    for i, a in enumerate(args):
        if a.startswith("{fifo:"):
            kind = a[len("{fifo:"):-1]
            fifos.append(EndlessFifo(tmp_path / f"endless.{kind}", *FIFOS[kind]))
            args[i] = str(fifos[-1].path)
    try:
        r = cod([a.format(d=inputs) for a in args], stdin)
    finally:
        for f in fifos:
            f.close()
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    assert len(r.stderr.splitlines()) == 1, r.stderr[-2000:]
    assert complaint.format(d=inputs) in r.stderr
    assert r.returncode == status, r.stderr


@pytest.mark.parametrize("args", [
    ["facts", "--hwloc", "{d}/at_limit.xml"],
    ["deploy-plan", *MACHINE, "--graph", "{d}/graph_at_limit.json"],
], ids=["hwloc nested at the limit", "graph nested at the limit"])
def test_input_at_the_limits_is_accepted(inputs, args):
    (inputs / "at_limit.xml").write_text(nested_topology(MAX_NESTING))
    (inputs / "graph_at_limit.json").write_text(graph([["a", "b"]], json.loads(nested_list(MAX_NESTING - 3))))
    r = cod([a.format(d=inputs) for a in args])
    assert r.returncode == 0, r.stderr


# ---- names with control characters -------------------------------------------------------------
EVIL = "ev\x1b[2Jil\u202e"  # clears the screen, then reverses what follows
SHOWN = "ev\\x1b[2Jil\\u202e"


def assert_safe(text: str) -> None:
    assert "\x1b" not in text and "\u202e" not in text, text


def test_plan_escapes_a_task_name_from_the_file(tmp_path):
    (tmp_path / "tasks.json").write_text(json.dumps({"tasks": [{"name": EVIL, "min_cores": 1}]}))
    r = cod(["plan", *MACHINE, "--tasks", str(tmp_path / "tasks.json")])
    assert r.returncode == 0, r.stderr
    assert_safe(r.stdout)
    assert f"{SHOWN}: 48 CPUs" in r.stdout and f"\n{SHOWN} |" in r.stdout
    r = cod(["plan", *MACHINE, "--tasks", str(tmp_path / "tasks.json"), "--format", "json"])
    assert [t["name"] for t in json.loads(r.stdout)["tasks"]] == [EVIL]  # JSON keeps the name as it is


def test_deploy_plan_and_facts_escape_names(tmp_path):
    (tmp_path / "graph.json").write_text(json.dumps({"operators": [{"id": EVIL, "cpu_util": 0.5, "mem_bw": 1e8}]}))
    r = cod(["deploy-plan", *MACHINE, "--graph", str(tmp_path / "graph.json")])
    assert r.returncode == 0, r.stderr
    assert_safe(r.stdout)
    assert SHOWN in r.stdout
    hwloc = tmp_path / f"{EVIL}.xml"  # an hwloc machine is named by its file
    hwloc.write_text(TOPOLOGY)
    r = cod(["facts", "--hwloc", str(hwloc)])
    assert r.returncode == 0, r.stderr
    assert_safe(r.stdout)
    assert f"Machine {SHOWN}" in r.stdout


def test_shell_escapes_names_it_prints():
    name = "'ev\\e[2Jil\\u202e'"  # EVIL as a quoted Prolog atom
    r = cod(["shell", *MACHINE, "-c", f":assert --system task({name}, 1, {name}). allocated({name}, 0). "
             f"other_task(7, {name}, [3])", "-c", ":tasks", "-c", ":allocation", "-c", ":explain nobody"])
    assert r.returncode == 2, r.stderr  # :explain nobody
    assert_safe(r.stdout)
    assert_safe(r.stderr)
    assert f"{SHOWN} | 1" in r.stdout  # the task table
    assert f"\n{SHOWN} |  X" in r.stdout  # the allocation matrix
    assert f"(registered tasks: {SHOWN})" in r.stderr


# ---- the shell: a refusal, and the next statement runs --------------------------------------------
SHELL_ROWS = [
    (":load /dev/zero", f"/dev/zero: {TOO_LARGE}"),
    (":rpc list_tasks " + nested_list(100_000), f"The parameters are {TOO_DEEP}"),
    (":update t x=" + nested_list(100_000), TOO_DEEP),
]


@pytest.mark.parametrize("statement, complaint", SHELL_ROWS, ids=[s[:14] for s, _ in SHELL_ROWS])
def test_the_embedded_shell_refuses_and_goes_on(statement, complaint):
    r = cod(["shell", *MACHINE], stdin=f"{statement}\nX = 1.\n")  # a script on stdin: no argument's size limit
    assert "Traceback" not in r.stderr
    assert len(r.stderr.splitlines()) == 1 and r.stderr.startswith("Error: "), r.stderr[-2000:]
    assert complaint in r.stderr
    assert r.stdout == "X = 1.\n" and r.returncode == 2


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    d = start_daemon(tmp_path_factory.mktemp("watch"), "--machine", "magnycours")
    yield d
    d.stop()


@pytest.mark.parametrize("seconds", ["-1", "0", "nan", "inf", "-inf", "soon"])
def test_watch_refuses_what_is_not_a_positive_duration(daemon, seconds):
    r = cod(["shell", "--socket", str(daemon.path), "-c", f":watch {seconds}", "-c", "X = 1."], timeout=60)
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert f"Error: SECONDS must be a positive number of seconds, not '{seconds}'" in r.stderr
    assert r.stdout == "X = 1.\n" and r.returncode == 2


def test_watch_for_a_positive_duration_still_watches(daemon):
    r = cod(["shell", "--socket", str(daemon.path), "-c", ":watch 0.2", "-c", "X = 1."], timeout=60)
    assert r.returncode == 0, r.stderr
    assert "Watching events for 0.2 s" in r.stderr and r.stdout == "X = 1.\n"


# ---- the interactive shell's history file, which prompt_toolkit reads whole ------------------------
def test_a_history_file_that_is_not_a_bounded_regular_file_is_not_read(tmp_path):
    from prompt_toolkit.history import FileHistory, InMemoryHistory

    from cod.cli.shell.interactive import open_history

    os.mkfifo(tmp_path / "fifo")
    with open(tmp_path / "big", "wb") as f:
        f.truncate(MAX_INPUT_BYTES + 1)
    rows = [(Path("/dev/zero"), "is not a regular file"), (tmp_path / "fifo", "is not a regular file"),
            (tmp_path / "big", f"is over {MAX_INPUT_BYTES >> 20} MiB")]
    for path, reason in rows:
        history, note = open_history(path)
        assert isinstance(history, InMemoryHistory) and note == f"History is not kept: {path} {reason}.", path
    history, note = open_history(tmp_path / "state" / "shell_history")
    assert isinstance(history, FileHistory) and note is None

"""`cod plan`: the allocation for a task list on any machine, without a daemon.

The task file (JSON or TOML) is ``{"tasks": [{"name": ..., ...}, ...]}`` with the
keys of :class:`cod.rm.allocator.TaskSpec`; the current allocation file (JSON
or TOML) maps task names to CPU lists: ``{"cscs": [0, 1, 2]}``; the others
file lists unregistered busy processes the allocator keeps CPUs for:
``{"others": [{"name": "other.1234", "cores": 1, "cpus": [0]}, ...]}`` with the
keys of :class:`cod.rm.allocator.OtherDemand`.  Infeasible allocations are
printed and exit with status 4 (ExitStatus.DOES_NOT_FIT).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cod.facts.cpulist import format_cpulist, parse_cpulist
from cod.facts.model import FactsError, Machine
from cod.facts.user_input import InputError, loads_json, loads_toml, read_bytes
from cod.rm.allocator import SOLVERS, AllocationResult, OtherDemand, TaskSpec, TaskSpecError, allocate

from .errors import ExitStatus, UserError
from .facts_cmd import add_machine_source, machine_of
from .matrix import BUSY, HELD, NOT_HELD, RESERVED, MatrixRow, cpu_groups, legend, matrix_lines, plain_text
from .plan_words import plan_sentence
from .terminal import terminal_safe


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan", help="compute the CPU allocation for a task list",
        description="Compute the global CPU allocation for a task list (TOML or JSON) "
        "on a machine (default: this machine), without a daemon.")
    add_machine_source(parser)
    parser.add_argument("--tasks", metavar="FILE", required=True,
                        help='task list: {"tasks": [{"name": ..., "min_cores": ...}, ...]}')
    parser.add_argument("--current", metavar="FILE",
                        help='current allocation: {"task": [cpu, ...], ...}')
    parser.add_argument("--others", metavar="FILE",
                        help='unregistered busy processes: {"others": [{"name": "other.1234", '
                        '"cores": 1, "cpus": [0]}, ...]}')
    parser.add_argument("--unavailable", metavar="CPUS", default="",
                        help="CPUs nobody may be given, e.g. 0,4-7")
    parser.add_argument("--solver", choices=SOLVERS, default="cpsat")
    parser.add_argument("--time-limit", type=float, default=1.0, metavar="SECONDS")
    parser.add_argument("--format", choices=("json", "text"), default="text")
    parser.set_defaults(func=run)


def _read(path: str, what: str) -> Any:
    """A JSON or TOML file (by its suffix, else whichever it is), within user_input's limits."""
    p = Path(path)
    try:
        raw = read_bytes(p)
        if p.suffix == ".toml":
            return loads_toml(raw.decode())
        if p.suffix == ".json":
            return loads_json(raw)
        try:
            return loads_json(raw)
        except ValueError:
            return loads_toml(raw.decode())
    except OSError as err:
        raise UserError(f"{what} {path}: {err.strerror}") from None
    except InputError as err:
        raise UserError(f"{what} {path}: {err}") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"{what} {path}: neither valid JSON nor TOML: {err}") from None


def load_tasks(path: str) -> list[TaskSpec]:
    data = _read(path, "task file")
    if not isinstance(data, dict) or not isinstance(data.get("tasks"), list):
        raise UserError(f"task file {path}: expected a top-level 'tasks' list")
    extra = sorted(k for k in data if k != "tasks")
    if extra:
        raise UserError(f"task file {path}: unknown top-level key {extra[0]!r}")
    try:
        return [TaskSpec.from_dict(d) for d in data["tasks"]]
    except (TaskSpecError, TypeError) as err:
        raise UserError(f"task file {path}: {err}") from None


def load_current(path: str) -> dict[str, list[int]]:
    data = _read(path, "current allocation")
    if not isinstance(data, dict):
        raise UserError(f"current allocation {path}: expected a table of task -> CPU list")
    out = {}
    for name, cpus in data.items():
        if not isinstance(cpus, list) or not all(isinstance(c, int) and not isinstance(c, bool) for c in cpus):
            raise UserError(f"current allocation {path}: task {name!r}: expected a list of CPU numbers")
        out[str(name)] = cpus
    return out


def load_others(path: str) -> list[OtherDemand]:
    data = _read(path, "others file")
    if not isinstance(data, dict) or not isinstance(data.get("others"), list):
        raise UserError(f"others file {path}: expected a top-level 'others' list")
    extra = sorted(k for k in data if k != "others")
    if extra:
        raise UserError(f"others file {path}: unknown top-level key {extra[0]!r}")
    try:
        return [OtherDemand.from_dict(d) for d in data["others"]]
    except (TaskSpecError, TypeError) as err:
        raise UserError(f"others file {path}: {err}") from None


def run(args: argparse.Namespace) -> int:
    try:
        machine = machine_of(args)
    except FactsError as err:
        raise UserError(str(err)) from None
    tasks = load_tasks(args.tasks)
    current = load_current(args.current) if args.current else None
    others = load_others(args.others) if args.others else []
    try:
        unavailable = list(parse_cpulist(args.unavailable))
    except ValueError as err:
        raise UserError(f"--unavailable: {err}") from None
    try:
        result = allocate(machine, tasks, current, others=others, unavailable=unavailable,
                          solver=args.solver, time_limit_s=args.time_limit)
    except (TaskSpecError, ValueError) as err:
        raise UserError(str(err)) from None
    if args.format == "json":
        sys.stdout.write(json.dumps(result.to_dict(), indent=1) + "\n")
    else:
        sys.stdout.write(render_text(machine, result, unavailable))
    return ExitStatus.DOES_NOT_FIT if result.status == "infeasible" else ExitStatus.OK


def render_text(machine: Machine, result: AllocationResult, unavailable: list[int] = (),
                width: int | None = None) -> str:
    """The paper's Figure 4 (one row per task, one column per CPU, grouped by node and L3),
    folded to `width` columns (the terminal's by default), then a line per task."""
    lines = [f"status: {plan_sentence(result.status, result.solver, result.via, result.solve_ms)}"]
    if result.reason:
        lines.append(f"reason: {result.reason}")
    busy = set(unavailable)

    def holder(cpus: list[int], mark: str) -> Callable[[int], tuple[str, str]]:
        held = set(cpus)
        return lambda c: (mark, "") if c in held else (NOT_HELD, "")

    rows = [MatrixRow(t.name, "", holder(t.cores, HELD)) for t in result.tasks]
    rows += [MatrixRow(r.name, "", holder(r.cpus, RESERVED)) for r in result.reservations]
    if busy:
        rows.append(MatrixRow("unavailable", "", holder(sorted(busy), BUSY)))
    width = width or shutil.get_terminal_size().columns
    lines += plain_text(matrix_lines(cpu_groups(machine), rows, width)).rstrip("\n").split("\n")
    lines.append(legend(HELD + (RESERVED if result.reservations else "") + (BUSY if busy else "")))
    for t in result.tasks:
        lines.append(f"{t.name}: {len(t.cores)} CPUs on node(s) {','.join(map(str, t.numa_nodes)) or '-'}; "
                     f"bound by: {', '.join(t.binding) or '-'}"
                     + (f"; displaced by {', '.join(t.displaced_by)}" if t.displaced_by else ""))
    for r in result.reservations:
        lines.append(f"{r.name}: reserved CPUs {format_cpulist(r.cpus) or '-'} ({len(r.cpus)} of {r.wanted})"
                     f"{', moved' if r.moved else ''}; bound by: {', '.join(r.binding) or '-'}")
    # Task names come from the user's file: each line is made terminal-safe (a name's newline too).
    return "".join(terminal_safe(line) + "\n" for line in lines)

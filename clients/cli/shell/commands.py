"""The shell's commands (``:name args``): one function each, and the table that names them.

Each command gathers its data through the backend (protocol methods where the
daemon has them, SKB queries otherwise) and hands it to ``Shell.emit`` with
its text rendering; ``--format json`` prints the data instead.
"""

from __future__ import annotations

import json
import math
import queue
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from rich.table import Table
from rich.text import Text

from cod.facts import text as facts_text
from cod.facts.user_input import InputError, loads_json, read_bytes

from . import render, skbviews
from .errors import STATUS_ERROR, STATUS_OK, ShellError
from .explain import explain_task
from .predicates import builtin_predicates, parse_indicator, system_predicates
from .statements import Command, full_stops

if TYPE_CHECKING:
    from .session import Shell


@dataclass(frozen=True)
class CommandSpec:
    name: str
    usage: str
    summary: str
    run: Callable[["Shell", Command], int | None]
    complete: str | None = None  # what its first argument names: predicate, task, app, setting, file


COMMANDS: dict[str, CommandSpec] = {}


def command(name: str, usage: str, summary: str, complete: str | None = None, aliases: tuple[str, ...] = ()):
    def register(fn: Callable[["Shell", Command], int | None]) -> Callable[["Shell", Command], int | None]:
        spec = CommandSpec(name, usage, summary, fn, complete)
        COMMANDS[name] = spec
        for alias in aliases:
            COMMANDS[alias] = spec
        return fn
    return register


def _no_args(cmd: Command) -> None:
    if cmd.args:
        raise ShellError(f":{cmd.name} takes no arguments (got {' '.join(cmd.args)})")


def _rest(cmd: Command) -> str:
    """The text after the command name, as typed (for Prolog terms, which contain spaces)."""
    body = cmd.text.strip()[1:].lstrip()
    return body[len(body.split(None, 1)[0]):].strip() if body else ""


def _listing(shell: "Shell") -> dict[str, Any]:
    listing = shell.backend.tasks()
    if shell.backend.mode == "daemon":
        # get_allocation adds what list_tasks leaves out: the CPUs each task is giving back.
        alloc = shell.backend.call("get_allocation")
        by_task = {a["task"]: a for a in alloc.get("tasks", [])}
        for t in listing.get("tasks", []):
            a = by_task.get(t["task"], {})
            t["releasing"] = a.get("releasing", [])
            t["numa_nodes"] = a.get("numa_nodes", [])
            t["memory_nodes"] = a.get("memory_nodes", [])
            if "memory_reason" in a:
                t["memory_reason"] = a["memory_reason"]
        # Elastic groups hold CPUs too: shown as rows (without a pid), as the embedded view shows them.
        for g in listing.get("elastic_groups", []):
            listing.setdefault("tasks", []).append({
                "task": g["group"], "pid": None, "app": None, "cores": g.get("cores", []), "epoch": listing.get("epoch"),
                "binding": [], "properties": {"min_cores": g["settings"]["min_cores"], "max_cores": len(g.get("cores", []))},
                "releasing": [], "cpu_use": None, "numa_pages": {}})
    return listing


# ---- help and settings ----------------------------------------------------------------------------
@command("help", "[COMMAND]", "this help, or one command's", complete="command", aliases=("?",))
def cmd_help(shell: "Shell", cmd: Command) -> None:
    specs = sorted({s.name: s for s in COMMANDS.values()}.values(), key=lambda s: s.name)
    if cmd.args:
        name = cmd.args[0].lstrip(":")
        spec = COMMANDS.get(name)
        if spec is None:
            raise ShellError(f"there is no command :{name} (try :help)")
        shell.emit(cmd, {"command": spec.name, "usage": f":{spec.name} {spec.usage}".strip(), "summary": spec.summary},
                   [Text(f":{spec.name} {spec.usage}".strip(), style="bold"), Text(f"  {spec.summary}")])
        return
    items: list[Any] = [
        Text("Type a Prolog query ending with a full stop, as at a swipl prompt:  get_nr_cores(N).", style="bold"),
        Text("  Answers come one at a time: ';' or space for the next, Enter to stop (:set answers all for all)."),
        Text("  A query may span several lines; it runs at its full stop.  Ctrl-C stops it, Ctrl-D leaves."),
        Text(""),
        Text("Commands:", style="bold"),
    ]
    grid = Table.grid(padding=(0, 2))
    grid.add_column(no_wrap=True)
    grid.add_column()
    for s in specs:
        grid.add_row(f"  :{s.name} {s.usage}".rstrip(), s.summary)
    items.append(grid)
    info = shell.backend.info()
    where = (f"the daemon on {info.get('socket')} (application {info.get('app')})" if info["mode"] == "daemon"
             else f"an SKB of its own ({info.get('source')}, application {info.get('app')})")
    items += [Text(""), Text(f"This shell talks to {where}.", style="dim")]
    shell.emit(cmd, {"commands": [{"command": s.name, "usage": s.usage, "summary": s.summary} for s in specs],
                     "backend": info}, items)


@command("set", "[NAME [VALUE]]", "show or change a setting (answers, timeout, pager, max_facts)", complete="setting")
def cmd_set(shell: "Shell", cmd: Command) -> None:
    if len(cmd.args) == 1 or len(cmd.args) > 2:
        if len(cmd.args) == 1 and cmd.args[0] in shell.settings.DESCRIPTIONS:
            name = cmd.args[0]
            value = shell.settings.as_dict()[name]
            shell.emit(cmd, {name: value}, [Text(f"{name} = {value}   ({shell.settings.DESCRIPTIONS[name]})")])
            return
        raise ShellError("usage: :set NAME VALUE (settings: " + ", ".join(shell.settings.DESCRIPTIONS) + ")")
    if cmd.args:
        shell.settings.set(cmd.args[0], cmd.args[1])
    values = shell.settings.as_dict()
    shell.emit(cmd, values, [Text(f"{k} = {v}   ({shell.settings.DESCRIPTIONS[k]})") for k, v in values.items()])


@command("quit", "", "leave the shell (as does Ctrl-D)", aliases=("exit", "q"))
def cmd_quit(shell: "Shell", cmd: Command) -> None:
    shell.done = True


# ---- what the SKB holds ---------------------------------------------------------------------------
def _app_predicates(shell: "Shell") -> list[tuple[str, int]]:
    """This application's predicates with their clause counts, where they can be known."""
    try:
        result = shell.backend.procedures(None)
    except ShellError:
        return []
    rows = []
    for proc in result.get("procedures", []):
        rows.append((proc["predicate"], len(proc.get("clauses", []))))
    return rows


@command("facts", "[PREDICATE]", "count the SKB's facts, or list one predicate's (e.g. :facts pu/4)",
         complete="predicate")
def cmd_facts(shell: "Shell", cmd: Command) -> int:
    query = shell.backend.query
    if not cmd.args:
        fact_preds = skbviews.fact_predicates(query)
        counts = skbviews.count_facts(query, fact_preds)
        known = {f"{n}/{a}" for n, a in fact_preds}
        derived = [p.indicator for p in system_predicates() if p.indicator not in known]
        app_rows = _app_predicates(shell)
        data = {"system": counts, "derived": derived, "app": dict(app_rows)}
        shell.emit(cmd, data, lambda: render.facts_summary_view(counts, derived, app_rows, shell.out.colour))
        return STATUS_OK
    if len(cmd.args) > 1:
        raise ShellError("usage: :facts [NAME or NAME/ARITY]")
    try:
        name, arity = parse_indicator(cmd.args[0])
    except ValueError as err:
        raise ShellError(str(err)) from None
    if arity is None:
        candidates = {a for n, a in skbviews.fact_predicates(query) if n == name}
        candidates |= {p.arity for p in system_predicates() + shell.backend.library() if p.name == name}
        candidates |= {int(pi.rpartition("/")[2]) for pi, _ in _app_predicates(shell)
                       if pi.rpartition("/")[0] == name}
        if not candidates:
            raise ShellError(f"the SKB knows no predicate {name} here; give its arity, as in :facts {name}/2, "
                             f"or see :facts for the list")
        if len(candidates) > 1:
            raise ShellError(f"{name} has several arities ({', '.join(f'{name}/{a}' for a in sorted(candidates))}): "
                             f"say which")
        arity = candidates.pop()
    limit = shell.settings.max_facts
    texts, more = skbviews.list_facts(query, name, arity, limit)
    data = {"predicate": f"{name}/{arity}", "facts": texts, "truncated": more}
    items: list[Any] = [Text(t) for t in texts]
    if not texts:
        items.append(Text(f"% {name}/{arity} holds nothing.", style="dim"))
    if more:
        items.append(Text(f"% first {limit} shown (:set max_facts N for more)", style="dim"))
    shell.emit(cmd, data, items)
    return STATUS_OK


@command("procedures", "[APP]", "the stored procedures of an application (default: this shell's), and the library's",
         complete="app")
def cmd_procedures(shell: "Shell", cmd: Command) -> None:
    if len(cmd.args) > 1:
        raise ShellError("usage: :procedures [APP]")
    result = shell.backend.procedures(cmd.args[0] if cmd.args else None)
    library = [p.indicator for p in shell.backend.library()]
    shell.emit(cmd, {**result, "library": library}, lambda: render.procedures_view(result, library))


@command("status", "", "what the shell talks to: the daemon, its enforcement (and a warning when it is degraded)")
def cmd_status(shell: "Shell", cmd: Command) -> None:
    _no_args(cmd)
    info = shell.backend.info()
    if info["mode"] != "daemon":
        status = {"mode": info["mode"], "machine": info["machine"], "source": info.get("source")}
        shell.emit(cmd, status, [Text(f"No daemon: this shell runs its own SKB on "
                                      f"{info.get('source') or 'machine ' + str(info['machine'])}; "
                                      "nothing is enforced.")])
        return
    enforcement = shell.backend.call("get_topology", {})["enforcement"]
    status = {"mode": "daemon", "socket": info["socket"], "app": info["app"], "server": info["server"],
              "machine": info["machine"], "enforcement": enforcement}
    lines = [Text(f"Daemon {info['server']} on {info['socket']}, machine {info['machine']}, app {info['app']}."),
             Text(f"Enforcement {enforcement['mode']}: {enforcement['in_force']}.")]
    if "warning" in enforcement:
        lines.append(Text(f"Warning: {enforcement['warning']}", style="bold yellow"))
    shell.emit(cmd, status, lines)


@command("machine", "", "the machine's topology as the SKB holds it")
def cmd_machine(shell: "Shell", cmd: Command) -> None:
    _no_args(cmd)
    machine = shell.machine(fresh=True)
    shell.emit(cmd, machine.to_dict(), lambda: [Text(line) for line in facts_text.render(machine).splitlines()])


# ---- tasks and the allocation -----------------------------------------------------------------------
@command("tasks", "", "registered tasks (pid, app, properties, CPUs, CPU use, NUMA pages) and unregistered busy processes")
def cmd_tasks(shell: "Shell", cmd: Command) -> None:
    _no_args(cmd)
    listing = _listing(shell)
    shell.emit(cmd, listing, lambda: render.tasks_view(listing, shell.out.colour))


@command("elastic", "", "elastic groups: processes that do not speak COD, their cores and their Petri net (SKB facts)")
def cmd_elastic(shell: "Shell", cmd: Command) -> None:
    _no_args(cmd)
    groups = skbviews.elastic_groups(shell.backend.query)
    shell.emit(cmd, {"elastic_groups": groups}, lambda: render.elastic_view(groups, shell.out.colour))


@command("allocation", "", "the task-by-CPU matrix (COD paper, Figure 4), grouped by NUMA node and L3",
         aliases=("alloc",))
def cmd_allocation(shell: "Shell", cmd: Command) -> None:
    _no_args(cmd)
    listing = _listing(shell)
    machine = shell.machine()
    shell.emit(cmd, listing, lambda: render.allocation_view(machine, listing, shell.out.width))


@command("cache", "", "the L3 domains, the cache partitions (resctrl groups, way masks) and their occupancy")
def cmd_cache(shell: "Shell", cmd: Command) -> None:
    _no_args(cmd)
    view = skbviews.cache_partitions(shell.backend.query)
    shell.emit(cmd, view, lambda: render.cache_view(view))


@command("plan", "", "how the current plan was made: solver, status, time")
def cmd_plan(shell: "Shell", cmd: Command) -> None:
    _no_args(cmd)
    if shell.backend.mode == "daemon":
        plan = shell.backend.call("get_allocation")
        listing = {"epoch": plan.get("epoch"), "tasks": plan.get("tasks", [])}
    else:
        listing = shell.backend.tasks()
        plan = {**listing["plan"], "epoch": listing.get("epoch"), "tasks": listing.get("tasks", [])}
    shell.emit(cmd, plan, lambda: render.plan_view(plan, listing))


@command("explain", "TASK", "why the task has these CPUs: the constraints that bind it", complete="task")
def cmd_explain(shell: "Shell", cmd: Command) -> None:
    if len(cmd.args) != 1:
        raise ShellError("usage: :explain TASK (see :tasks for their names)")
    name = cmd.args[0]
    listing = _listing(shell)
    try:
        machine = shell.machine()
    except Exception:
        machine = None
    try:
        ex = explain_task(name, listing, machine)
    except KeyError as err:
        raise ShellError(str(err.args[0]), kind="not_found") from None
    if shell.backend.offers("explain_task"):
        # The sentences stay the shell's; the daemon adds the allocator's own evidence (for --json).
        ex["evidence"] = shell.backend.call("explain_task", {"task": name})["constraints"]
    shell.emit(cmd, ex, lambda: render.explanation_view(ex))


@command("watch", "[SECONDS]", "show upcalls and events as they come, one line each, until Ctrl-C")
def cmd_watch(shell: "Shell", cmd: Command) -> int:
    if len(cmd.args) > 1:
        raise ShellError("usage: :watch [SECONDS]")
    duration = None
    if cmd.args:
        try:
            duration = float(cmd.args[0])
        except ValueError:
            duration = math.nan
        if not (math.isfinite(duration) and duration > 0):
            raise ShellError(f"SECONDS must be a positive number of seconds, not {cmd.args[0]!r} "
                             "(without it :watch goes on until Ctrl-C)")
    events: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
    backend = shell.backend
    stop = backend.watch(events.put)
    json_mode = shell.out.fmt == "json"
    if not json_mode:
        shell.out.note("Watching events" + (f" for {duration:g} s" if duration else "") + "; Ctrl-C stops.")
    deadline = None if duration is None else time.monotonic() + duration
    status = STATUS_OK
    lost = False
    try:
        while deadline is None or time.monotonic() < deadline:
            wait = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
            try:
                ev = events.get(timeout=wait)
            except queue.Empty:
                if lost:
                    if backend.reconnect():
                        lost = False
                        for note in backend.take_notes():
                            shell.out.note(note)
                elif not backend.alive():
                    lost = True
                    status = STATUS_ERROR
                    shell.out.note("Lost the daemon; waiting for it to come back (Ctrl-C stops).")
                continue
            ev = {k: v for k, v in ev.items() if k != "subscription"}
            if json_mode:
                shell.out.json({"time": time.time(), **ev})
            else:
                shell.out.line(render.event_line(ev))
    except KeyboardInterrupt:
        if shell.interactive:
            shell.out.line("")  # past the ^C the terminal echoed
    finally:
        stop()
    return status


# ---- changes (the daemon checks who may make them) -------------------------------------------------------
def _terms(text: str) -> list[str]:
    """`a(1). b(2)` or `a(1)` -> ["a(1)", "b(2)"]."""
    text = text.strip()
    if not text:
        return []
    try:
        stops = full_stops(text + " ")
    except ValueError:
        return [text]
    out, start = [], 0
    for s in stops:
        out.append(text[start:s].strip())
        start = s + 1
    if text[start:].strip():
        out.append(text[start:].strip())
    return [t for t in out if t]


def _scope(cmd: Command) -> tuple[str, str]:
    rest = _rest(cmd)
    if rest.startswith("--system"):
        return "system", rest[len("--system"):].strip()
    return "app", rest


@command("assert", "[--system] FACT[. FACT...]", "add facts to this shell's application (or system facts: root only)")
def cmd_assert(shell: "Shell", cmd: Command) -> None:
    scope, text = _scope(cmd)
    facts = _terms(text)
    if not facts:
        raise ShellError("usage: :assert [--system] FACT[. FACT...]")
    n = shell.backend.add_facts(facts, scope)
    shell.emit(cmd, {"added": n, "scope": scope}, [Text(f"Added {n} {scope} fact{'s' if n != 1 else ''}.")])


@command("retract", "[--system] PATTERN[. PATTERN...]", "remove every fact matching the pattern(s)")
def cmd_retract(shell: "Shell", cmd: Command) -> None:
    scope, text = _scope(cmd)
    patterns = _terms(text)
    if not patterns:
        raise ShellError("usage: :retract [--system] PATTERN[. PATTERN...]")
    n = shell.backend.remove_facts(patterns, scope)
    shell.emit(cmd, {"removed": n, "scope": scope}, [Text(f"Removed {n} {scope} fact{'s' if n != 1 else ''}.")])


@command("load", "FILE.pl", "add the clauses of a file as this shell's stored procedures", complete="file")
def cmd_load(shell: "Shell", cmd: Command) -> None:
    if len(cmd.args) != 1:
        raise ShellError("usage: :load FILE.pl")
    try:
        text = read_bytes(Path(cmd.args[0]).expanduser()).decode("utf-8")
    except OSError as err:
        raise ShellError(f"cannot read {cmd.args[0]}: {err.strerror}", kind="os") from None
    except InputError as err:
        raise ShellError(f"{cmd.args[0]}: {err}") from None
    except UnicodeDecodeError as err:
        raise ShellError(f"{cmd.args[0]}: not UTF-8 text: {err}") from None
    preds = shell.backend.add_procedure(text)
    shell.emit(cmd, {"predicates": preds}, [Text(f"Defined {', '.join(preds) or 'nothing'}.")])


def _property_value(text: str) -> Any:
    try:
        return loads_json(text)
    except InputError as err:
        raise ShellError(f"the value {text[:20]!r}... is {err}") from None
    except ValueError:
        if "," in text:
            return [v for v in text.split(",") if v]
        return text


@command("update", "TASK KEY=VALUE...", "change a task's properties (another user's task: root only)", complete="task")
def cmd_update(shell: "Shell", cmd: Command) -> None:
    if len(cmd.args) < 2 or not all("=" in a for a in cmd.args[1:]):
        raise ShellError("usage: :update TASK KEY=VALUE... (e.g. :update scan max_cores=4 sensitive=numa,cache)")
    props = {}
    for item in cmd.args[1:]:
        key, _, value = item.partition("=")
        props[key] = _property_value(value)
    if isinstance(props.get("sensitive"), str):
        props["sensitive"] = [props["sensitive"]]
    result = shell.backend.update_task(cmd.args[0], props)
    cores = (result.get("allocation") or {}).get("cores", [])
    shell.emit(cmd, result, [Text(f"Task {cmd.args[0]} updated; it now holds CPUs "
                                  f"{render.cpus_text(cores)}.")])


@command("deregister", "TASK", "remove a task (another user's task: root only)", complete="task")
def cmd_deregister(shell: "Shell", cmd: Command) -> None:
    if len(cmd.args) != 1:
        raise ShellError("usage: :deregister TASK")
    shell.backend.deregister_task(cmd.args[0])
    shell.emit(cmd, {"task": cmd.args[0]}, [Text(f"Task {cmd.args[0]} deregistered.")])


@command("rpc", "METHOD [JSON-PARAMS]", "call a daemon method directly (docs/protocol.md)", complete="method")
def cmd_rpc(shell: "Shell", cmd: Command) -> None:
    if not cmd.args:
        raise ShellError("usage: :rpc METHOD [JSON-PARAMS]")
    method = cmd.args[0]
    raw = _rest(cmd)[len(method):].strip()
    try:
        params = loads_json(raw) if raw else {}
    except InputError as err:
        raise ShellError(f"the parameters are {err}") from None
    except ValueError as err:
        raise ShellError(f"the parameters are not JSON: {err}") from None
    if not isinstance(params, dict):
        raise ShellError("the parameters must be a JSON object")
    result = shell.backend.call(method, params)
    shell.emit(cmd, result, [Text(json.dumps(result, indent=1))])


def completion_words(kind: str | None, shell: "Shell") -> list[str]:
    """Candidates for a command's first argument."""
    if kind == "command":
        return sorted(COMMANDS)
    if kind == "setting":
        return list(shell.settings.DESCRIPTIONS)
    if kind == "predicate":
        return sorted({p.name for p in system_predicates() + shell.backend.library()})
    if kind in ("task", "app"):
        try:
            listing = shell.backend.tasks()
        except Exception:
            return []
        key = "task" if kind == "task" else "app"
        return sorted({str(t[key]) for t in listing.get("tasks", []) if t.get(key)})
    if kind == "method":
        return list(shell.backend.info().get("methods", []))
    return []


def prolog_words(shell: "Shell") -> list[str]:
    names = {p.name for p in system_predicates() + shell.backend.library() + builtin_predicates()}
    names |= {pi.rpartition("/")[0] for pi, _ in _app_predicates(shell)}
    return sorted(names)


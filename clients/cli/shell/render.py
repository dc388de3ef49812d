"""How each answer looks in text mode: rich renderables, folded to the terminal's width.

The allocation is the COD paper's Figure 4: one row per task, one column per
CPU, the columns grouped by NUMA node and L3 domain (``|`` between groups),
``X`` where the task holds the CPU.  A matrix wider than the terminal is
folded at group boundaries into blocks that each fit, the task names
repeated in each; a single group wider than the terminal is cut too.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from cod.facts.cpulist import format_cpulist
from cod.facts.model import Machine

from ..matrix import BUSY, FREE, HELD, NOT_HELD, RELEASING, MatrixRow, cpu_groups, legend, matrix_lines
from ..plan_words import plan_sentence
from .explain import cpus_text, explanation_lines
from .output import SafeTable

PALETTE = ("cyan", "magenta", "green", "yellow", "blue", "bright_red", "bright_cyan", "bright_magenta",
           "bright_green", "bright_yellow", "bright_blue", "red")


def task_styles(names: list[str]) -> dict[str, str]:
    return {name: f"bold {PALETTE[i % len(PALETTE)]}" for i, name in enumerate(sorted(names))}


# ---- the allocation matrix ---------------------------------------------------------------------
def allocation_matrix(machine: Machine, listing: dict[str, Any], width: int) -> list[Text]:
    """The listing's allocation as the matrix of Figure 4, in the tasks' colours."""
    tasks = listing.get("tasks", [])
    styles = task_styles([t["task"] for t in tasks])
    held = {t["task"]: set(t.get("cores") or []) for t in tasks}
    releasing = {t["task"]: set(t.get("releasing") or []) for t in tasks}
    others = listing.get("other_tasks", [])
    busy = set((listing.get("plan") or {}).get("unavailable") or []) | {c for o in others for c in o.get("cpus", [])}
    taken = set().union(*held.values()) if held else set()

    def task_mark(name: str) -> Callable[[int], tuple[str, str]]:
        def mark(c: int) -> tuple[str, str]:
            if c in held[name]:
                return HELD, styles[name]
            return (RELEASING, styles[name]) if c in releasing[name] else (NOT_HELD, "dim")
        return mark

    rows = [MatrixRow(t["task"], styles[t["task"]], task_mark(t["task"])) for t in tasks]
    if others:
        rows.append(MatrixRow("other", "bold red",
                              lambda c: (BUSY, "bold red") if c in busy else (NOT_HELD, "dim")))
    rows.append(MatrixRow("free", "dim",
                          lambda c: (NOT_HELD, "dim") if c in taken or c in busy else (FREE, "green")))
    groups = cpu_groups(machine, list(machine.cpu_ids()))
    return [_text(line) for line in matrix_lines(groups, rows, width)]


def _text(line: list[tuple[str, str]]) -> Text:
    """A matrix line whose label's style is the line's own, as the rest's default."""
    if not line:
        return Text("")
    (label, style), *rest = line
    text = Text(label, style=style)
    for part, part_style in rest:
        text.append(part, style=part_style or None)
    return text


def allocation_view(machine: Machine, listing: dict[str, Any], width: int) -> list[Any]:
    plan = listing.get("plan") or {}
    tasks = listing.get("tasks", [])
    styles = task_styles([t["task"] for t in tasks])
    head = Text(f"Allocation on {machine.name}, epoch {listing.get('epoch')}", style="bold")
    if plan.get("solver") not in (None, "none"):
        head.append(f": plan by {plan['solver']} ({plan.get('status')}, {plan.get('solve_ms')} ms)")
    items: list[Any] = [head]
    if plan.get("solver") not in (None, "none"):
        items.append(Text(plan_sentence(plan.get("status"), plan["solver"], plan.get("proof"), plan.get("solve_ms")),
                          style="dim"))
    items.append(Text(""))
    items += allocation_matrix(machine, listing, width)
    node_of = {p.id: p.numa_node for p in machine.pus}
    for t in tasks:
        cores = t.get("cores") or []
        nodes = sorted({node_of.get(c) for c in cores if node_of.get(c) is not None})
        line = Text(t["task"], style=styles[t["task"]])
        who = f" ({t.get('app')}, pid {t.get('pid')})" if t.get("app") else ""
        line.append(f"{who}: {len(cores)} CPUs {cpus_text(cores)} on node(s) {','.join(map(str, nodes)) or '-'}")
        if t.get("releasing"):
            line.append(f", releasing {cpus_text(t['releasing'])}")
        if t.get("binding"):
            line.append(f"; bound by: {', '.join(t['binding'])}")
        items.append(line)
    for o in listing.get("other_tasks", []):
        items.append(Text(f"other: pid {o['pid']} ({o.get('comm')}) keeps CPUs {cpus_text(o.get('cpus'))} busy",
                          style="red"))
    if not tasks:
        items.append(Text("No tasks are registered.", style="dim"))
    items.append(Text(legend(HELD + RELEASING + BUSY + FREE), style="dim"))
    return items


# ---- tables --------------------------------------------------------------------------------------
def _table(colour: bool, *columns: str) -> Table:
    return SafeTable(*columns, box=box.SIMPLE_HEAD if colour else box.ASCII2, show_edge=colour,
                     header_style="bold", pad_edge=False)


def title(text: str) -> Text:
    return Text(text, style="bold")


def tasks_view(listing: dict[str, Any], colour: bool) -> list[Any]:
    tasks = listing.get("tasks", [])
    styles = task_styles([t["task"] for t in tasks])
    items: list[Any] = []
    if tasks:
        items.append(title(f"Registered tasks (epoch {listing.get('epoch')}):"))
        table = _table(colour, "task", "pid", "app", "CPUs", "n", "min..max", "properties", "CPU use", "NUMA pages")
        table.columns[3].overflow = "fold"
        for t in tasks:
            p = t.get("properties") or {}
            props = []
            if p.get("working_set_bytes"):
                from cod.facts.text import human_bytes
                props.append(f"ws {human_bytes(p['working_set_bytes'])}")
            if p.get("sensitive"):
                props.append("sensitive " + "+".join(p["sensitive"]))
            props.append("exclusive" if p.get("exclusive", True) else "shared")
            if p.get("pollutes_cache"):
                props.append("pollutes cache")
            if p.get("priority"):
                props.append(f"priority {p['priority']}")
            use = t.get("cpu_use")
            pages = t.get("numa_pages") or {}
            table.add_row(Text(t["task"], style=styles[t["task"]]), str(t.get("pid") or "-"), str(t.get("app") or "-"),
                          cpus_text(t.get("cores")), str(len(t.get("cores") or [])),
                          f"{p.get('min_cores', 1)}..{p.get('max_cores') if p.get('max_cores') is not None else 'all'}",
                          ", ".join(props), "-" if use is None else f"{use:g}%",
                          " ".join(f"{n}:{pg}" for n, pg in sorted(pages.items(), key=lambda kv: int(kv[0]))) or "-")
        items.append(table)
    else:
        items.append(Text("No tasks are registered.", style="dim"))
    others = listing.get("other_tasks", [])
    if others:
        items.append(title("Unregistered busy processes:"))
        table = _table(colour, "pid", "command", "CPU use", "CPUs kept free")
        for o in others:
            table.add_row(str(o["pid"]), str(o.get("comm")), "-" if o.get("cpu") is None else f"{o['cpu']:g} cores",
                          cpus_text(o.get("cpus")))
        items.append(table)
    else:
        items.append(Text("No unregistered busy processes.", style="dim"))
    return items


def load_text(load: float | None) -> str:
    """A load in percent as a person reads it: 71%, 120%; one decimal below 10 (4.5%)."""
    if load is None:
        return "-"
    return f"{load:.1f}%" if abs(load) < 10 and round(load, 1) != round(load) else f"{load:.0f}%"


def elastic_view(groups: list[dict[str, Any]], colour: bool) -> list[Any]:
    """Elastic groups (docs/elastic.md): what the daemon manages for them, and their Petri net."""
    if not groups:
        return [Text("No elastic groups (cod elastic --pid PID | --cgroup PATH registers one).", style="dim")]
    places = ("checks", "idle", "stable", "overload", "provision")
    table = _table(colour, "group", "mode, metric", "CPUs", "load", "state", "marking C I S O P", "last fired")
    rows, sources = [], []
    for g in groups:
        recent = sorted(g.get("transitions") or [], key=lambda ft: ft[1])[-4:]
        rows.append((g["group"], f"{g.get('mode')} {g.get('metric')}", cpus_text(g.get("cores")),
                     load_text(g.get("load")), str(g.get("state") or "-"),
                     " ".join(str(g["marking"].get(p, 0)) for p in places), " ".join(t for t, _ in recent) or "-"))
        sources.append(Text(f"  {g['group']}: " + ", ".join(f"{k} {v}" for k, v in (g.get("source") or {}).items())))
    # Narrow terminal: names, loads and states stay whole (elastic.postgres.3245 was cut to
    # elastic.postgres.32…); the other cells wrap at their spaces.  The source (a cgroup path can
    # be 60 characters) is a line of its own under the table.
    for i, column in enumerate(table.columns):  # no word is longer than its column's min_width
        if i in (0, 3, 4):
            column.no_wrap, column.min_width = i == 0, max(len(row[i]) for row in rows)
        else:
            column.min_width = max(len(word) for row in rows for word in row[i].split() or [""])
    table.collapse_padding = colour  # on a terminal: one blank between columns, not three
    for row in rows:
        table.add_row(*row)
    return [title("Elastic groups:"), table, title("Sources (what each group is):"), *sources]


def plan_view(plan: dict[str, Any], listing: dict[str, Any]) -> list[Any]:
    if plan.get("solver") in (None, "none"):
        first = "No plan has been made yet (no task was ever registered)." if plan.get("solver") == "none" else \
            "This SKB records no plan (plans are made by the daemon)."
        return [Text(first)]
    lines = [
        Text(f"Epoch {listing.get('epoch', plan.get('epoch'))}: plan by {plan['solver']}, "
             f"{plan_sentence(plan.get('status'), plan['solver'], plan.get('proof'), plan.get('solve_ms'))}",
             style="bold"),
    ]
    unavailable = plan.get("unavailable") or []
    lines.append(Text(f"CPUs kept free for unregistered busy processes: {cpus_text(unavailable)}."))
    for t in listing.get("tasks", []):
        lines.append(Text(f"  {t['task']}: {len(t.get('cores') or [])} CPUs ({cpus_text(t.get('cores'))}); "
                          f"bound by: {', '.join(t.get('binding') or []) or '-'}"))
    for key in ("cache_policy", "cache_partition"):
        if plan.get(key):
            lines.append(Text(plan[key]))
    return lines


def cache_view(view: dict[str, Any]) -> list[Any]:
    """`:cache`: the L3 domains, then each resctrl group's masks, tasks and occupancy."""
    lines = [Text(f"L3 domain: CPUs {cpus_text(d['cpus'])}, {d['bytes'] / 1048576:.0f} MiB" if d["bytes"] else
                  f"L3 domain: CPUs {cpus_text(d['cpus'])}") for d in view["l3_domains"]] or \
        [Text("The SKB knows no L3 cache.", style="dim")]
    if not view["groups"]:
        lines.append(Text("No cache partition (no resctrl, or no mix of weak and strong/moderate locality).",
                          style="dim"))
    for g in view["groups"]:
        masks = " ".join(f"{d}={m:x}" for d, m in sorted(g["masks"].items()))
        occ = " ".join(f"{d}: {b / 1048576:.1f} MiB" for d, b in sorted(g["occupancy"].items()))
        lines.append(Text(f"  {g['group']}: L3 {masks}; tasks {', '.join(g['tasks']) or '-'}"
                          + (f"; occupancy {occ}" if occ else "")))
    if view.get("policy"):
        lines.append(Text(view["policy"]))
    return lines


def explanation_view(ex: dict[str, Any]) -> list[Any]:
    out = []
    for i, line in enumerate(explanation_lines(ex)):
        if i == 0:
            out.append(Text(line, style="bold"))
        elif not line.startswith("  "):
            out.append(Text(line, style="underline"))
        else:
            out.append(Text(line))
    return out


def facts_summary_view(counts: dict[str, int], derived: list[str], app_rows: list[tuple[str, int]],
                       colour: bool) -> list[Any]:
    table = _table(colour, "predicate", "facts")
    for pi, n in counts.items():
        table.add_row(pi, str(n))
    items: list[Any] = [title("System facts (docs/skb-schema.md):"), table]
    if app_rows:
        mine = _table(colour, "predicate", "clauses")
        for pi, n in app_rows:
            mine.add_row(pi, str(n))
        items += [title("This application's facts and procedures:"), mine]
    items.append(Text("Derived predicates: " + ", ".join(derived), style="dim"))
    items.append(Text("Show one with :facts NAME (e.g. :facts pu).", style="dim"))
    return items


def procedures_view(result: dict[str, Any], library: list[str]) -> list[Any]:
    from cod.protocol.prolog_text import clause_text

    items: list[Any] = [Text(f"Procedures of application {result.get('app')}:", style="bold")]
    procs = result.get("procedures") or []
    for proc in procs:
        items.append(Text(f"% {proc['predicate']}", style="dim"))
        for clause in proc.get("clauses", []):
            items.append(Text(clause_text(clause)))
    if not procs:
        items.append(Text("  (none)", style="dim"))
    if result.get("note"):
        items.append(Text(result["note"], style="yellow"))
    items.append(Text("Library procedures (every application may call them): " + (", ".join(library) or "none"),
                      style="dim"))
    return items


# ---- events ---------------------------------------------------------------------------------------
def event_line(ev: dict[str, Any], now: float | None = None) -> Text:
    """One upcall as one line: time, event, what changed."""
    stamp = time.strftime("%H:%M:%S", time.localtime(now if now is not None else time.time()))
    frac = f"{(now if now is not None else time.time()) % 1:.3f}"[1:]
    kind = ev.get("event", "?")
    line = Text(f"{stamp}{frac} ", style="dim")
    line.append(f"{kind:<18} ", style={"allocation_changed": "cyan", "task_arrived": "green",
                                      "task_left": "magenta", "facts_changed": "yellow"}.get(kind, "bold"))
    if kind == "allocation_changed":
        parts = [f"{ev.get('task')} epoch {ev.get('epoch')}: CPUs {cpus_text(ev.get('cores'))}"]
        if ev.get("added"):
            parts.append(f"+{format_cpulist(ev['added'])}")
        if ev.get("removed"):
            parts.append(f"-{format_cpulist(ev['removed'])} within {ev.get('deadline_s')} s")
        if ev.get("reason"):
            parts.append(f"({ev['reason']})")
        line.append(" ".join(parts))
    elif kind in ("task_arrived", "task_left"):
        line.append(f"{ev.get('task')} (application {ev.get('app')}, pid {ev.get('pid')})")
        if ev.get("reason"):
            line.append(f": {ev['reason']}")
    elif kind == "facts_changed":
        line.append(f"{ev.get('scope')} facts {ev.get('op')}: {', '.join(ev.get('predicates') or [])}"
                    + (f" (application {ev['app']})" if ev.get("app") else ""))
    else:
        line.append(str({k: v for k, v in ev.items() if k not in ('event', 'subscription')}))
    return line

"""What the shell reads from the SKB with ordinary queries (docs/skb-schema.md).

Each function takes ``query(goal, max_solutions=, timeout_s=)`` (a backend's)
and returns plain data: the machine, the tasks and the allocation as the
SKB's facts state them (``task/3``, ``task_property/3``, ``allocated/2``), the
tasks' live state (``task_cpu_use/2``, ``task_numa_pages/3``), fact counts
and listings.  These work the same against a daemon and an embedded SKB.
"""

from __future__ import annotations

from typing import Any, Callable

from cod.facts.model import Machine
from cod.protocol.prolog_text import display_atom, fact_text

from .topology import TOPOLOGY_QUERY, machine_from_answer

Query = Callable[..., list[dict[str, Any]]]
VIEW_TIMEOUT_S = 5.0
_VARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _one(query: Query, goal: str) -> dict[str, Any]:
    solutions = query(goal, max_solutions=1, timeout_s=VIEW_TIMEOUT_S)
    return solutions[0] if solutions else {}


def _args(term: Any) -> list[Any]:
    return list(term.get("args", [])) if isinstance(term, dict) else []


def machine(query: Query, source: str = "skb") -> Machine:
    return machine_from_answer(_one(query, TOPOLOGY_QUERY), source)


def live_state(query: Query) -> dict[str, dict[str, Any]]:
    """Per task: ``cpu_use`` (percent of one CPU) and ``numa_pages`` ({node: pages}), as last measured."""
    answer = _one(query, "findall(u(T, P), task_cpu_use(T, P), Use), "
                        "findall(m(T, N, Pg), task_numa_pages(T, N, Pg), Pages)")
    out: dict[str, dict[str, Any]] = {}
    for task, use in map(_args, answer.get("Use") or []):
        out.setdefault(task, {"cpu_use": None, "numa_pages": {}})["cpu_use"] = use
    for task, node, pages in map(_args, answer.get("Pages") or []):
        out.setdefault(task, {"cpu_use": None, "numa_pages": {}})["numa_pages"][node] = pages
    return out


def _prop_value(value: Any) -> Any:
    if value == "true":
        return True
    if value == "false":
        return False
    if value == "none":
        return None
    return value


def tasks_from_skb(query: Query) -> dict[str, Any]:
    """The list_tasks shape, from the SKB's facts alone (no plan: the SKB does not record how it was made)."""
    answer = _one(query, "findall(t(T, P, A), task(T, P, A), Ts), "
                         "findall(p(T, K, V), task_property(T, K, V), Props), "
                         "findall(a(T, C), allocated(T, C), Alloc), "
                         "findall(o(P, Cm, Cs), other_task(P, Cm, Cs), Others), "
                         "( allocation_epoch(E) -> true ; E = 0 )")
    props: dict[str, dict[str, Any]] = {}
    for task, key, value in map(_args, answer.get("Props") or []):
        props.setdefault(task, {})[key] = _prop_value(value)
    cores: dict[str, list[int]] = {}
    for task, cpu in map(_args, answer.get("Alloc") or []):
        cores.setdefault(task, []).append(cpu)
    epoch = answer.get("E") or 0
    live = live_state(query)
    tasks = []
    for name, pid, app in sorted(map(_args, answer.get("Ts") or []), key=lambda t: str(t[0])):
        tasks.append({"task": name, "pid": pid, "app": app, "properties": props.get(name, {}),
                      "cores": sorted(cores.get(name, [])), "epoch": epoch, "binding": [],
                      **live.get(name, {"cpu_use": None, "numa_pages": {}})})
    # allocated/2 may name tasks without task/3 (an administrator's facts): show them too.
    for name in sorted(set(cores) - {t["task"] for t in tasks}):
        tasks.append({"task": name, "pid": None, "app": None, "properties": props.get(name, {}),
                      "cores": sorted(cores[name]), "epoch": epoch, "binding": [], "cpu_use": None,
                      "numa_pages": {}})
    others = [{"pid": pid, "comm": comm, "cpu": None, "cpus": cpus}
              for pid, comm, cpus in map(_args, answer.get("Others") or [])]
    unavailable = sorted({c for o in others for c in o["cpus"]})
    return {"epoch": epoch, "plan": {"solver": "none", "status": None, "solve_ms": None, "proof": "", "unavailable": unavailable},
            "tasks": tasks, "other_tasks": others}


def fact_predicates(query: Query) -> list[tuple[str, int]]:
    """The system fact predicates (``cod_sys_predicate/2``): those an administrator or the RM writes."""
    return [(s["N"], s["A"]) for s in query("cod_sys_predicate(N, A)", max_solutions=1000,
                                             timeout_s=VIEW_TIMEOUT_S)]


def count_facts(query: Query, predicates: list[tuple[str, int]]) -> dict[str, int]:
    """Clauses per predicate, in one query."""
    if not predicates:
        return {}
    goals, names = [], {}
    for i, (name, arity) in enumerate(predicates):
        var = f"N{i}"
        head = display_atom(name) if arity == 0 else f"{display_atom(name)}({', '.join('_' for _ in range(arity))})"
        goals.append(f"aggregate_all(count, {head}, {var})")
        names[var] = f"{name}/{arity}"
    answer = _one(query, ", ".join(goals))
    return {names[v]: n for v, n in answer.items() if v in names}


def list_facts(query: Query, name: str, arity: int, limit: int) -> tuple[list[str], bool]:
    """The facts of ``name/arity`` as clauses, at most ``limit``; and whether there were more."""
    variables = [_VARS[i] if i < len(_VARS) else f"V{i}" for i in range(arity)]
    goal = display_atom(name) if arity == 0 else f"{display_atom(name)}({', '.join(variables)})"
    solutions = query(goal, max_solutions=limit + 1, timeout_s=VIEW_TIMEOUT_S)
    texts = [fact_text(name, [s.get(v) for v in variables]) for s in solutions[:limit]]
    return texts, len(solutions) > limit


def elastic_groups(query: Query) -> list[dict[str, Any]]:
    """The elastic groups as the SKB holds them (``elastic_*``, docs/skb-schema.md): source, mode,
    metric, thresholds, cores, load, the net's marking and state, and its last transitions."""
    answer = _one(query, "findall(g(G, S, M, Me), elastic_group(G, S, M, Me), Gs), "
                         "findall(t(G, Lo, Hi), elastic_thresholds(G, Lo, Hi), Ths), "
                         "findall(c(G, Cs), elastic_cores(G, Cs), Cores), "
                         "findall(l(G, L), elastic_load(G, L), Loads), "
                         "findall(m(G, P, N), elastic_marking(G, P, N), Marks), "
                         "findall(s(G, St), elastic_state(G, St), States), "
                         "findall(f(G, T, At), elastic_transition(G, T, At), Fired)")
    groups: dict[str, dict[str, Any]] = {}
    for name, source, mode, metric in map(_args, answer.get("Gs") or []):
        kind = source.get("functor") if isinstance(source, dict) else None
        value = _args(source)[0] if kind else source
        groups[name] = {"group": name, "source": {kind or "source": value}, "mode": mode, "metric": metric,
                        "thresholds": None, "cores": [], "load": None, "marking": {}, "state": None,
                        "transitions": []}
    for name, lo, hi in map(_args, answer.get("Ths") or []):
        if name in groups:
            groups[name]["thresholds"] = [lo, hi]
    for key, rows in (("cores", "Cores"), ("load", "Loads"), ("state", "States")):
        for name, value in map(_args, answer.get(rows) or []):
            if name in groups:
                groups[name][key] = value
    for name, place, tokens in map(_args, answer.get("Marks") or []):
        if name in groups:
            groups[name]["marking"][place] = tokens
    for name, t, at in map(_args, answer.get("Fired") or []):
        if name in groups:
            groups[name]["transitions"].append([t, at])
    return [groups[n] for n in sorted(groups)]


def cache_partitions(query: Query) -> dict[str, Any]:
    """The L3 domains and the daemon's cache partition (``cache_*``, docs/skb-schema.md): per group
    its masks, tasks and occupancy per domain, and the policy's sentence."""
    answer = _one(query, "findall(d(Cs, S), l3_domain(Cs, S), Ds), "
                         "findall(p(G, D, M), cache_partition(G, D, M), Ps), "
                         "findall(t(G, T), cache_group_task(G, T), Ts), "
                         "findall(o(G, D, B), cache_occupancy(G, D, B), Os), "
                         "findall(P, cache_policy(P), Pol)")
    domains = [{"cpus": cpus, "bytes": size} for cpus, size in map(_args, answer.get("Ds") or [])]
    groups: dict[str, dict[str, Any]] = {}
    for name, dom, mask in map(_args, answer.get("Ps") or []):
        groups.setdefault(name, {"group": name, "masks": {}, "tasks": [], "occupancy": {}})["masks"][dom] = mask
    for name, task in map(_args, answer.get("Ts") or []):
        if name in groups:
            groups[name]["tasks"].append(task)
    for name, dom, nbytes in map(_args, answer.get("Os") or []):
        if name in groups:
            groups[name]["occupancy"][dom] = nbytes
    policy = answer.get("Pol") or []
    return {"l3_domains": domains, "groups": [groups[n] for n in sorted(groups)],
            "policy": policy[0] if policy else None}

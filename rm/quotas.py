"""How much each application and each uid may hold and ask for: pure rules over the registry.

Facts and procedures are counted by the SKB (it reports every
application's usage after each write); the limits a write may reach are
the smaller of the application's own and what its uid has left over its
other applications.  Task admission is bounded by uid too: how many tasks,
how many cores in all (``min_cores``), how high a priority, for a uid that
is not privileged (root or the daemon's own user).
"""

from __future__ import annotations

from typing import Any

from cod.skb.codec import Limits

from . import shown
from .config import PRIORITY_MAX, PRIORITY_MIN, RMConfig
from .registry import Connection, Registry, Usage


def write_limits(cfg: RMConfig, registry: Registry, app: str, uid: int) -> Limits:
    """What ``app`` (owned by ``uid``) may hold after a write."""
    mine = registry.usage.get(app, Usage())
    total = registry.uid_usage(uid)

    def left(app_max: int, uid_max: int, mine_now: int, total_now: int) -> int:
        return min(app_max, uid_max - (total_now - mine_now))

    return Limits(
        facts=left(cfg.app_max_facts, cfg.uid_max_facts, mine.facts, total.facts),
        fact_chars=left(cfg.app_max_fact_bytes, cfg.uid_max_fact_bytes, mine.fact_chars, total.fact_chars),
        clauses=left(cfg.app_max_clauses, cfg.uid_max_clauses, mine.clauses, total.clauses),
        clause_chars=left(cfg.app_max_clause_bytes, cfg.uid_max_clause_bytes, mine.clause_chars, total.clause_chars),
    )


def app_name_refusal(cfg: RMConfig, registry: Registry, uid: int, privileged: bool, app: str) -> str | None:
    """Why ``uid`` may not take one more application name ``app`` (None: it may, or holds it already)."""
    if privileged or registry.app_owner.get(app) == uid:
        return None
    held = registry.uid_apps(uid)
    if len(held) >= cfg.max_apps_per_uid:
        return (f"uid {uid} already holds {len(held)} application names (persistent ones included); the limit is "
                f"{cfg.max_apps_per_uid} (max_apps_per_uid): reuse one, or remove the persistent facts and "
                f"procedures of one to free its name")
    return None


def unprivileged_core_budget(cfg: RMConfig, n_cpus: int) -> int:
    """Most ``min_cores`` a non-privileged uid may hold over all its tasks."""
    return cfg.unprivileged_max_cores or max(1, n_cpus - 1)


def task_refusal(cfg: RMConfig, registry: Registry, uid: int, privileged: bool, name: str,
                 properties: dict[str, Any], n_cpus: int) -> str | None:
    """Why a task with ``properties`` may not be registered or updated by ``uid`` (None: it may)."""
    priority = properties.get("priority", 0)
    if isinstance(priority, int) and not isinstance(priority, bool):
        if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
            return f"priority {priority} is outside {PRIORITY_MIN}..{PRIORITY_MAX}"
        if not privileged and priority > cfg.unprivileged_max_priority:
            return (f"priority {priority} is above {cfg.unprivileged_max_priority}, "
                    f"the highest an unprivileged uid may give (setting unprivileged_max_priority)")
    if privileged:
        return None
    others = [t for t in registry.uid_tasks(uid) if t.name != name]
    if len(others) + 1 > cfg.max_tasks_per_uid:
        return f"uid {uid} has {len(others)} tasks; the limit is {cfg.max_tasks_per_uid} (max_tasks_per_uid)"
    min_cores = properties.get("min_cores", 1)
    if isinstance(min_cores, int):
        budget = unprivileged_core_budget(cfg, n_cpus)
        held = sum(t.spec.min_cores for t in others)
        if held + min_cores > budget:
            return (f"uid {uid} would reserve {shown.count(held + min_cores, 'cores')} with min_cores; an unprivileged uid may "
                    f"reserve at most {budget} of the {n_cpus} CPUs (setting unprivileged_max_cores)")
    return None


def group_refusal(cfg: RMConfig, registry: Registry, uid: int, privileged: bool, groups_of_uid: list[int],
                  min_cores: int, n_cpus: int) -> str | None:
    """Why ``uid`` may not register one more elastic group with floor ``min_cores`` (None: it may).

    A group counts as a task: against ``max_tasks_per_uid``, and its floor against the cores an
    unprivileged uid may reserve (``groups_of_uid``: the floors of the uid's other groups)."""
    if privileged:
        return None
    tasks = registry.uid_tasks(uid)
    if len(tasks) + len(groups_of_uid) + 1 > cfg.max_tasks_per_uid:
        return (f"uid {uid} has {len(tasks)} tasks and {len(groups_of_uid)} elastic groups; the limit is "
                f"{cfg.max_tasks_per_uid} in all (max_tasks_per_uid)")
    budget = unprivileged_core_budget(cfg, n_cpus)
    held = sum(t.spec.min_cores for t in tasks) + sum(groups_of_uid)
    if held + min_cores > budget:
        return (f"uid {uid} would reserve {held + min_cores} cores with min_cores; an unprivileged uid may "
                f"reserve at most {budget} of the {n_cpus} CPUs (setting unprivileged_max_cores)")
    return None


def subscription_refusal(cfg: RMConfig, registry: Registry, conn: Connection) -> str | None:
    """Why ``conn`` may not make one more subscription (None: it may).

    Every connection is bounded; an unprivileged uid also over all its connections, so that
    opening more connections does not multiply what it may hold."""
    held = len(conn.subscriptions)
    if held >= cfg.max_subscriptions_per_connection:
        return (f"this connection has {held} subscriptions; the limit is "
                f"{cfg.max_subscriptions_per_connection} (max_subscriptions_per_connection)")
    if conn.privileged:
        return None
    total = registry.uid_subscriptions(conn.peer.uid)
    if total >= cfg.max_subscriptions_per_uid:
        return (f"uid {conn.peer.uid} has {total} subscriptions over its connections; the limit is "
                f"{cfg.max_subscriptions_per_uid} (max_subscriptions_per_uid): unsubscribe some first")
    return None


def output_refusal(cfg: RMConfig, unsent_bytes: int, waited_s: float | None) -> str | None:
    """Why a peer is disconnected for what it does not read (None: it is not): the bytes the daemon
    holds for it (replies and upcalls alike), and how long the oldest of them has waited."""
    if unsent_bytes > cfg.max_output_buffer_bytes:
        return (f"{unsent_bytes} bytes queued for it are unread; the limit is {cfg.max_output_buffer_bytes} "
                f"(max_output_buffer_bytes)")
    if waited_s is not None and waited_s >= cfg.write_timeout_s:
        return (f"what was sent to it {waited_s:.1f} s ago is still unread; the limit is "
                f"{cfg.write_timeout_s:g} s (write_timeout_s)")
    return None

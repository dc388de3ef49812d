"""resctrl enforcement: a control group per cache class or task, beside the CPU backends.

The CPU backends (affinity, cpuset) decide where a task runs; this one decides
how much of each last-level cache (and memory bandwidth) it may fill.  Its input
is a list of `GroupPlan` (from `cod.rm.allocator.cachepart`): a group name, an
L3 way mask per cache domain, optionally an MB value per domain, and the pids
in it.  `ResctrlEnforcer.apply` makes the mount match the list:

1. record the group's directory in the state file (before mkdir: a crash after
   it still finds the group to remove);
2. mkdir ``ROOT/cod_NAME`` (the kernel gives it a CLOSID and an RMID);
3. write its ``schemata`` (``L3``, or ``L3CODE`` and ``L3DATA`` with CDP, the same
   mask to both; ``MB`` where present) in one write;
4. write every thread id of its pids new to the group to ``tasks``, one per write
   (threads born later inherit their creator's group);
5. rmdir every ``cod_`` group not in the list (its tasks fall back to the default group).

A refusal names the group, the file and the kernel's ``info/last_cmd_status``.
Everything goes through one I/O seam, `ResctrlFS` (`FS_FACTORY`, replaced by the
fake kernel in tests).  State: ``STATE_DIR/resctrl-state.json`` under its own lock
``STATE_DIR/resctrl.lock``; ``cleanup_stale`` removes what a crashed run left, and
every ``cod_`` group the file does not name.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cod.facts import procfs

from .errors import EnforceError
from .resctrl_info import ResctrlInfo, format_line, read_info
from .resctrlfs import ResctrlError, ResctrlFS, is_busy

log = logging.getLogger("cod.rm.enforce")

DEFAULT_ROOT = "/sys/fs/resctrl"
PREFIX = "cod_"
STATE_FILE = "resctrl-state.json"
LOCK_FILE = "resctrl.lock"
GROUP_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,59}")
MON_FILES = ("llc_occupancy", "mbm_total_bytes")

FS_FACTORY: Callable[[str], ResctrlFS] = ResctrlFS


@dataclass(frozen=True)
class GroupPlan:
    """One resctrl control group as the plan wants it."""

    name: str
    masks: dict[int, int]                       # L3 domain -> way mask
    pids: tuple[int, ...] = ()
    bandwidth: dict[int, int] = field(default_factory=dict)   # MB domain -> value (omitted: unchanged)

    def __post_init__(self) -> None:
        if not GROUP_NAME.fullmatch(self.name):
            raise EnforceError(f"resctrl group name {self.name!r}: use 1-60 of A-Z a-z 0-9 _ . - "
                               "(not starting with . or -)")


def group_dir(name: str) -> str:
    return PREFIX + name


def schemata_text(info: ResctrlInfo, plan: GroupPlan) -> str:
    """The group's ``schemata`` write: L3 (or L3CODE + L3DATA) masks, then MB."""
    out = []
    for res in info.caches.values():
        if res.name.startswith("L3"):
            unknown = sorted(set(plan.masks) - set(res.domains))
            if unknown:
                raise EnforceError(f"resctrl group {plan.name}: no L3 domain {unknown[0]} "
                                   f"(the mount has {list(res.domains)})")
            out.append(format_line(res.name, plan.masks, hexa=True))
    if plan.bandwidth and info.bandwidth is not None:
        out.append(format_line("MB", plan.bandwidth, hexa=False))
    return "".join(out)


class ResctrlEnforcer:
    """Groups, schemata and tasks under one resctrl mount; a state file to undo them."""

    name = "resctrl"

    def __init__(self, root: str, state_dir: str) -> None:
        self.fs = FS_FACTORY(root)
        self.info = read_info(self.fs)
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        self.state_path = os.path.join(state_dir, STATE_FILE)
        self._lock_fd = os.open(os.path.join(state_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise EnforceError(f"another COD daemon holds {state_dir}/{LOCK_FILE} (resctrl)") from None
        self.recorded: set[str] = self._load()
        self.applied: dict[str, GroupPlan] = {}

    def describe(self) -> str:
        return f"resctrl ({self.fs.root}: {self.info.describe()})"

    # ---- the state file -------------------------------------------------
    def _load(self) -> set[str]:
        try:
            with open(self.state_path) as f:
                data = json.load(f)
        except FileNotFoundError:
            return set()
        except (OSError, ValueError) as err:
            raise EnforceError(f"cannot read {self.state_path}: {err}") from err
        if data.get("version") != 1:
            raise EnforceError(f"{self.state_path}: unknown version {data.get('version')!r}; remove it "
                               f"after checking {self.fs.root} for cod_ groups")
        return set(data.get("groups", []))

    def _save(self) -> None:
        tmp = self.state_path + ".tmp"
        try:
            with open(tmp, "w") as f:
                json.dump({"version": 1, "root": self.fs.root, "groups": sorted(self.recorded)}, f)
            os.replace(tmp, self.state_path)
        except OSError as err:
            raise EnforceError(f"cannot write {self.state_path}: {err.strerror}") from err

    # ---- applying a plan --------------------------------------------------
    def apply(self, plans: Sequence[GroupPlan]) -> list[str]:
        """Make the mount hold exactly ``plans``' groups; returns one line per problem (logged too).

        A group the kernel refuses (no CLOSID left, RMIDs still draining, a mask it rejects)
        is reported and skipped; the others are applied; the next apply tries it again."""
        problems = []
        wanted = {p.name: p for p in plans}
        if len(wanted) != len(plans):
            raise EnforceError("resctrl plan names a group twice")
        for name in sorted(set(self.applied) - set(wanted)):
            problems += self._remove(name)
        grouped = {p for plan in plans for p in plan.pids}
        for name, plan in sorted(wanted.items()):
            try:
                self._apply_one(plan, grouped)
            except ResctrlError as err:
                hint = " (RMIDs of removed groups are still draining; retried at the next plan)" \
                    if is_busy(err) else ""
                problems.append(f"group {name}: {err}{hint}")
        for line in problems:
            log.warning("resctrl: %s", line)
        return problems

    def _apply_one(self, plan: GroupPlan, grouped: set[int]) -> None:
        d = group_dir(plan.name)
        old = self.applied.get(plan.name)
        if d not in self.recorded:
            self.recorded.add(d)
            self._save()
        self.fs.mkdir(d)
        if old is None or old.masks != plan.masks or old.bandwidth != plan.bandwidth:
            self.fs.write(f"{d}/schemata", schemata_text(self.info, plan))
        self.applied[plan.name] = GroupPlan(plan.name, dict(plan.masks), (), dict(plan.bandwidth))
        for pid in sorted(set(old.pids if old else ()) - grouped):
            self._write_tids("tasks", pid)  # in no group any more: back to the default group
        for pid in plan.pids:
            if old is None or pid not in old.pids:  # threads born later inherit the group
                self._write_tids(f"{d}/tasks", pid)
        self.applied[plan.name] = plan

    def _write_tids(self, rel: str, pid: int) -> None:
        """Every thread of ``pid`` into the ``tasks`` file ``rel`` (resctrl moves single threads)."""
        for tid in procfs.thread_ids(pid) or [pid]:
            try:
                self.fs.write(rel, str(tid))
            except ResctrlError as err:
                if procfs.alive(tid):
                    raise err
                # it exited meanwhile

    def _remove(self, name: str) -> list[str]:
        d = group_dir(name)
        self.applied.pop(name, None)
        try:
            self.fs.rmdir(d)
        except ResctrlError as err:
            return [f"group {name}: {err}"]
        self.recorded.discard(d)
        self._save()
        return []

    # ---- monitoring ---------------------------------------------------------
    def monitoring(self) -> dict[str, dict[int, dict[str, int]]]:
        """{group: {L3 domain: {llc_occupancy: bytes, mbm_total_bytes: bytes}}} of our groups."""
        out: dict[str, dict[int, dict[str, int]]] = {}
        for name in sorted(self.applied):
            base = f"{group_dir(name)}/mon_data"
            for mon in self.fs.listdir(base):
                if not mon.startswith("mon_L3_"):
                    continue
                values = {}
                for feat in MON_FILES:
                    if feat in self.info.mon_features and self.fs.exists(f"{base}/{mon}/{feat}"):
                        text = self.fs.read(f"{base}/{mon}/{feat}").strip()
                        if text.isdigit():  # "Unavailable" / "Error" when the counter is not readable
                            values[feat] = int(text)
                out.setdefault(name, {})[int(mon[len("mon_L3_"):])] = values
        return out

    # ---- undoing ------------------------------------------------------------
    def cleanup_stale(self) -> list[str]:
        """Remove the groups a previous run recorded, and any other cod_ group; one line each."""
        done = []
        names = set(self.recorded) | {n for n in self.fs.listdir("") if n.startswith(PREFIX)}
        for d in sorted(names - {group_dir(n) for n in self.applied}):
            try:
                if self.fs.rmdir(d):
                    done.append(f"removed resctrl group {self.fs.path(d)}")
                self.recorded.discard(d)
            except ResctrlError as err:
                log.warning("could not remove stale resctrl group: %s", err)
        self._save()
        for line in done:
            log.info("%s", line)
        return done

    def close(self) -> None:
        """Remove every group (their tasks go back to the default group) and the state file."""
        for name in sorted(self.applied):
            for line in self._remove(name):
                log.warning("resctrl: %s", line)
        self.cleanup_stale()
        if not self.recorded:
            try:
                os.unlink(self.state_path)
            except FileNotFoundError:
                pass
        os.close(self._lock_fd)


def open_resctrl(root: str | None, state_dir: str) -> ResctrlEnforcer | None:
    """The resctrl backend at ``root`` after removing what a crashed run left; None (logged) when
    the root is no resctrl mount (the machine has no RDT, or it is not mounted)."""
    root = root or DEFAULT_ROOT
    fs = FS_FACTORY(root)
    if not fs.mounted():
        log.info("cache partitioning off: %s is no resctrl mount (mount -t resctrl resctrl %s on RDT hardware)",
                 root, root)
        return None
    enforcer = ResctrlEnforcer(root, state_dir)
    enforcer.cleanup_stale()
    log.info("cache partitioning: %s", enforcer.describe())
    return enforcer

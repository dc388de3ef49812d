"""A fake resctrl kernel for tests: fixture trees and the kernel's refusals, without FUSE.

What it is, honestly: a plain directory laid out like a resctrl mount
(``info/``, ``schemata``, ``tasks``, ``cpus_list``, ``mon_data/``) plus
`FakeResctrlFS`, a subclass of the backend's one I/O seam
(`cod.rm.enforce.resctrlfs.ResctrlFS`) that checks each mkdir, rmdir and write
against the rules Linux's resctrl applies (arch/x86/kernel/cpu/resctrl and
fs/resctrl: ``cbm_validate``, ``bw_validate``, ``closid_alloc``, the RMID
limbo list) before it changes the directory, and answers a refusal the way the
kernel does: an OSError with the kernel's errno and its words in
``info/last_cmd_status``.  It is not kernfs: a process that writes the files
directly (echo > schemata) bypasses the rules; only code that goes through the
seam meets them.  The daemon in end-to-end tests runs with the seam replaced
(`run_daemon_main`), so the real `cod rm` meets the rules too.

Rules emulated:

* mkdir of a group beyond ``num_closids`` (the default group holds one): ENOSPC,
  "Out of CLOSIDs"; when every free RMID is still in limbo (recently freed, its
  occupancy not yet drained): EBUSY, "Out of RMIDs" (kernel >= 6.8);
* schemata: unknown resource ("L3" on a CDP mount) or domain, non-hex mask,
  mask 0 or beyond ``cbm_mask`` ("Mask out of range"), non-consecutive bits
  unless ``sparse_masks`` (AMD), fewer than ``min_cbm_bits`` set, MB outside
  [min_bandwidth, max] (Intel's value is rounded up to ``bandwidth_gran``, as the
  kernel does), a domain named twice: EINVAL and nothing changes;
* tasks: one live pid per write (a dead one: ESRCH); it leaves its old group;
* rmdir: the group's tasks go back to the default group, its RMID into limbo.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field

from cod.rm.enforce.resctrlfs import ResctrlFS

SPEC_FILE = ".fake-resctrl.json"   # in the root: the machine's rules and the fake's own bookkeeping
NON_GROUPS = {"info", "mon_data", "mon_groups"}


@dataclass
class FakeSpec:
    """One machine's resctrl: the fixture's parameters."""

    kind: str
    cbm_len: int = 20
    min_cbm_bits: int = 1
    num_closids: int = 16
    sparse: bool = False
    cdp: bool = False
    l3_domains: tuple[int, ...] = (0,)
    mb: dict | None = None          # {"min": .., "gran": .., "max": ..}
    num_rmids: int = 64
    limbo_s: float = 0.0            # how long a freed RMID stays busy
    cpus: str = "0-1"

    @property
    def cache_names(self) -> tuple[str, ...]:
        return ("L3CODE", "L3DATA") if self.cdp else ("L3",)


# Fixtures named for the hardware shape.
INTEL = FakeSpec(kind="intel", cbm_len=20, min_cbm_bits=1, num_closids=16, l3_domains=(0, 1),
                 mb={"min": 10, "gran": 10, "max": 100}, num_rmids=176)
INTEL_CDP = FakeSpec(kind="intel_cdp", cbm_len=20, min_cbm_bits=2, num_closids=8, cdp=True,
                     l3_domains=(0, 1), num_rmids=176)
AMD = FakeSpec(kind="amd", cbm_len=16, min_cbm_bits=0, num_closids=16, sparse=True, l3_domains=(0, 1, 2, 3),
               mb={"min": 0, "gran": 1, "max": 2048}, num_rmids=256)
SPECS = {s.kind: s for s in (INTEL, INTEL_CDP, AMD)}


def _put(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def _get(path: str) -> str:
    with open(path) as f:
        return f.read()


# ---- the kernel's rules as pure functions (fast enough for property tests) -------

class Refused(Exception):
    def __init__(self, err: int, status: str) -> None:
        super().__init__(status)
        self.errno = err
        self.status = status


def check_cbm(spec: FakeSpec, text: str) -> int:
    """cbm_validate(): the mask or Refused(EINVAL, the kernel's words)."""
    try:
        val = int(text, 16)
    except ValueError:
        raise Refused(errno.EINVAL, f"Non-hex character in the mask {text}") from None
    full = (1 << spec.cbm_len) - 1
    if (val == 0 and spec.min_cbm_bits > 0) or val > full:
        raise Refused(errno.EINVAL, "Mask out of range")
    if val and not spec.sparse:
        low = (val & -val).bit_length() - 1
        run = val >> low
        if run & (run + 1):
            raise Refused(errno.EINVAL, f"The mask {val:x} has non-consecutive 1-bits")
    if bin(val).count("1") < spec.min_cbm_bits:
        raise Refused(errno.EINVAL, f"Need at least {spec.min_cbm_bits} bits in the mask")
    return val


def check_bw(spec: FakeSpec, text: str) -> int:
    """bw_validate(): the value (rounded up to the granularity) or Refused(EINVAL)."""
    assert spec.mb is not None
    if not text.isdigit():
        raise Refused(errno.EINVAL, f"Non-decimal digit in MB value {text}")
    val = int(text)
    lo, hi, gran = spec.mb["min"], spec.mb["max"], spec.mb["gran"]
    if val < lo or val > hi:
        raise Refused(errno.EINVAL, f"MB value {val} out of range [{lo},{hi}]")
    return -(-val // gran) * gran


def apply_schemata(spec: FakeSpec, current: dict[str, dict[int, int]], text: str) -> dict[str, dict[int, int]]:
    """The group's values after writing ``text`` to its schemata; Refused and nothing changed on error."""
    new = {r: dict(v) for r, v in current.items()}
    seen: set[tuple[str, int]] = set()
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        name, sep, rest = line.partition(":")
        name = name.strip()
        if not sep or name not in current:
            raise Refused(errno.EINVAL, f"Unknown or unsupported resource name '{name}'")
        for item in rest.split(";"):
            dom, eq, val = item.strip().partition("=")
            if not eq or not dom.strip().isdigit():
                raise Refused(errno.EINVAL, f"Missing '=' or non-numeric domain id in '{item.strip()}'")
            d = int(dom)
            if d not in current[name]:
                raise Refused(errno.EINVAL, f"Unknown domain {d} of {name}")
            if (name, d) in seen:
                raise Refused(errno.EINVAL, f"Duplicate domain {d}")
            seen.add((name, d))
            new[name][d] = check_bw(spec, val.strip()) if name == "MB" else check_cbm(spec, val.strip())
    return new


def format_schemata(spec: FakeSpec, values: dict[str, dict[int, int]]) -> str:
    width = (spec.cbm_len + 3) // 4
    lines = []
    for name, doms in values.items():
        if name == "MB":
            lines.append("MB:" + ";".join(f"{d}={v:>4}" for d, v in sorted(doms.items())))
        else:
            lines.append(f"{name}:" + ";".join(f"{d}={v:0{width}x}" for d, v in sorted(doms.items())))
    return "\n".join(lines) + "\n"


def default_values(spec: FakeSpec) -> dict[str, dict[int, int]]:
    vals = {n: {d: (1 << spec.cbm_len) - 1 for d in spec.l3_domains} for n in spec.cache_names}
    if spec.mb is not None:
        vals["MB"] = {d: spec.mb["max"] for d in spec.l3_domains}
    return vals


# ---- the tree -----------------------------------------------------------------------

def build_tree(root: str, spec: FakeSpec) -> str:
    """Lay out a freshly mounted resctrl for ``spec`` under ``root``; returns root."""
    os.makedirs(root, exist_ok=True)
    for name in spec.cache_names:
        base = os.path.join(root, "info", name)
        _put(os.path.join(base, "cbm_mask"), f"{(1 << spec.cbm_len) - 1:x}\n")
        _put(os.path.join(base, "min_cbm_bits"), f"{spec.min_cbm_bits}\n")
        _put(os.path.join(base, "num_closids"), f"{spec.num_closids}\n")
        _put(os.path.join(base, "shareable_bits"), "0\n")
        _put(os.path.join(base, "sparse_masks"), f"{int(spec.sparse)}\n")
    if spec.mb is not None:
        base = os.path.join(root, "info", "MB")
        _put(os.path.join(base, "min_bandwidth"), f"{spec.mb['min']}\n")
        _put(os.path.join(base, "bandwidth_gran"), f"{spec.mb['gran']}\n")
        _put(os.path.join(base, "num_closids"), f"{spec.num_closids}\n")
        _put(os.path.join(base, "delay_linear"), "1\n")
    _put(os.path.join(root, "info", "L3_MON", "num_rmids"), f"{spec.num_rmids}\n")
    _put(os.path.join(root, "info", "L3_MON", "mon_features"), "llc_occupancy\nmbm_total_bytes\nmbm_local_bytes\n")
    _put(os.path.join(root, "info", "last_cmd_status"), "ok\n")
    _group_files(root, spec, cpus=spec.cpus)
    state = {"spec": asdict(spec), "groups": {}, "limbo": [], "rmids_used": 1}
    _put(os.path.join(root, SPEC_FILE), json.dumps(state))
    return root


def _group_files(path: str, spec: FakeSpec, cpus: str = "") -> None:
    _put(os.path.join(path, "schemata"), format_schemata(spec, default_values(spec)))
    _put(os.path.join(path, "tasks"), "")
    _put(os.path.join(path, "cpus_list"), f"{cpus}\n" if cpus else "\n")
    _put(os.path.join(path, "mode"), "shareable\n")
    for d in spec.l3_domains:
        mon = os.path.join(path, "mon_data", f"mon_L3_{d:02d}")
        _put(os.path.join(mon, "llc_occupancy"), "0\n")
        _put(os.path.join(mon, "mbm_total_bytes"), "0\n")


def group_names(root: str) -> list[str]:
    return sorted(n for n in os.listdir(root)
                  if os.path.isdir(os.path.join(root, n)) and n not in NON_GROUPS)


def load_spec(root: str) -> FakeSpec:
    s = json.loads(_get(os.path.join(root, SPEC_FILE)))["spec"]
    s["l3_domains"] = tuple(s["l3_domains"])
    return FakeSpec(**s)


class FakeResctrlFS(ResctrlFS):
    """The seam with the kernel's rules in front of a fixture tree built by `build_tree`."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.spec = load_spec(root)
        self.writes: list[tuple[str, str]] = []   # every accepted (path, text), for the property tests

    # ---- bookkeeping kept in the tree, so a daemon and a test share it ----
    def _state(self) -> dict:
        return json.loads(_get(os.path.join(self.root, SPEC_FILE)))

    def _save(self, state: dict) -> None:
        _put(os.path.join(self.root, SPEC_FILE), json.dumps(state))

    def _status(self, text: str) -> None:
        _put(os.path.join(self.root, "info", "last_cmd_status"), text + "\n")

    def _refuse(self, err: Refused) -> OSError:
        self._status(err.status)
        return OSError(err.errno, os.strerror(err.errno))

    def _group_of(self, path: str) -> str | None:
        rel = os.path.relpath(os.path.dirname(path), self.root)
        return "" if rel == "." else rel if "/" not in rel else None

    # ---- the raw operations -------------------------------------------------
    def _mkdir(self, path: str) -> None:
        if os.path.dirname(os.path.abspath(path)) != os.path.abspath(self.root) or \
                os.path.basename(path) in NON_GROUPS:
            raise self._refuse(Refused(errno.EPERM, "Only top-level control groups are emulated"))
        if os.path.exists(path):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path)
        state = self._state()
        if len(group_names(self.root)) + 1 >= self.spec.num_closids:
            raise self._refuse(Refused(errno.ENOSPC, "Out of CLOSIDs"))
        now = time.monotonic()
        state["limbo"] = [t for t in state["limbo"] if t > now]
        if state["rmids_used"] + len(state["limbo"]) >= self.spec.num_rmids:
            err = errno.EBUSY if state["limbo"] else errno.ENOSPC
            raise self._refuse(Refused(err, "Out of RMIDs"))
        os.mkdir(path)
        _group_files(path, self.spec)
        state["rmids_used"] += 1
        self._save(state)
        self._status("ok")

    def _rmdir(self, path: str) -> None:
        if not os.path.isdir(path):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        if self._group_of(os.path.join(path, "x")) in (None, "") or os.path.basename(path) in NON_GROUPS:
            raise self._refuse(Refused(errno.EPERM, "Only control groups can be removed"))
        moved = _get(os.path.join(path, "tasks")).split()
        if moved:
            with open(os.path.join(self.root, "tasks"), "a") as f:
                f.write("".join(f"{p}\n" for p in moved))
        shutil.rmtree(path)
        state = self._state()
        state["rmids_used"] -= 1
        if self.spec.limbo_s > 0:
            state["limbo"].append(time.monotonic() + self.spec.limbo_s)
        self._save(state)
        self._status("ok")

    def _write(self, path: str, text: str) -> None:
        group = self._group_of(path)
        name = os.path.basename(path)
        if group is None or name not in ("schemata", "tasks", "cpus_list"):
            raise self._refuse(Refused(errno.EACCES, f"{name} is not writable"))
        if not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        try:
            if name == "schemata":
                current = apply_schemata(self.spec, default_values(self.spec), _get(path))
                _put(path, format_schemata(self.spec, apply_schemata(self.spec, current, text)))
            elif name == "tasks":
                self._move_task(path, text)
            else:
                _put(path, text.strip() + "\n")
        except Refused as err:
            raise self._refuse(err) from None
        self.writes.append((os.path.relpath(path, self.root), text))
        self._status("ok")

    def _move_task(self, path: str, text: str) -> None:
        for item in text.replace(",", " ").split():
            if not item.isdigit():
                raise Refused(errno.EINVAL, f"Task list parsing error pid {item}")
            pid = int(item)
            if not os.path.exists(f"/proc/{pid}"):
                raise Refused(errno.ESRCH, f"No task {pid}")
            for g in ["", *group_names(self.root)]:
                tasks = os.path.join(self.root, g, "tasks")
                kept = [p for p in _get(tasks).split() if p != item]
                _put(tasks, "".join(f"{p}\n" for p in kept))
            with open(path, "a") as f:
                f.write(f"{pid}\n")

    def _read(self, path: str) -> str:
        text = _get(path)
        if os.path.basename(path) == "tasks":  # the kernel lists live tasks only
            text = "".join(f"{p}\n" for p in text.split() if os.path.exists(f"/proc/{p}"))
        return text


def fs_factory(root: str) -> ResctrlFS:
    """The backend's FS_FACTORY in tests: the fake kernel on fixture trees, plain I/O elsewhere."""
    return FakeResctrlFS(root) if os.path.exists(os.path.join(root, SPEC_FILE)) else ResctrlFS(root)


def run_daemon_main() -> None:
    """``python -m tests.helpers.fake_resctrl ARGS``: `cod` with the resctrl seam replaced by the
    fake kernel, so the real daemon meets the kernel's rules on a fixture tree."""
    from cod.cli.main import main
    from cod.rm.enforce import resctrl

    resctrl.FS_FACTORY = fs_factory
    sys.exit(main(sys.argv[1:]))


if __name__ == "__main__":
    run_daemon_main()

"""The maps of the sched_ext scheduler ``scx_cod`` (kernel_patches/scx_cod), as the RM writes them.

The loader pins them under `PIN_DIR`; this module opens the pins through libbpf's C API
(``libbpf.so.1``, ctypes) and knows their layout (kernel_patches/scx_cod/scx_cod.h: keep in step):

* ``group_cpus``   array, group -> CPU mask (``MASK_WORDS`` u64s); group 0 is every task nobody
                   registered, and gets the CPUs no registered task reserved;
* ``tgid_group``   hash, tgid (u32) -> group (u32);
* ``cgroup_group`` hash, cgroup v2 id (u64) -> group (u32);
* ``stats``        per-CPU counters (`STATS`);
* ``kick``         a syscall program: every CPU reschedules now (run after a reallocation).

`scheduler_state()` says whether the running sched_ext scheduler is ``cod``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from collections.abc import Iterable

from .errors import EnforceError

PIN_DIR = "/sys/fs/bpf/cod_scx"
SCHED_EXT = "/sys/kernel/sched_ext"
OPS_NAME = "cod"
MAX_CPUS = 256
MASK_WORDS = MAX_CPUS // 64
MAX_GROUPS = 32
STATS = ("direct", "queued", "unbound", "inherited", "moved", "exempt")
MAPS = ("group_cpus", "tgid_group", "cgroup_group", "stats")


def read_state(sched_ext: str = SCHED_EXT) -> tuple[str | None, str | None]:
    """The kernel's sched_ext state (None: no sched_ext in this kernel) and the running
    scheduler's name (None: none, or it has none)."""
    try:
        with open(os.path.join(sched_ext, "state")) as f:
            state = f.read().strip()
    except OSError:
        return None, None
    if state != "enabled":
        return state, None
    try:
        with open(os.path.join(sched_ext, "root", "ops")) as f:
            return state, f.read().strip()
    except OSError:
        return state, None


def scheduler_state(sched_ext: str = SCHED_EXT) -> str | None:
    """None when the scheduler ``cod`` runs; else why not (for the log and get_topology)."""
    state, ops = read_state(sched_ext)
    if state is None:
        return "this kernel has no sched_ext (CONFIG_SCHED_CLASS_EXT)"
    if state != "enabled":
        return f"no sched_ext scheduler is running (state: {state})"
    if ops is None:
        return "the running sched_ext scheduler has no name"
    return None if ops == OPS_NAME else f"the running sched_ext scheduler is {ops!r}, not {OPS_NAME!r}"


def mask_bytes(cpus: Iterable[int]) -> bytes:
    words = [0] * MASK_WORDS
    for cpu in cpus:
        if not 0 <= cpu < MAX_CPUS:
            raise EnforceError(f"CPU {cpu} is beyond scx_cod's {MAX_CPUS} CPUs")
        words[cpu // 64] |= 1 << (cpu % 64)
    return struct.pack(f"={MASK_WORDS}Q", *words)


def mask_cpus(raw: bytes) -> list[int]:
    words = struct.unpack(f"={MASK_WORDS}Q", raw)
    return [w * 64 + b for w, word in enumerate(words) for b in range(64) if word >> b & 1]


def _libbpf() -> ctypes.CDLL:
    name = ctypes.util.find_library("bpf") or "libbpf.so.1"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as err:
        raise EnforceError(f"libbpf is needed to write scx_cod's maps: {err}") from err
    lib.bpf_obj_get.argtypes = [ctypes.c_char_p]
    for fn in ("bpf_map_update_elem", "bpf_map_lookup_elem", "bpf_map_delete_elem", "bpf_map_get_next_key"):
        getattr(lib, fn).restype = ctypes.c_int
    lib.bpf_map_update_elem.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64]
    lib.bpf_map_lookup_elem.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    lib.bpf_map_delete_elem.argtypes = [ctypes.c_int, ctypes.c_void_p]
    lib.bpf_map_get_next_key.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    lib.bpf_prog_test_run_opts.argtypes = [ctypes.c_int, ctypes.c_void_p]
    return lib


class ScxMaps:
    """The pinned maps; each call is one bpf() system call (or a few)."""

    def __init__(self, pin_dir: str = PIN_DIR) -> None:
        self._lib = _libbpf()
        self.fds: dict[str, int] = {}
        try:
            for name in (*MAPS, "kick"):
                fd = self._lib.bpf_obj_get(os.path.join(pin_dir, name).encode())
                if fd < 0:
                    raise EnforceError(f"cannot open scx_cod's {name} in {pin_dir}: "
                                       f"{os.strerror(ctypes.get_errno())} (is the loader running?)")
                self.fds[name] = fd
        except EnforceError:
            self.close()
            raise
        self.ncpus = os.cpu_count() or 1

    def _check(self, rc: int, what: str) -> None:
        if rc < 0:
            raise EnforceError(f"scx_cod: {what} failed: {os.strerror(ctypes.get_errno())}")

    def set_group_cpus(self, group: int, cpus: Iterable[int]) -> None:
        key, value = ctypes.c_uint32(group), ctypes.create_string_buffer(mask_bytes(cpus))
        self._check(self._lib.bpf_map_update_elem(self.fds["group_cpus"], ctypes.byref(key), value, 0),
                    f"writing group {group}'s CPUs")

    def group_cpus(self, group: int) -> list[int]:
        key, value = ctypes.c_uint32(group), ctypes.create_string_buffer(8 * MASK_WORDS)
        self._check(self._lib.bpf_map_lookup_elem(self.fds["group_cpus"], ctypes.byref(key), value),
                    f"reading group {group}'s CPUs")
        return mask_cpus(value.raw)

    def set_tgid(self, tgid: int, group: int) -> None:
        key, value = ctypes.c_uint32(tgid), ctypes.c_uint32(group)
        self._check(self._lib.bpf_map_update_elem(self.fds["tgid_group"], ctypes.byref(key), ctypes.byref(value), 0),
                    f"putting process {tgid} in group {group}")

    def set_cgroup(self, cgroup_id: int, group: int) -> None:
        key, value = ctypes.c_uint64(cgroup_id), ctypes.c_uint32(group)
        self._check(self._lib.bpf_map_update_elem(self.fds["cgroup_group"], ctypes.byref(key),
                                                  ctypes.byref(value), 0), f"putting cgroup {cgroup_id} in group {group}")

    def delete_tgid(self, tgid: int) -> None:
        key = ctypes.c_uint32(tgid)
        self._lib.bpf_map_delete_elem(self.fds["tgid_group"], ctypes.byref(key))  # gone already: fine

    def delete_cgroup(self, cgroup_id: int) -> None:
        key = ctypes.c_uint64(cgroup_id)
        self._lib.bpf_map_delete_elem(self.fds["cgroup_group"], ctypes.byref(key))

    def _entries(self, name: str, ktype) -> dict[int, int]:
        fd, out = self.fds[name], {}
        key, nxt, value = ktype(), ktype(), ctypes.c_uint32()
        prev = None
        while self._lib.bpf_map_get_next_key(fd, prev, ctypes.byref(nxt)) == 0:
            if self._lib.bpf_map_lookup_elem(fd, ctypes.byref(nxt), ctypes.byref(value)) == 0:
                out[nxt.value] = value.value
            key.value = nxt.value
            prev = ctypes.byref(key)
        return out

    def tgids(self) -> dict[int, int]:
        """tgid -> group, including the children the scheduler put in their parent's group."""
        return self._entries("tgid_group", ctypes.c_uint32)

    def cgroups(self) -> dict[int, int]:
        return self._entries("cgroup_group", ctypes.c_uint64)

    def stats(self) -> dict[str, int]:
        """The scheduler's counters, summed over CPUs."""
        fd, out = self.fds["stats"], {}
        possible = _possible_cpus()
        for i, name in enumerate(STATS):
            key, values = ctypes.c_uint32(i), (ctypes.c_uint64 * possible)()
            self._check(self._lib.bpf_map_lookup_elem(fd, ctypes.byref(key), values), "reading stats")
            out[name] = sum(values)
        return out

    def kick(self) -> None:
        """Every CPU reschedules: a task on a CPU its group lost moves now, not at its next tick."""
        opts = ctypes.c_uint64(8)  # struct bpf_test_run_opts with only .sz (the rest zero)
        self._check(self._lib.bpf_prog_test_run_opts(self.fds["kick"], ctypes.byref(opts)), "kicking the CPUs")

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()


def _possible_cpus() -> int:
    """Per-CPU map values come for every possible CPU (/sys/devices/system/cpu/possible)."""
    try:
        with open("/sys/devices/system/cpu/possible") as f:
            text = f.read().strip()
    except OSError:
        return os.cpu_count() or 1
    last = 0
    for part in text.split(","):
        last = max(last, int(part.split("-")[-1]))
    return last + 1

"""Numbers of the system calls that have no glibc wrapper (libnuma has them), called by ctypes.

From the kernel's syscall tables (arch/*/entry/syscalls/*.tbl, include/uapi/asm-generic/unistd.h
for the generic ones).  One home for the tables and the lookup: `cpuset.migrate_pages`,
`pagemove.PageMover` and `slice.request_slice` call through it.
"""

from __future__ import annotations

import platform

from .errors import EnforceError

NUMBERS: dict[str, dict[str, int]] = {
    "migrate_pages": {
        "x86_64": 256, "i386": 294, "i686": 294, "aarch64": 238, "riscv64": 238, "loongarch64": 238,
        "ppc64": 258, "ppc64le": 258, "s390x": 287, "mips64": 5246,
    },
    "move_pages": {
        "x86_64": 279, "i386": 317, "i686": 317, "aarch64": 239, "riscv64": 239, "loongarch64": 239,
        "ppc64": 301, "ppc64le": 301, "s390x": 310, "mips64": 5267,
    },
    "sched_setattr": {
        "x86_64": 314, "i386": 351, "i686": 351, "aarch64": 274, "riscv64": 274, "loongarch64": 274,
        "ppc64": 355, "ppc64le": 355, "s390x": 345,
    },
}


def syscall_number(name: str, what: str, machine: str | None = None,
                   remedy: str = "turn memory_migrate off") -> int:
    """``name``'s number on ``machine`` (this one by default); an EnforceError saying that
    ``what`` is not supported there (and ``remedy``) when the table has no number for it."""
    arch = machine or platform.machine()
    try:
        return NUMBERS[name][arch]
    except KeyError:
        raise EnforceError(f"{what} is not supported on {arch}: {name}(2) has no known number "
                           f"there ({remedy})") from None

"""Take every privilege from the SKB engine, then exec it (docs/security.md, "The threat model").

Run as ``python -I -S lockdown.py [options] -- swipl ...`` between the driver
and SWI-Prolog: it imports nothing but the standard library, so it starts in
a few milliseconds, and it never returns (it execs, or exits 126 saying why).

What it does, in this order:

1. Opens the i-th ``--reach DIR`` as ``O_PATH`` descriptor 10 + i (as root, before the drop),
   so that the engine can reach its files and its private directory through
   ``/proc/self/fd/N`` even when a parent directory is closed to its uid (the
   caller writes the command with those paths: skb/lifecycle.py).
2. Sets the engine's resource limits (``--memory``: RLIMIT_AS; no core files;
   a bound on the size of a file it writes).
3. As root: locks the securebits, drops every capability from the bounding
   set, clears the ambient set, sets no supplementary groups and switches
   real, effective and saved uid and gid to ``--user`` (which loses every
   capability), then empties the capability sets explicitly.
4. ``PR_SET_NO_NEW_PRIVS`` (also when not root).
5. Landlock, when the kernel has it: reads anywhere (file permissions still
   apply), writes only under ``--private`` and to /dev/null, execution only
   of the program it is about to exec and its ELF interpreter, no TCP bind or
   connect, no signals or abstract sockets outside the engine.
6. ``--env LD_PRELOAD=...cod_noexec.so`` (given by the caller when built): a
   library that installs a seccomp filter denying execve and execveat before
   SWI-Prolog's ``main`` (native/cod_noexec.c), which closes the one way
   Landlock leaves open: running the ELF interpreter by hand.

Not root (``cod query`` by a user): step 3 is skipped, the rest holds.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import resource
import struct
import sys

FALLBACK_USER = "nobody"
FIRST_REACH_FD = 10  # --reach directories are descriptors 10, 11, ... in the engine
MAX_FILE_BYTES = 64 << 20  # the most the engine may write into one file of its private directory

# prctl(2)
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
# securebits: no uid 0 magic (NOROOT), locked; the set-uid fix-up (which clears the capabilities
# when the uid leaves 0) locked on; keep-caps locked off
SECUREBITS = 0x01 | 0x02 | 0x08 | 0x20

# landlock(7)
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
SYS_CAPSET = {"x86_64": 126, "aarch64": 91}.get(os.uname().machine)
LANDLOCK_CREATE_RULESET_VERSION = 1
LANDLOCK_RULE_PATH_BENEATH = 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_REMOVE_DIR, FS_REMOVE_FILE, FS_MAKE_CHAR, FS_MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
FS_MAKE_REG, FS_MAKE_SOCK, FS_MAKE_FIFO, FS_MAKE_BLOCK = 1 << 8, 1 << 9, 1 << 10, 1 << 11
FS_MAKE_SYM, FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 12, 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1

READ = FS_READ_FILE | FS_READ_DIR
WRITE_TREE = (FS_WRITE_FILE | FS_REMOVE_DIR | FS_REMOVE_FILE | FS_MAKE_DIR | FS_MAKE_REG
              | FS_MAKE_SOCK | FS_MAKE_FIFO | FS_MAKE_SYM | FS_REFER | FS_TRUNCATE)
FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV


try:  # imported by the driver: under the one error root
    from cod.protocol.errors import CodError as _ErrorRoot
except ImportError:  # run as a script (-I -S): the standard library only
    _ErrorRoot = Exception  # type: ignore[assignment,misc]


class LockdownError(_ErrorRoot):  # type: ignore[valid-type,misc]
    """A step of the privilege drop failed; the engine must not start."""


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise LockdownError(f"{what}: {os.strerror(err)}")
    return ret


def prctl(option: int, arg: int, what: str) -> None:
    _check(_libc.prctl(option, arg, 0, 0, 0), what)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 without Landlock (too old, or not enabled at boot)."""
    ret = _libc.syscall(SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0),
                        ctypes.c_uint32(LANDLOCK_CREATE_RULESET_VERSION))
    return max(0, int(ret))


def _fs_rights(abi: int) -> int:
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def open_rules(private: str | None, executables: list[str]) -> list[tuple[int, int]]:
    """(descriptor, rights) of each Landlock rule, opened while the paths can still be reached."""
    rules = [("/", READ), ("/dev/null", FS_READ_FILE | FS_WRITE_FILE)]
    rules += [(path, FS_READ_FILE | FS_EXECUTE) for path in executables]
    if private is not None:
        rules.append((private, READ | WRITE_TREE))
    out = []
    for path, allowed in rules:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        out.append((fd, allowed if os.path.isdir(f"/proc/self/fd/{fd}") else allowed & FILE_RIGHTS))
    return out


def restrict_with_landlock(abi: int, rules: list[tuple[int, int]]) -> None:
    """Reads anywhere; writes under the private directory and to /dev/null; runs only the executables."""
    handled = _fs_rights(abi)
    net = NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0
    scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0
    attr = struct.pack("=QQQ", handled, net, scoped)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    buf = ctypes.create_string_buffer(attr, len(attr))
    ruleset = _check(_libc.syscall(SYS_LANDLOCK_CREATE_RULESET, buf, ctypes.c_size_t(size), ctypes.c_uint32(0)),
                     "landlock_create_ruleset")
    try:
        for fd, allowed in rules:
            rule = ctypes.create_string_buffer(struct.pack("=Qi", allowed & handled, fd), 12)
            _check(_libc.syscall(SYS_LANDLOCK_ADD_RULE, ctypes.c_int(ruleset),
                                 ctypes.c_int(LANDLOCK_RULE_PATH_BENEATH), rule, ctypes.c_uint32(0)),
                   f"landlock_add_rule({os.readlink(f'/proc/self/fd/{fd}')})")
        _check(_libc.syscall(SYS_LANDLOCK_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)),
               "landlock_restrict_self")
    finally:
        os.close(ruleset)
        for fd, _ in rules:
            os.close(fd)


def elf_interpreter(path: str) -> str | None:
    """The dynamic loader named in ``path``'s PT_INTERP, or None (static, or not a 64-bit ELF)."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:5] != b"\x7fELF\x02":
            return None
        phoff, = struct.unpack_from("<Q", head, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", head, 0x36)
        for i in range(phnum):
            f.seek(phoff + i * phentsize)
            p_type, _flags, p_offset, _vaddr, _paddr, p_filesz = struct.unpack("<IIQQQQ", f.read(40))
            if p_type == 3:
                f.seek(p_offset)
                return f.read(p_filesz).rstrip(b"\0").decode()
    return None


def resolve_user(name: str, fallback: bool = True) -> tuple[int, int]:
    """(uid, gid) of ``name`` (a user name or a uid); of ``nobody`` if it does not exist and
    ``fallback``, else KeyError."""
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except KeyError:
        if not fallback:
            raise
        entry = pwd.getpwnam(FALLBACK_USER)
    if entry.pw_uid == 0:
        raise LockdownError(f"the SKB engine may not run as root (user {name!r})")
    return entry.pw_uid, entry.pw_gid


def drop_root(uid: int, gid: int) -> None:
    """Lose root and every capability for good."""
    prctl(PR_SET_SECUREBITS, SECUREBITS, "locking the securebits")
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for cap in range(last + 1):
        prctl(PR_CAPBSET_DROP, cap, f"dropping capability {cap} from the bounding set")
    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, "clearing the ambient capabilities")
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if SYS_CAPSET is not None:  # the uid change cleared the rest; this empties the inheritable set too
        header = ctypes.create_string_buffer(struct.pack("=Ii", 0x20080522, 0), 8)  # _LINUX_CAPABILITY_VERSION_3
        data = ctypes.create_string_buffer(24)  # two zeroed {effective, permitted, inheritable}
        _check(_libc.syscall(SYS_CAPSET, header, data), "capset")
    if os.getuid() == 0 or os.geteuid() == 0:
        raise LockdownError("still root after setresuid")


def reach(dirs: list[str]) -> None:
    """Descriptor FIRST_REACH_FD + i on ``dirs[i]``, inherited: the engine reaches it as /proc/self/fd/N."""
    opened = [os.open(d, os.O_PATH | os.O_DIRECTORY) for d in dirs]
    if any(fd >= FIRST_REACH_FD for fd in opened):
        raise LockdownError("descriptors from 10 on are taken")
    for i, fd in enumerate(opened):
        os.dup2(fd, FIRST_REACH_FD + i, inheritable=True)
        os.close(fd)


def parse(argv: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    if "--" not in argv:
        raise LockdownError("usage: lockdown.py [--user U] [--memory B] [--private D] [--reach D]... "
                            "[--env K=V]... [--no-landlock] -- PROGRAM ARGS...")
    split = argv.index("--")
    opts: dict[str, list[str]] = {}
    it = iter(argv[:split])
    for flag in it:
        if flag == "--no-landlock":
            opts[flag] = []
            continue
        if flag not in ("--user", "--memory", "--private", "--reach", "--env"):
            raise LockdownError(f"unknown option {flag!r}")
        opts.setdefault(flag, []).append(next(it))
    return opts, argv[split + 1:]


def lock_down(opts: dict[str, list[str]], command: list[str]) -> tuple[list[str], dict[str, str]]:
    """Apply every restriction to this process; the command and environment to exec."""
    program = os.path.realpath(command[0])
    env = dict(os.environ)
    env.update(kv.partition("=")[::2] for kv in opts.get("--env", []))
    reach(opts.get("--reach", []))
    abi = 0 if "--no-landlock" in opts else landlock_abi()
    rules: list[tuple[int, int]] = []
    if abi:
        loader = elf_interpreter(program)
        rules = open_rules(opts.get("--private", [None])[-1],
                           [program] + ([os.path.realpath(loader)] if loader else []))
    for value in opts.get("--memory", []):
        resource.setrlimit(resource.RLIMIT_AS, (int(value), int(value)))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES, MAX_FILE_BYTES))
    if os.geteuid() == 0:
        drop_root(*resolve_user(opts.get("--user", [FALLBACK_USER])[-1]))
    prctl(PR_SET_NO_NEW_PRIVS, 1, "PR_SET_NO_NEW_PRIVS")
    if abi:
        restrict_with_landlock(abi, rules)
    env["COD_SKB_LANDLOCK_ABI"] = str(abi)
    return [program] + command[1:], env


def main(argv: list[str]) -> int:
    try:
        opts, command = parse(argv)
        os.umask(0o077)
        args, env = lock_down(opts, command)
        os.execve(args[0], args, env)
    except (LockdownError, OSError, ValueError) as err:
        print(f"COD SKB lockdown: {err}; the engine does not start", file=sys.stderr, flush=True)
    return 126


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Boot a NUMA guest with cgroup v2 under qemu (TCG) and run pytest, or a shell, inside it.

    python3 tests/vm/vmrun.py test  --topology 2x2 [--kernel debian|scx] [--timeout S] [--rw DIR] [-- PYTEST ARGS...]
    python3 tests/vm/vmrun.py shell --topology 4x2
    python3 tests/vm/vmrun.py prepare

The guest is virtme-ng (PyPI) booting Debian's 6.12 kernel image (``apt-get download``, unpacked
with ``dpkg -x``, never installed) on this machine's own root file system over 9p, read-only,
with writable overlays on /etc, /tmp, /var... and on the project's tree, so pytest inside sees
the project, its .venv, SWI-Prolog and the C builds, and writes nowhere on the host.  Both
come from a cache (``$COD_VM_CACHE``, else ``~/.cache/cod-vm``) keyed by their versions:
``vng-VERSION/`` (a venv) and ``kernel-PACKAGEVERSION/``.  Standard library only: it runs
before and beside the project's own venv.

``--kernel scx`` boots instead the kernel kernel_patches/build_kernel.sh builds from Debian's
linux-source-6.12 with sched_ext and BTF (cached as ``kernel-scx-VERSION-CONFIGHASH/``, no
modules), after building the scheduler scx_cod against it (kernel_patches/build_scx_cod.sh).

The test session runs as root inside; its output is pytest's own and its exit code is this
program's.  ``--rw DIR`` (a directory of the project, e.g. bench/experiments/results) is the
one exception to "writes nowhere": the guest writes through to the host's DIR (9p), so that
an experiment run in the guest (tests/vm/fig6_scx.py) leaves its results.  On a timeout the guest (the process group this program started) is killed.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from guestconsole import SCRIPT_STARTED, StderrSplitter, headline, outcome  # noqa: E402
from topologies import ENV, TOPOLOGIES, topology  # noqa: E402

VNG_VERSION = "1.42"
# Debian 12's 6.12 kernel (linux-6.12 in bookworm-security): NUMA, cgroup v2 cpuset, 9p.
KERNEL_PACKAGES = r"^linux-image-6\.12\.[0-9]+\+deb12-amd64-unsigned$"
# numpy needs more than qemu64 (SSE4/AVX: an illegal instruction otherwise); 5-level paging
# off, or the TCG guest panics; 'max' also shows one L3 per node.
QEMU_CPU = "max,la57=off"
# Only what the guest mounts with: udev would otherwise load every driver qemu's machine
# offers (AHCI, CD-ROM, KVM, crypto), which takes over a minute under TCG.
GUEST_MODULES = ("9p", "9pnet", "9pnet_virtio", "netfs", "overlay")
# The host's enforcement tests do not depend on the number of nodes: one guest runs them.
DEFAULT_TESTS = {"2x2": ["tests/vm", "tests/rm/enforce/test_enforce_affinity.py"], "4x2": ["tests/vm"]}
# The sched_ext kernel's guests (issue 48): what depends on the number of nodes, the allocation
# and the daemon that runs scx_cod itself, on 4 nodes (CPUs 4-7 included); the rest (moves, the
# fallback, the ejection, the context-switch cost, the backend's host tests) on 2, where a test
# costs half as much under TCG.  Each test runs in one guest: both would cost make test ~5 min.
_SCX = "tests/vm/test_scx.py::test_"
SCX_4_NODES = [_SCX + name for name in (
    "the_scheduler_runs_and_the_backend_takes_it", "a_newcomer_gets_no_time_on_reserved_cpus",
    "under_cpuset_the_same_newcomer_runs_on_reserved_cpus", "a_group_per_node_keeps_each_task_on_its_node_and_newcomers_off_them",
    "the_daemon_runs_scx_cod_itself_restarts_it_and_stops_it")]
SCX_TESTS = {"4x2": SCX_4_NODES,
             "2x2": ["tests/vm/test_scx.py", "tests/rm/enforce/test_enforce_scx.py",
                     *(f"--deselect={t}" for t in SCX_4_NODES)]}
KERNELS = ("debian", "scx")
# A cpuset kept for the guest's whole run: while one exists the kernel's cpusets_enabled() static
# key stays on, instead of being patched in and out of the page allocator's code each time a test
# makes the first cpuset or removes the last. QEMU 7.2's TCG races with that patching (clean
# clone 17: Oops int3 in __alloc_pages, 1,065 s into the 2x2 suite).
KEPT_CPUSET = "/sys/fs/cgroup/cod-vm-static-keys"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class VmError(Exception):
    """The guest could not be prepared: says what is missing."""


def cache_dir() -> str:
    return os.environ.get("COD_VM_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "cod-vm")


def log(msg: str) -> None:
    print(f"vm: {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], **kw) -> str:
    res = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if res.returncode != 0:
        raise VmError(f"{shlex.join(cmd)} failed ({res.returncode}): {res.stderr.strip() or res.stdout.strip()}")
    return res.stdout


def _build_once(final: str, build) -> str:
    """Make ``final`` with ``build(tmpdir)`` unless it exists; atomic, so runs can share the cache."""
    if os.path.isdir(final):
        return final
    os.makedirs(os.path.dirname(final), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(final) + ".tmp-", dir=os.path.dirname(final))
    try:
        build(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not os.path.isdir(final):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


# ---- virtme-ng -----------------------------------------------------------------------------

def ensure_vng() -> str:
    """The bin directory of a venv holding virtme-ng ``VNG_VERSION``."""
    def build(tmp: str) -> None:
        log(f"installing virtme-ng {VNG_VERSION} into {cache_dir()}")
        _run([sys.executable, "-m", "venv", tmp])
        _run([os.path.join(tmp, "bin", "python"), "-m", "pip", "install", "-q", f"virtme-ng=={VNG_VERSION}"])
        # The venv's scripts name their interpreter by path: move it under its final name.
        final = os.path.join(cache_dir(), f"vng-{VNG_VERSION}")
        for script in glob.glob(os.path.join(tmp, "bin", "*")):
            if os.path.isfile(script) and not os.path.islink(script):
                with open(script, "rb") as f:
                    text = f.read()
                if text.startswith(b"#!") and tmp.encode() in text:
                    with open(script, "wb") as f:
                        f.write(text.replace(tmp.encode(), final.encode()))
    venv = _build_once(os.path.join(cache_dir(), f"vng-{VNG_VERSION}"), build)
    return os.path.join(venv, "bin")


# ---- the kernel ----------------------------------------------------------------------------

def newest_kernel_package() -> tuple[str, str]:
    """(package, version) of Debian's newest 6.12 amd64 kernel image apt knows."""
    names = _run(["apt-cache", "pkgnames", "linux-image-6.12"]).split()
    names = [n for n in names if re.match(KERNEL_PACKAGES, n)]
    if not names:
        raise VmError("apt knows no linux-image-6.12.*+deb12-amd64-unsigned: run 'apt-get update' "
                      "(bookworm-security must be in the sources)")
    name = max(names, key=lambda n: [int(x) for x in re.findall(r"\d+", n.split("+")[0])])
    version = _run(["apt-cache", "show", "--no-all-versions", name])
    found = re.search(r"^Version: (\S+)$", version, re.M)
    if not found:
        raise VmError(f"apt-cache show {name} names no version")
    return name, found.group(1)


def _modules_closure(moddir: str, wanted: tuple[str, ...]) -> set[str]:
    deps: dict[str, list[str]] = {}
    with open(os.path.join(moddir, "modules.dep")) as f:
        for line in f:
            mod, _, rest = line.partition(":")
            deps[mod] = rest.split()
    by_name = {re.sub(r"\.ko(\.\w+)?$", "", os.path.basename(m)): m for m in deps}
    todo = [by_name[w] for w in wanted]
    keep: set[str] = set()
    while todo:
        mod = todo.pop()
        if mod not in keep:
            keep.add(mod)
            todo += deps[mod]
    return keep


def ensure_kernel() -> tuple[str, str, str]:
    """(vmlinuz, modules directory, kernel release), unpacked from the package into the cache
    (its directory names the package version with '_' for what virtme-ng's options refuse, '~')."""
    cached = sorted(glob.glob(os.path.join(cache_dir(), "kernel-*", "boot", "vmlinuz-*")))
    try:
        name, version = newest_kernel_package()
    except VmError:
        if not cached:
            raise
        return _kernel_paths(os.path.dirname(os.path.dirname(cached[-1])))

    def build(tmp: str) -> None:
        log(f"downloading {name} {version} into {cache_dir()}")
        _run(["apt-get", "download", f"{name}={version}"], cwd=tmp)
        debs = glob.glob(os.path.join(tmp, "*.deb"))
        full = os.path.join(tmp, "full")
        _run(["dpkg", "-x", debs[0], full])
        kver = os.listdir(os.path.join(full, "lib", "modules"))[0]
        src = os.path.join(full, "lib", "modules", kver)
        _run(["depmod", "-b", full, kver])  # the package leaves modules.dep to its postinst
        dst = os.path.join(tmp, "lib", "modules", kver)
        for mod in _modules_closure(src, GUEST_MODULES):
            os.makedirs(os.path.dirname(os.path.join(dst, mod)), exist_ok=True)
            shutil.copy2(os.path.join(src, mod), os.path.join(dst, mod))
        for meta in glob.glob(os.path.join(src, "modules.builtin*")) + [os.path.join(src, "modules.order")]:
            shutil.copy2(meta, dst)
        _run(["depmod", "-b", tmp, kver])
        os.makedirs(os.path.join(tmp, "boot"))
        for f in (f"vmlinuz-{kver}", f"config-{kver}"):
            shutil.copy2(os.path.join(full, "boot", f), os.path.join(tmp, "boot", f))
        shutil.rmtree(full)
        for deb in debs:
            os.unlink(deb)
    return _kernel_paths(_build_once(os.path.join(cache_dir(), "kernel-" + re.sub(r"[^A-Za-z0-9.-]", "_", version)), build))


def ensure_scx_kernel() -> str:
    """The bzImage of the sched_ext kernel, built (and scx_cod with it) unless cached.  The
    scripts' output passes through; a failure's reason is their last ``scx-kernel:`` line."""
    script = os.path.join(ROOT, "kernel_patches", "build_scx_cod.sh")
    log("the sched_ext kernel and scx_cod (kernel_patches/build_scx_cod.sh; a first build takes long)")
    proc = subprocess.Popen([script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reason: list[str] = []

    def copy_err() -> None:
        for line in proc.stderr:
            sys.stderr.write(line)
            sys.stderr.flush()
            if line.startswith("scx-kernel: "):
                reason[:] = [line[len("scx-kernel: "):].strip()]
    copier = threading.Thread(target=copy_err, daemon=True)
    copier.start()
    out = proc.stdout.read()
    rc = proc.wait()
    copier.join()
    if rc != 0:
        why = reason[0] if reason else "its output is above"
        raise VmError(f"the sched_ext kernel or scx_cod could not be built: {why}")
    return os.path.join(out.strip().splitlines()[-1], "bzImage")


def _kernel_paths(kdir: str) -> tuple[str, str, str]:
    vmlinuz = glob.glob(os.path.join(kdir, "boot", "vmlinuz-*"))[0]
    kver = os.path.basename(vmlinuz)[len("vmlinuz-"):]
    return vmlinuz, os.path.join(kdir, "lib", "modules", kver), kver


# ---- the guest -----------------------------------------------------------------------------

def vng_command(topo_name: str, exec_cmd: str | None, verbose: bool,
                kernel: str = "debian", rw: tuple[str, ...] = ()) -> tuple[list[str], dict[str, str]]:
    if shutil.which("qemu-system-x86_64") is None or shutil.which("busybox") is None:
        raise VmError("qemu-system-x86_64 and busybox are needed: 'make vm-deps' installs them "
                      "(Debian's qemu-system-x86, busybox-static, udev, kmod)")
    if kernel == "scx":
        kernel_args = ["--run", ensure_scx_kernel()]  # everything built in: no modules
    else:
        vmlinuz, modules, kver = ensure_kernel()
        kernel_args = ["--run", vmlinuz, f"--rodir=/lib/modules/{kver}={modules}"]
    bindir = ensure_vng()
    cmd = [os.path.join(bindir, "vng"), *kernel_args, "--disable-kvm", "--force-9p",
           "--overlay-rwdir", ROOT, "--user", "root",
           "--cwd", ROOT, f"--qemu-opts=-cpu {QEMU_CPU}", *topology(topo_name).vng_args(),
           *(f"--rwdir={d}" for d in rw_dirs(rw))]
    if exec_cmd is not None:
        # The console always comes out (guestconsole.py keeps it); without --verbose, only
        # the kernel's warnings and worse (the last loglevel= on the command line wins).
        cmd += ["--verbose", "--exec", exec_cmd] + ([] if verbose else ["--append", "loglevel=4"])
    elif verbose:
        cmd.append("--verbose")
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    return cmd, env


def rw_dirs(dirs: tuple[str, ...]) -> list[str]:
    """The absolute paths of ``--rw`` directories: existing directories of the project."""
    out = []
    for d in dirs:
        path = os.path.realpath(os.path.join(ROOT, d))
        if not os.path.isdir(path) or os.path.commonpath([path, ROOT]) != ROOT or path == ROOT:
            raise VmError(f"--rw {d}: not an existing directory inside the project (under {ROOT})")
        out.append(path)
    return out


def guest_pytest(topo_name: str, pytest_args: list[str], kernel: str = "debian") -> str:
    """The shell command the guest runs: pytest from the project's venv, the topology and kernel named."""
    python = os.path.join(ROOT, ".venv", "bin", "python")
    keep = (f"{{ echo +cpuset > /sys/fs/cgroup/cgroup.subtree_control && mkdir -p {KEPT_CPUSET}; }} "
            f"|| echo 'cod-vm: no cpuset kept: the cpuset static key may flip' >&2")
    return (f"echo {shlex.quote(SCRIPT_STARTED)} >&2 && {{ {keep}; }} && "
            f"cd {shlex.quote(ROOT)} && export {ENV}={topo_name} COD_VM_KERNEL={kernel} PYTHONDONTWRITEBYTECODE=1 && "
            f"exec {shlex.quote(python)} -m pytest -p no:cacheprovider {shlex.join(pytest_args)}")


def with_tests(topo_name: str, pytest_args: list[str], kernel: str = "debian") -> list[str]:
    """pytest's arguments, with the guest's default tests unless they name a file or directory
    (so that '-x' or '-k partition' alone still runs the guest suite, not the host's testpaths)."""
    if any(os.path.exists(os.path.join(ROOT, a.split("::")[0])) for a in pytest_args if not a.startswith("-")):
        return pytest_args
    return [*pytest_args, *(SCX_TESTS if kernel == "scx" else DEFAULT_TESTS)[topo_name]]


def _copy_out(pipe) -> None:
    for chunk in iter(lambda: pipe.read1(65536), b""):
        sys.stdout.buffer.write(chunk)
        sys.stdout.buffer.flush()


def run_guest(cmd: list[str], env: dict[str, str], timeout: float | None, interactive: bool,
              verbose: bool = False) -> tuple[int, StderrSplitter | None]:
    """Run virtme-ng in its own process group; on a timeout, SIGTERM or Ctrl-C kill that whole
    group (vng and its qemu), so no guest outlives this program. Returns its exit code and,
    unless interactive, what its stderr held (the console)."""
    stdin = None if interactive else subprocess.DEVNULL
    scratch = tempfile.mkdtemp(prefix="cod-vm-")  # vng's temporary files, gone even after a kill
    # qemu opens the script's stdout and stderr ports by path, one open per port: on a regular
    # file they would overwrite each other, so they get pipes that this program copies out.
    pipe = None if interactive else subprocess.PIPE
    proc = subprocess.Popen(cmd, env=dict(env, TMPDIR=scratch), stdin=stdin, stdout=pipe, stderr=pipe,
                            start_new_session=not interactive)
    splitter, copier = None, None
    if not interactive:
        copier = threading.Thread(target=_copy_out, args=(proc.stdout,), daemon=True)
        copier.start()
        splitter = StderrSplitter(proc.stderr, echo_console=verbose)

    def on_term(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        log(f"the guest ran past {timeout:.0f} s: killing it (process group {proc.pid})")
        rc = 124
    except KeyboardInterrupt:
        rc = 130
    finally:
        if proc.poll() is None:
            if interactive:
                proc.kill()
            else:
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        shutil.rmtree(scratch, ignore_errors=True)
    if copier is not None:
        copier.join()
    return rc, splitter


def run_tests(topo_name: str, cmd: list[str], env: dict[str, str], timeout: float, verbose: bool) -> int:
    """Boot the guest and run its script; boot again (up to BOOT_ATTEMPTS in all) only when
    one of QEMU's TCG races ended it (guestconsole.py says which and why)."""
    attempt = 1
    while True:
        start = time.monotonic()
        rc, splitter = run_guest(cmd, env, timeout, interactive=False, verbose=verbose)
        console = splitter.join()
        log(f"the {topo_name} guest ended with {rc} after {time.monotonic() - start:.0f} s")
        verdict = outcome(rc, splitter.script_started, console, attempt)
        if verdict.show_console and not verbose:
            started = "after the tests started" if splitter.script_started else "before the tests started"
            log(f"the guest kernel's console {started} (warnings and worse, last lines):")
            for line in console:
                print(f"  {line}", file=sys.stderr)
        if verdict.boot_again:
            when = "during the tests" if splitter.script_started else "while booting, before any test ran"
            again = "running the suite again in a new guest" if splitter.script_started else "booting it again"
            log(f"{verdict.race} {when} ({headline(console)}): a known QEMU 7.2 bug "
                f"(tests/vm/guestconsole.py); {again}")
            attempt += 1
            continue
        return rc


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["test", "shell", "prepare"])
    parser.add_argument("--topology", default="2x2", choices=sorted(TOPOLOGIES))
    parser.add_argument("--kernel", default="debian", choices=KERNELS,
                        help="debian: Debian's 6.12 image; scx: 6.12 built with sched_ext (kernel_patches/)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds before the guest is killed")
    parser.add_argument("--verbose", action="store_true", help="show the guest's kernel console")
    parser.add_argument("--rw", action="append", default=[],
                        help="a directory of the project the guest writes through to (repeatable)")
    parser.epilog = f"After '--': pytest's arguments (default: {DEFAULT_TESTS})."
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    args.pytest_args = argv[split + 1:]
    try:
        if args.action == "prepare":
            if args.kernel == "scx":
                ensure_scx_kernel()
            ensure_kernel()
            ensure_vng()
            return 0
        if args.action == "shell":
            cmd, env = vng_command(args.topology, None, args.verbose, args.kernel)
            return run_guest(cmd, env, None, interactive=True)[0]
        tests = with_tests(args.topology, args.pytest_args, args.kernel)
        cmd, env = vng_command(args.topology, guest_pytest(args.topology, tests, args.kernel), args.verbose, args.kernel,
                               tuple(args.rw))
    except VmError as err:
        log(str(err))
        return 2
    log(f"booting the {args.topology} guest, {args.kernel} kernel (TCG; timeout {args.timeout:.0f} s)")
    return run_tests(args.topology, cmd, env, args.timeout, args.verbose)


if __name__ == "__main__":
    sys.exit(main())

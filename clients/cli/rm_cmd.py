"""`cod rm`: run the Resource Manager daemon (see docs/running.md)."""

from __future__ import annotations

import argparse

from cod.rm.allocator.model import SOLVERS
from cod.rm.enforce.modes import MODES as ENFORCE_CHOICES

from .errors import ExitStatus, UserError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "rm",
        help="run the Resource Manager daemon",
        description="Run the COD Resource Manager: serve the SKB and the allocation on a Unix socket "
        "until SIGTERM or SIGINT.",
    )
    p.add_argument("--socket", metavar="PATH",
                   help="socket path (default: $COD_SOCKET, else /run/cod/rm.sock as root, "
                        "else $XDG_RUNTIME_DIR/cod/rm.sock)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--machine", metavar="NAME",
                     help="plan for a reference machine instead of this one (implies --no-enforce)")
    src.add_argument("--hwloc", metavar="FILE",
                     help="plan for the machine of an hwloc XML file (implies --no-enforce)")
    enf = p.add_mutually_exclusive_group()
    enf.add_argument("--enforce", dest="enforce_mode", choices=ENFORCE_CHOICES, default=None, metavar="MODE",
                     help="how allocations are applied: cpuset (a cgroup per task, root), affinity "
                          "(sched_setaffinity on every thread), sched_ext (the BPF scheduler scx_cod, which "
                          "the daemon starts unless it runs; the daemon refuses to start where it cannot), "
                          "sched_ext,cpuset or sched_ext,affinity (that backend, with a warning, where "
                          "scx_cod cannot run) or none (default: sched_ext where scx_cod runs, else cpuset "
                          "when root and mounted, else affinity)")
    enf.add_argument("--no-enforce", dest="enforce", action="store_const", const=False, default=None,
                     help="compute and announce allocations but do not pin any process (= --enforce none)")
    p.add_argument("--scx-loader", metavar="PATH",
                   help="with --enforce sched_ext: the scx_cod loader to run (default: the checkout's "
                        "kernel_patches/scx_cod/build/scx_cod, else PREFIX/libexec/cod/scx_cod, else scx_cod on PATH)")
    p.add_argument("--state-dir", metavar="DIR",
                   help="where the daemon records what it pinned, for cleanup after a crash "
                        "(default: /run/cod as root, else $XDG_RUNTIME_DIR/cod)")
    p.add_argument("--cgroup-parent", metavar="NAME", help="cpuset cgroup holding the tasks' cgroups (default: cod)")
    p.add_argument("--resctrl-root", metavar="DIR",
                   help="resctrl mount for cache partitioning (default: /sys/fs/resctrl; none there: off)")
    mig = p.add_mutually_exclusive_group()
    mig.add_argument("--memory-migrate", dest="memory_migrate", action="store_const", const=True, default=None,
                     help="move a task's resident pages to its nodes when they change, in batches of bounded "
                          "time (the default)")
    mig.add_argument("--no-memory-migrate", dest="memory_migrate", action="store_const", const=False,
                     help="leave resident pages where they are (cgroup v2 cpuset mode: the kernel still moves "
                          "them, in one go, when cpuset.mems changes)")
    conf = p.add_mutually_exclusive_group()
    conf.add_argument("--confine-others", dest="confine_others", action="store_const", const=True, default=None,
                      help="confine unregistered busy processes to the cores no task holds (default when root)")
    conf.add_argument("--no-confine-others", dest="confine_others", action="store_const", const=False,
                      help="only record unregistered busy processes and keep tasks away from their cores")
    p.add_argument("--no-busy-detect", dest="busy_detect", action="store_const", const=False, default=None,
                   help="do not watch for unregistered busy processes")
    p.add_argument("--busy-interval", dest="busy_interval_s", type=float, default=None, metavar="SECONDS",
                   help="busy-process sampling period (default: 0.1)")
    p.add_argument("--busy-window", type=int, default=None, metavar="SAMPLES",
                   help="samples a process must stay busy to count as a hog (default: 3)")
    p.add_argument("--busy-threshold", type=float, default=None, metavar="CORES",
                   help="CPU use, in cores, that counts as busy (default: 0.5)")
    p.add_argument("--refresh-interval", dest="refresh_interval_s", type=float, default=None, metavar="SECONDS",
                   help="live state (load, free memory, task CPU and pages) into the SKB every SECONDS (default: 1)")
    p.add_argument("--solver", choices=SOLVERS, default=None,
                   help="allocator (default: cpsat, falling back to greedy at the time limit)")
    p.add_argument("--solver-time-limit", dest="solver_time_limit_s", type=float, default=None, metavar="SECONDS",
                   help="time limit of one allocator run (default: 1)")
    p.add_argument("--config", metavar="FILE", help="TOML file with the same settings as these flags")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default=None,
                   help="log verbosity on stderr (default: info)")
    p.add_argument("--revoke-deadline", dest="revoke_deadline_s", type=float, default=None, metavar="SECONDS",
                   help="grace time a task gets to give back cores taken from it (default: 2)")
    p.add_argument("--whole-system", action="store_const", const=True, default=None,
                   help="with --hwloc: keep the CPUs and nodes the file's allowed sets leave out")
    p.add_argument("--busy-scope", default=None, metavar="SCOPE",
                   help="which unregistered processes may be reported and confined: all, uids:UID,..., "
                        "cgroup:/path or descendants:PID (default: all)")
    p.add_argument("--set", dest="sets", action="append", default=None, metavar="KEY=VALUE",
                   help="any setting of the TOML file (docs/running.md), e.g. --set app_max_facts=5000; repeatable")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cod.rm.config import ConfigError, build_config
    from cod.rm.daemon import MachineUnreadable, StartupError
    from cod.rm.daemon import run as run_daemon

    try:
        cfg = build_config(
            args.config,
            args.sets,
            busy_scope=args.busy_scope,
            whole_system=args.whole_system,
            socket=args.socket,
            machine=args.machine,
            hwloc=args.hwloc,
            enforce=args.enforce,
            log_level=args.log_level,
            revoke_deadline_s=args.revoke_deadline_s,
            enforce_mode=args.enforce_mode,
            state_dir=args.state_dir,
            scx_loader=args.scx_loader,
            cgroup_parent=args.cgroup_parent,
            resctrl_root=args.resctrl_root,
            memory_migrate=args.memory_migrate,
            confine_others=args.confine_others,
            busy_detect=args.busy_detect,
            busy_interval_s=args.busy_interval_s,
            busy_window=args.busy_window,
            busy_threshold=args.busy_threshold,
            refresh_interval_s=args.refresh_interval_s,
            solver=args.solver,
            solver_time_limit_s=args.solver_time_limit_s,
        )
    except ConfigError as err:
        raise UserError(str(err)) from None
    try:
        return run_daemon(cfg)
    except MachineUnreadable as err:
        raise UserError(str(err)) from None
    except StartupError as err:
        raise UserError(str(err), ExitStatus.FAILED) from None

"""`cod rm`: run the Resource Manager daemon (see docs/running.md)."""

from __future__ import annotations

import argparse

from .errors import UserError


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
    p.add_argument("--no-enforce", dest="enforce", action="store_const", const=False, default=None,
                   help="compute and announce allocations but do not pin any process")
    p.add_argument("--config", metavar="FILE", help="TOML file with the same settings as these flags")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default=None,
                   help="log verbosity on stderr (default: info)")
    p.add_argument("--revoke-deadline", dest="revoke_deadline_s", type=float, default=None, metavar="SECONDS",
                   help="grace time a task gets to give back cores taken from it (default: 2)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cod.rm.config import ConfigError, build_config
    from cod.rm.daemon import StartupError
    from cod.rm.daemon import run as run_daemon

    try:
        cfg = build_config(
            args.config,
            socket=args.socket,
            machine=args.machine,
            hwloc=args.hwloc,
            enforce=args.enforce,
            log_level=args.log_level,
            revoke_deadline_s=args.revoke_deadline_s,
        )
    except ConfigError as err:
        raise UserError(str(err), 2) from None
    try:
        return run_daemon(cfg)
    except StartupError as err:
        raise UserError(str(err), 1) from None

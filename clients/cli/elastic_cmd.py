"""`cod elastic`: let the running daemon give a process group cores as its load asks (docs/elastic.md).

    cod elastic [--socket PATH] (--pid PID ... | --cgroup PATH) [--name NAME]
                [--mode adaptive|dense|sparse] [--min N] [--max N] [--metric M]
                [--th-min P] [--th-max P] [--period S]
    cod elastic [--socket PATH] --remove (--pid PID | --cgroup PATH | --name NAME)
    cod elastic [--socket PATH] --list

Registering returns at once: the daemon manages the group (the pids and their
future children, or every process of the cgroup) until all its processes
have exited or ``--remove`` is given.  Each command prints one JSON object: the method's result as
docs/protocol.md gives it (``--remove``: the group, the reason and the periods kept).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .errors import ExitStatus, UserError, daemon_error_status


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "elastic", help="give a process group that does not speak COD elastic cores (running daemon)",
        description="Register a process group (pids and their children, or a cgroup) with the running "
                    "daemon, which gives it cores one at a time as its load asks (Dominico et al.'s "
                    "Petri net) beside the COD tasks; --remove stops that, --list shows the groups.")
    p.add_argument("--socket", metavar="PATH",
                   help="the daemon's socket (default: $COD_SOCKET, else /run/cod/rm.sock as root, "
                        "else $XDG_RUNTIME_DIR/cod/rm.sock)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--pid", type=int, action="append", metavar="PID",
                      help="a process of the group (repeatable); its future children join it")
    what.add_argument("--cgroup", metavar="PATH", help="a cgroup (v1 or v2) directory: every process in it")
    p.add_argument("--name", help="the group's name (default: elastic.<cgroup dir> or elastic.<command>.<pid>)")
    p.add_argument("--mode", choices=["adaptive", "dense", "sparse"], help="which core to grant (default: adaptive)")
    p.add_argument("--min", dest="min_cores", type=int, metavar="N", help="never fewer cores (default: 1)")
    p.add_argument("--max", dest="max_cores", type=int, metavar="N", help="never more cores (default: all)")
    p.add_argument("--metric", choices=["cpu_load", "cpu_demand"],
                   help="what the net reads: CPU load, or load plus run-queue wait (default: cpu_load)")
    p.add_argument("--th-min", dest="th_min", type=float, metavar="PERCENT",
                   help="release a core at or below this load (default: 10)")
    p.add_argument("--th-max", dest="th_max", type=float, metavar="PERCENT",
                   help="grant a core at or above this load (default: 70)")
    p.add_argument("--period", dest="period_s", type=float, metavar="SECONDS",
                   help="one measurement and decision per period (default: 0.5)")
    action = p.add_mutually_exclusive_group()
    action.add_argument("--remove", action="store_true", help="stop managing the group named by --pid, --cgroup or --name")
    action.add_argument("--list", action="store_true", help="the groups the daemon manages")
    p.set_defaults(func=run)


def _params(args: argparse.Namespace) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if args.pid:
        params["pids" if len(args.pid) > 1 else "pid"] = args.pid if len(args.pid) > 1 else args.pid[0]
    if args.cgroup:
        import os

        params["cgroup"] = os.path.abspath(args.cgroup)
    for key in ("name", "mode", "min_cores", "max_cores", "metric", "th_min", "th_max", "period_s"):
        value = getattr(args, key)
        if value is not None:
            params[key] = value
    return params


def run(args: argparse.Namespace) -> int:
    from cod.client import Client
    from cod.client.errors import NotConnected, RMError
    from cod.protocol.errors import CodError
    from cod.protocol.paths import default_socket_path

    path = args.socket or default_socket_path()
    if args.list:
        call = ("list_tasks", {})
    elif args.remove:
        named = [k for k in ("pid", "cgroup", "name") if getattr(args, k)]
        if len(named) != 1 or (args.pid and len(args.pid) > 1):
            raise UserError("--remove needs exactly one of --pid PID, --cgroup PATH or --name NAME")
        params = _params(args)
        params = {k: params[k] for k in ("pid", "cgroup", "name") if k in params}
        call = ("deregister_unmanaged", params)
    else:
        if not args.pid and not args.cgroup:
            raise UserError("name the group: --pid PID or --cgroup PATH (or --remove, --list)")
        call = ("register_unmanaged", _params(args))
    try:
        with Client(path, app=None, reconnect=False, call_timeout_s=30.0) as client:
            result = client.call(*call)
    except NotConnected as err:  # it names the socket and why: "no COD daemon answers on PATH: ..."
        raise UserError(str(err), ExitStatus.UNREACHABLE) from None
    except RMError as err:
        raise UserError(err.message, daemon_error_status(err)) from None
    except CodError as err:
        raise UserError(str(err), ExitStatus.FAILED) from None
    if args.list:
        result = {"elastic_groups": result.get("elastic_groups", [])}
    json.dump(result, sys.stdout)
    print()
    return 0

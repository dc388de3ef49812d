"""`cod facts`: print the picture of a machine as JSON, Prolog facts or text."""

from __future__ import annotations

import argparse
import json
import sys

from cod.facts import from_args, text
from cod.facts.model import FactsError, Machine
from cod.facts.prolog import to_prolog

from .errors import UserError
from .terminal import terminal_safe_lines

FORMATS = ("json", "prolog", "text")


def add_machine_source(parser: argparse.ArgumentParser) -> None:
    """The three mutually exclusive machine sources, for any command taking a machine."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--sysfs-root", metavar="DIR",
                       help="discover from a copied Linux tree (DIR/sys, DIR/proc)")
    group.add_argument("--hwloc", metavar="FILE", help="import an hwloc XML export (v1 or v2)")
    group.add_argument("--machine", metavar="NAME",
                       help="a reference machine (magnycours, barcelona, shanghai, nehalem-ex)")
    parser.add_argument("--whole-system", action="store_true",
                        help="with --hwloc: keep the CPUs and NUMA nodes the export's allowed sets leave out "
                             "(marked as not allowed), as hwloc's --whole-system does")


def machine_of(args: argparse.Namespace) -> Machine:
    """The machine a command's arguments name (see add_machine_source)."""
    return from_args(sysfs_root=getattr(args, "sysfs_root", None), hwloc=args.hwloc, machine=args.machine,
                     whole_system=getattr(args, "whole_system", False))


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "facts", help="show the hardware facts of a machine",
        description="Show the hardware facts of a machine (default: this machine).")
    add_machine_source(parser)
    parser.add_argument("--format", choices=FORMATS, default="text",
                        help="output format (default: text)")
    parser.add_argument("--resctrl-root", metavar="DIR", default=None,
                        help="also show the cache partitions (resctrl groups, masks, occupancy) of the resctrl "
                             "mount at DIR (default: /sys/fs/resctrl when mounted; text and json formats)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        machine = machine_of(args)
    except FactsError as err:
        raise UserError(str(err)) from None
    partitions = resctrl_snapshot(args.resctrl_root)
    if args.format == "json":
        out = json.dumps({**machine.to_dict(), **({"resctrl": partitions} if partitions else {})}, indent=1) + "\n"
    elif args.format == "prolog":
        out = to_prolog(machine)
    elif partitions:
        from cod.rm.enforce.resctrl_info import render_snapshot

        out = text.render(machine) + render_snapshot(partitions)
    else:
        out = text.render(machine)
    sys.stdout.write(out if args.format == "json" else terminal_safe_lines(out))  # a file's name is its machine's
    return 0


def resctrl_snapshot(root: str | None) -> dict | None:
    """The resctrl mount's partitions; None when the default root is not mounted, an error for a
    root the user named that is not one."""
    # cod.rm.enforce is imported only here (~0.2 s of the command's start otherwise)
    from cod.rm.enforce.errors import EnforceError
    from cod.rm.enforce.resctrl import DEFAULT_ROOT, FS_FACTORY
    from cod.rm.enforce.resctrl_info import snapshot

    fs = FS_FACTORY(root or DEFAULT_ROOT)
    if root is None and not fs.mounted():
        return None
    try:
        return snapshot(fs)
    except EnforceError as err:
        raise UserError(str(err)) from None

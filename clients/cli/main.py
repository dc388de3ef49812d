"""`cod`: one command with subcommands.

Each subcommand lives in its own module ``cod.cli.<name>_cmd`` exposing
``register(subparsers)`` (adds its parser and sets ``func``) so that the parts
of the product stay apart.  Errors the user can fix are printed as one line
on stderr with a non-zero exit status, never as a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .errors import UserError
from .terminal import terminal_safe

# Subcommand modules, in the order `cod --help` lists them.
SUBCOMMANDS = ["facts", "query", "plan", "rm", "shell"]
# Query-plan deployment with resource activity vectors (issue 17): deploy-plan, profile, bandwidth.
SUBCOMMANDS += ["deploy", "profile", "bandwidth"]
# Elastic cores for process groups that do not speak COD (issue 16): cod elastic.
SUBCOMMANDS += ["elastic"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cod", description="COD database/OS co-design policy engine"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"cod.cli.{name}_cmd")
        except ModuleNotFoundError as err:
            if err.name == f"cod.cli.{name}_cmd":
                continue  # subcommand not built yet in this tree
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as err:
        print(f"cod {args.command}: error: {terminal_safe(str(err))}", file=sys.stderr)  # one line, always
        return err.status
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())

"""`cod shell`: look into the SKB and the RM (docs/shell.md).

    cod shell [--socket PATH]                    a running daemon (default: $COD_SOCKET or the default path)
    cod shell --machine NAME | --hwloc FILE      an SKB of its own, no daemon
    cod shell ... -c 'QUERY-or-COMMAND'          run a script and exit (also: statements on standard input)

Exit status of scripts: the worst of its statements' (cod.cli.errors.ExitStatus): 0 when every
statement succeeded, 1 when a query had no answer, 2 when a statement was refused, 3 when no daemon
answers, 5 when anything else failed.
"""

from __future__ import annotations

import argparse
import sys

from .errors import UserError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "shell", help="the admin shell: Prolog queries and commands against the SKB and the RM",
        description="Look into the SKB and the Resource Manager: Prolog queries as at a swipl prompt, "
                    "and commands (:help lists them). Connects to a running daemon, or with --machine/--hwloc "
                    "runs an SKB of its own.")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--socket", metavar="PATH",
                     help="the daemon's socket (default: $COD_SOCKET, else /run/cod/rm.sock as root, "
                          "else $XDG_RUNTIME_DIR/cod/rm.sock)")
    src.add_argument("--machine", metavar="NAME",
                     help="no daemon: an SKB of this reference machine (magnycours, barcelona, shanghai, nehalem-ex)")
    src.add_argument("--hwloc", metavar="FILE", help="no daemon: an SKB of the machine of an hwloc XML export")
    p.add_argument("--app", metavar="NAME",
                   help="application namespace to query in (default: pid<PID> with a daemon, shell without)")
    p.add_argument("-c", "--command", dest="commands", metavar="TEXT", action="append", default=[],
                   help="run these statements (queries and :commands) and exit; may be repeated")
    p.add_argument("--format", choices=("text", "json"), default="text",
                   help="text (default) or json: one JSON object per statement")
    p.add_argument("--answers", choices=("one", "all"), default=None,
                   help="interactive queries: answers one at a time (default) or all at once")
    p.add_argument("--timeout", type=float, default=None, metavar="SECONDS",
                   help="query time limit (default: the daemon's, 5 s; the daemon caps it)")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colours: on a terminal (auto, the default), always or never")
    p.add_argument("--no-pager", action="store_true", help="never page long output")
    p.add_argument("--history", metavar="FILE",
                   help="history file (default: $XDG_STATE_HOME/cod/shell_history)")
    p.set_defaults(func=run)


def _backend(args: argparse.Namespace):
    from .shell.backend import DaemonBackend, EmbeddedBackend

    if args.machine or args.hwloc:
        from cod.facts import FactsError, from_args

        try:
            machine = from_args(machine=args.machine, hwloc=args.hwloc)
        except FactsError as err:
            raise UserError(str(err)) from None
        source = f"machine {args.machine}" if args.machine else f"hwloc {args.hwloc}"
        return EmbeddedBackend(machine, args.app, source=source)
    from cod.protocol.paths import default_socket_path

    return DaemonBackend(args.socket or default_socket_path(), args.app)


def _script_on_stdin() -> str:
    from cod.facts.user_input import InputError, read_stream

    try:
        return read_stream(sys.stdin.buffer).decode("utf-8")
    except InputError as err:
        raise UserError(f"the script on standard input is {err}") from None
    except UnicodeDecodeError as err:
        raise UserError(f"the script on standard input is not UTF-8 text: {err}") from None


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from .shell.commands import COMMANDS
    from .shell.errors import STATUS_ERROR, STATUS_OK, ConnectionProblem, describe, status_of
    from .shell.output import Output
    from .shell.session import Settings, Shell
    from .shell.statements import split

    if args.timeout is not None and args.timeout <= 0:
        raise UserError("--timeout must be positive")
    scripted = bool(args.commands) or not sys.stdin.isatty()
    out = Output(fmt=args.format, color=args.color, interactive=not scripted)
    settings = Settings()
    if args.answers:
        settings.answers = args.answers
    settings.timeout = args.timeout
    if args.no_pager or scripted:
        settings.pager = "off"
    try:
        backend = _backend(args)
    except (ConnectionProblem, Exception) as err:
        if isinstance(err, UserError):
            raise
        problem = describe(err)
        if args.format == "json":
            out.json({"input": None, "error": problem.to_dict()})
        raise UserError(problem.message, status_of(problem)) from None
    shell = Shell(backend, out, commands=COMMANDS, interactive=not scripted, settings=settings)
    try:
        if not scripted:
            from .shell import interactive  # prompt_toolkit: only for a person at a terminal

            return interactive.run(shell, Path(args.history) if args.history else None)
        # Each -c is a script of its own: a query without its full stop ends with the argument.
        texts = args.commands or [_script_on_stdin()]
        try:
            statements = [stmt for text in texts for stmt in split(text)]
        except ValueError as err:
            raise UserError(str(err), STATUS_ERROR) from None
        status = STATUS_OK
        for stmt in statements:
            status = max(status, shell.run(stmt))
            if shell.done:
                break
        return status
    finally:
        backend.close()

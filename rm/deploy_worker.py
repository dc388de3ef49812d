"""The planner's process (``deploy_plan``): one plan, made by a process that could do no harm, then exit.

The RM (:mod:`.deploy_runner`) starts ``python -I -B -m cod.rm.deploy_worker`` for
each plan.  Before it reads a byte of the client's graph, this process

1. bounds itself: its address space (``--memory``, RLIMIT_AS), its CPU time
   (``--cpu-seconds``, RLIMIT_CPU: the kernel stops it even if the RM's own
   timer did not), no core file, no file it could write;
2. imports the planner and OR-Tools (while the files can still be read);
3. as root, loses root and every capability for good (to ``--user``, the
   SKB's unprivileged user: :func:`cod.skb.lockdown.drop_root`), sets
   ``PR_SET_NO_NEW_PRIVS`` and dies with the RM (``PR_SET_PDEATHSIG``);
4. under Landlock where the kernel has it: reads only, no write but to
   /dev/null, no exec, no TCP, no signal out of its domain;

then reads one request (``{"graph", "machine", "time_limit_s"}``) from standard
input, plans it, and writes one JSON answer to standard output: ``{"plan":
...}`` (:mod:`.deploy.wire`) or ``{"error": {"kind", "message"}}``, kind one of
``graph`` (the graph is not valid: parse_graph's message), ``infeasible``,
``invalid`` (the request), ``memory`` (RLIMIT_AS reached).
Its memory goes back to the system when it exits.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sys
from typing import Any

PR_SET_PDEATHSIG = 1
MAX_REQUEST_BYTES = 64 << 20  # the RM sends at most its deploy_max_graph_bytes plus the machine
OUT_OF_MEMORY = {"error": {"kind": "memory", "message": "the planner ran out of memory"}}


def limit_self(memory: int, cpu_seconds: int) -> None:
    """Step 1: the resource limits, hard ones too (the process cannot raise them again)."""
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))  # SIGXCPU, then SIGKILL
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


def drop_privileges(user: str, parent: int) -> int:
    """Steps 3-4; the Landlock ABI used (0: none)."""
    from cod.skb import lockdown

    if os.geteuid() == 0:
        lockdown.drop_root(*lockdown.resolve_user(user))
    lockdown.prctl(lockdown.PR_SET_NO_NEW_PRIVS, 1, "PR_SET_NO_NEW_PRIVS")
    # Set after the uid change, which clears it; then make sure the RM did not go in between.
    lockdown.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, "PR_SET_PDEATHSIG")
    if os.getppid() != parent:
        raise lockdown.LockdownError("the RM that started this planner is gone")
    abi = lockdown.landlock_abi()
    if abi:
        lockdown.restrict_with_landlock(abi, lockdown.open_rules(None, []))
    return abi


def plan(data: bytes) -> dict[str, Any]:
    """The answer to one request (JSON text), as JSON values."""
    from cod.facts.model import FactsError, Machine

    from .deploy import DeployError, GraphError, InfeasibleError, Options, deploy, parse_graph
    from .deploy.wire import encode

    try:
        if len(data) > MAX_REQUEST_BYTES:
            raise DeployError(f"the request is larger than {MAX_REQUEST_BYTES} bytes")
        request = json.loads(data)
        if not isinstance(request, dict) or set(request) != {"graph", "machine", "time_limit_s"}:
            raise DeployError("the request must be {graph, machine, time_limit_s}")
        graph = parse_graph(request["graph"])
        machine = Machine.from_dict(request["machine"])
        result = deploy(graph, machine, Options(time_limit_s=request["time_limit_s"]))
        return {"plan": encode(result)}
    except GraphError as err:
        return {"error": {"kind": "graph", "message": str(err)}}
    except InfeasibleError as err:
        return {"error": {"kind": "infeasible", "message": str(err)}}
    except (DeployError, FactsError, KeyError, TypeError, ValueError) as err:
        return {"error": {"kind": "invalid", "message": f"{type(err).__name__}: {err}"}}
    except MemoryError:
        return OUT_OF_MEMORY


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="cod.rm.deploy_worker")
    ap.add_argument("--user", required=True)
    ap.add_argument("--parent", type=int, required=True)
    ap.add_argument("--memory", type=int, required=True)
    ap.add_argument("--cpu-seconds", type=int, required=True)
    args = ap.parse_args(argv)
    limit_self(args.memory, args.cpu_seconds)
    try:  # step 2: everything plan() imports, before the drop
        import cod.facts.model  # noqa: F401
        import cod.rm.deploy.wire  # noqa: F401
        from cod.skb import lockdown
        from ortools.sat.python import cp_model  # noqa: F401
    except (ImportError, MemoryError) as err:  # a library that did not fit in the address space, say
        print(f"cod planner: cannot load the planner within {args.memory} bytes: {type(err).__name__}: {err}",
              file=sys.stderr, flush=True)
        return 1
    try:
        drop_privileges(args.user, args.parent)
    except (lockdown.LockdownError, OSError, KeyError) as err:  # no plan without the drop
        print(f"cod planner: cannot drop privileges: {err}", file=sys.stderr, flush=True)
        return 126
    try:
        out = json.dumps(plan(sys.stdin.buffer.read(MAX_REQUEST_BYTES + 1)), allow_nan=False, separators=(",", ":"))
    except MemoryError:
        out = json.dumps(OUT_OF_MEMORY)
    sys.stdout.write(out)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The daemon's side of planning a query plan (``deploy_plan``): each plan in a planner process of its own.

Not the query-plan deployment itself (:mod:`.query_plans` adopts the plan,
:mod:`.deployment` lays it out on the task's CPUs): this module runs the
planner (:mod:`.deploy`, four phases with CP-SAT beside them) where it cannot
hurt the daemon.  Each plan is made by a fresh ``cod.rm.deploy_worker``
process, unprivileged and bounded (:mod:`.deploy_worker`), that exits when done,
so that its memory goes back to the system (a thread's would stay in the
daemon's heap) and the event loop never waits for it.  The process is killed
at ``deploy_plan_timeout_s`` of wall-clock time; a bounded number run at
once (``deploy_plans_per_uid`` of one unprivileged uid,
``deploy_max_planners`` in all: more are refused at once, not queued).  Its
answer is decoded strictly (:mod:`.deploy.wire`), never unpickled, and held
against the operators and machine it was asked about.  The graph itself is
validated there too: the daemon only counts it, bounds its cores in one pass
and encodes it (:mod:`.query_plans`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import sys
from dataclasses import dataclass
from typing import Any, Iterator

from cod.facts.model import Machine
from cod.protocol.errors import CodError

from .deploy import DeployError, DeployPlan, GraphError, InfeasibleError
from .deploy.wire import check_plan, decode_plan

MAX_ANSWER_BYTES = 64 << 20  # a plan's JSON: a few times its graph's (deploy_max_graph_bytes)
MAX_STDERR_BYTES = 16 << 10
MAX_MESSAGE_CHARS = 2000  # of the planner's error message, passed on to the client
DROP_FAILED = 126  # the planner's exit status when it could not lose its privileges
# One thread: OpenBLAS (under OR-Tools' numpy) would start one per CPU, each with its own stack.
PLANNER_ENV = {"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


class PlannerError(CodError):
    """The planner made no plan; ``setting`` names the limit it reached (with its ``limit``), if any."""

    def __init__(self, message: str, setting: str | None = None, limit: float | None = None) -> None:
        super().__init__(message)
        self.setting = setting
        self.limit = limit


class PlannerBusy(PlannerError):
    """As many plans are being made as the limits allow (for this uid, or in all)."""


class PlanTimedOut(PlannerError):
    """The planner ran past deploy_plan_timeout_s and was killed."""


class PlanOutOfMemory(PlannerError):
    """The planner reached deploy_memory_limit_bytes."""


@dataclass(frozen=True)
class PlannerLimits:
    timeout_s: float  # wall-clock, the planner's whole life (its start-up included)
    memory_bytes: int  # its address space
    per_uid: int  # plans one unprivileged uid may have in the making at once
    total: int  # planner processes at once, all uids
    user: str  # whom it runs as when the daemon is root
    search_s: float  # each exact search inside the plan (deploy_time_limit_s)


class Planners:
    """The planner processes of one daemon: at most ``limits.total`` at once, ``limits.per_uid`` per
    unprivileged uid."""

    def __init__(self, limits: PlannerLimits, machine: Machine) -> None:
        self.limits = limits
        self.machine = machine
        self._machine_json = json.dumps(machine.to_dict(), separators=(",", ":")).encode()
        self._running = 0
        self._of_uid: dict[int, int] = {}

    @contextlib.contextmanager
    def slot(self, uid: int, privileged: bool) -> Iterator[None]:
        """Hold one planner slot for ``uid`` for the block; PlannerBusy (before anything) when none is left."""
        if self._running >= self.limits.total:
            raise PlannerBusy(f"{self._running} plans are being made; at most {self.limits.total} at once "
                              f"(setting deploy_max_planners)", "deploy_max_planners", self.limits.total)
        mine = self._of_uid.get(uid, 0)
        if not privileged and mine >= self.limits.per_uid:
            raise PlannerBusy(f"uid {uid} has {mine} plan(s) being made; at most {self.limits.per_uid} at once "
                              f"(setting deploy_plans_per_uid)", "deploy_plans_per_uid", self.limits.per_uid)
        self._running += 1
        self._of_uid[uid] = mine + 1
        try:
            yield
        finally:
            self._running -= 1
            left = self._of_uid[uid] - 1
            if left:
                self._of_uid[uid] = left
            else:
                del self._of_uid[uid]

    async def plan(self, graph_json: bytes, ids: list[Any]) -> DeployPlan:
        """The graph ``graph_json`` (JSON text, not yet validated; ``ids`` its operators' ids) planned
        on the daemon's machine by a planner process.  GraphError when the graph is not valid,
        InfeasibleError when it does not fit, PlannerError when the process made no plan (killed at
        the time limit, out of memory, failed)."""
        request = b"".join((b'{"graph":', graph_json, b',"machine":', self._machine_json,
                            b',"time_limit_s":', json.dumps(self.limits.search_s).encode(), b"}"))
        # -I: no PYTHON* variable, no current directory on the path (cod must be installed, as the
        # daemon's own interpreter has it); -B: no bytecode written.
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-B", "-m", "cod.rm.deploy_worker", "--user", self.limits.user,
            "--parent", str(os.getpid()), "--memory", str(self.limits.memory_bytes),
            "--cpu-seconds", str(math.ceil(self.limits.timeout_s) + 1),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            cwd="/", env=PLANNER_ENV)
        try:
            out, err = await asyncio.wait_for(_exchange(proc, request), self.limits.timeout_s)
        except asyncio.TimeoutError:
            raise PlanTimedOut(f"the planner did not finish within {self.limits.timeout_s:g} s and was stopped "
                               f"(setting deploy_plan_timeout_s)", "deploy_plan_timeout_s",
                               self.limits.timeout_s) from None
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        return self._answer(proc.returncode, out, err, ids)

    def _answer(self, status: int | None, out: bytes, err: bytes, ids: list[Any]) -> DeployPlan:
        memory = ("deploy_memory_limit_bytes", self.limits.memory_bytes)
        if status == DROP_FAILED:
            raise PlannerError(f"the planner could not drop its privileges: {_text(err)}")
        if status == -signal.SIGXCPU:
            raise PlanTimedOut(f"the planner used up its {math.ceil(self.limits.timeout_s) + 1} s of CPU time "
                               f"(setting deploy_plan_timeout_s)", "deploy_plan_timeout_s", self.limits.timeout_s)
        if status != 0:
            raise PlannerError(f"the planner failed (exit status {status}; {_text(err) or 'no message'}); "
                               f"it may have reached its memory limit of {self.limits.memory_bytes} bytes", *memory)
        try:
            answer = json.loads(out)
            if "plan" in answer:
                plan = decode_plan(answer["plan"])
                check_plan(plan, ids, self.machine)
                return plan
            kind, message = answer["error"]["kind"], _text(str(answer["error"]["message"]))
        except (ValueError, TypeError, KeyError, DeployError) as bad:
            raise PlannerError(f"the planner's answer is not a plan: {_text(str(bad))}") from None
        if kind == "graph":
            raise GraphError(message)
        if kind == "infeasible":
            raise InfeasibleError(message)
        if kind == "memory":
            raise PlanOutOfMemory(f"{message}: at most {self.limits.memory_bytes} bytes "
                                  f"(setting deploy_memory_limit_bytes)", *memory)
        raise PlannerError(f"the planner refused the request: {message}")


async def _exchange(proc: asyncio.subprocess.Process, request: bytes) -> tuple[bytes, bytes]:
    """Send the request, read both outputs (bounded) until the process exits."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        proc.stdin.write(request)
        await proc.stdin.drain()
        proc.stdin.close()
    except (BrokenPipeError, ConnectionResetError):
        pass  # it exited first: its status and standard error say why
    out, err = await asyncio.gather(_read(proc.stdout, MAX_ANSWER_BYTES), _read(proc.stderr, MAX_STDERR_BYTES))
    await proc.wait()
    return out, err


async def _read(stream: asyncio.StreamReader, limit: int) -> bytes:
    """Everything up to end of file; PlannerError past ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await stream.read(1 << 16):
        size += len(chunk)
        if size > limit:
            raise PlannerError(f"the planner wrote more than {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _text(raw: bytes | str) -> str:
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    text = " ".join(text.split())
    return text if len(text) <= MAX_MESSAGE_CHARS else text[:MAX_MESSAGE_CHARS] + "..."

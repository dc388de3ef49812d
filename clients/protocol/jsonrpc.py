"""JSON-RPC 2.0 message shapes, the protocol version, the error codes, and the
names of methods and events (see docs/protocol.md).

Validation only: nothing here touches a socket or the SKB.  Every problem with a
message becomes an `RpcError` whose code and message the peer will read.
"""

from __future__ import annotations

import decimal
import json
import re
from dataclasses import dataclass
from typing import Any

from .errors import CodError

PROTOCOL_VERSION = 1
# Deeper JSON is refused before anything is done with it (a reader that
# recursed into it could not answer any more).
MAX_JSON_DEPTH = 64

# Standard JSON-RPC 2.0 codes.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

# COD's own range, -32000 .. -32099.
HELLO_REQUIRED = -32000
UNSUPPORTED_VERSION = -32001
PERMISSION_DENIED = -32010
NOT_FOUND = -32020
ALREADY_EXISTS = -32021
ADMISSION_REFUSED = -32030
QUOTA_EXCEEDED = -32031
SHUTTING_DOWN = -32060
TOO_BUSY = -32070
TIMED_OUT = -32071
# A write whose outcome is not known (yet): it may or may not take effect (docs/protocol.md,
# "Write outcomes"); never used for a write that will not be applied.
OUTCOME_UNKNOWN = -32080
# SKB errors: -32040 - index of SKBError.code in this list (data.skb_code holds the name).
SKB_ERROR_BASE = -32040
SKB_CODES = (
    "syntax_error",   # -32040
    "unsafe",         # -32041
    "timeout",        # -32042
    "resource",       # -32043
    "existence",      # -32044
    "permission",     # -32045
    "type",           # -32046
    "domain",         # -32047
    "instantiation",  # -32048
    "evaluation",     # -32049
    "engine",         # -32050
    "invalid",        # -32051
    "quota",          # -32052
    "cancelled",      # -32053
)


def skb_rpc_codes() -> str:
    """The SKB-code table as the SKB server's --rpc-codes setting ("syntax_error=-32040,...")."""
    return ",".join(f"{name}={SKB_ERROR_BASE - i}" for i, name in enumerate(SKB_CODES))


def skb_error_code(skb_code: str) -> int:
    try:
        return SKB_ERROR_BASE - SKB_CODES.index(skb_code)
    except ValueError:
        return SKB_ERROR_BASE - SKB_CODES.index("engine")


# Methods of the daemon's socket (docs/protocol.md); cod.rm.handlers implements each.
METHODS = (
    "hello", "register_task", "update_task", "deregister_task", "add_facts", "remove_facts",
    "add_procedure", "execute_query", "subscribe", "unsubscribe", "request_allocation",
    "ack_allocation", "get_allocation", "list_tasks", "batch",
    "cancel", "list_procedures", "list_predicates", "explain_task", "get_topology", "deploy_plan",
    # elastic groups of processes that do not speak COD (issue 16)
    "register_unmanaged", "deregister_unmanaged",
)
# Methods that change what the daemon holds: each takes an optional REQUEST_KEY, and a retry
# with the same key on the same connection gets the first outcome instead of running again.
WRITE_METHODS = (
    "register_task", "update_task", "deregister_task", "deploy_plan", "add_facts", "remove_facts",
    "add_procedure", "subscribe", "unsubscribe", "register_unmanaged", "deregister_unmanaged",
)
REQUEST_KEY = "request_key"
# Methods of the SKB's direct query socket (cod_direct.pl).
DIRECT_METHODS = ("hello", "execute_query", "ping")

# Events a client may subscribe to, and the filter keys each understands.
EVENTS = ("allocation_changed", "task_arrived", "task_left", "facts_changed", "task_warning", "condition")
FILTER_KEYS: dict[str, frozenset[str]] = {
    "allocation_changed": frozenset({"task", "app"}),
    "task_arrived": frozenset({"task", "app"}),
    "task_left": frozenset({"task", "app"}),
    "facts_changed": frozenset({"predicate", "app", "scope"}),
    "task_warning": frozenset({"task", "app"}),
    # A condition's filter is its goal, required: {"goal": "cpu_load(0, L), L > 90"}.
    "condition": frozenset({"goal"}),
}
# Sent without a subscription of its own: a condition subscription the daemon ended.
SUBSCRIPTION_DROPPED_EVENT = "subscription_dropped"
# Sent to every connection, without a subscription, when the daemon stops.
SHUTDOWN_EVENT = "shutdown"


class RpcError(CodError):
    """An error reply: `code`, `message` and optional structured `data`."""

    def __init__(self, code: int, message: str, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def to_error(self) -> dict[str, Any]:
        err: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            err["data"] = self.data
        return err


@dataclass(frozen=True)
class Request:
    method: str
    params: dict[str, Any]
    id: int | str | None  # None: a notification from the client (no reply is sent)


def parse_request(body: bytes) -> Request:
    """Decode and validate one frame body from a client.

    Raises RpcError(PARSE_ERROR) for bytes that are not UTF-8 JSON and
    RpcError(INVALID_REQUEST) for JSON that is not a request object; in the latter
    case `.data["id"]` carries the request id when one could be read, so the
    reply can still be matched.
    """
    try:
        text = body.decode("utf-8")
        msg = json.loads(text)
    except (UnicodeDecodeError, ValueError) as err:
        raise RpcError(PARSE_ERROR, f"frame is not UTF-8 JSON: {err}") from None
    except RecursionError:
        raise RpcError(PARSE_ERROR, f"frame nests deeper than {MAX_JSON_DEPTH} levels") from None
    problem = None if plainly_fine(text) else json_problem(msg)
    if problem is not None:
        code, text = problem
        rid = msg.get("id") if isinstance(msg, dict) else None
        if not isinstance(rid, (int, str)) or isinstance(rid, bool) or json_problem(rid) is not None:
            rid = None
        raise RpcError(code, f"frame {text}", {"id": rid})
    if not isinstance(msg, dict):
        raise RpcError(INVALID_REQUEST, f"a request must be a JSON object, not {type(msg).__name__}")
    rid = msg.get("id")
    if rid is not None and (isinstance(rid, bool) or not isinstance(rid, (int, str))):
        raise RpcError(INVALID_REQUEST, "request id must be an integer or a string")
    ctx = {"id": rid}
    if msg.get("jsonrpc") != "2.0":
        raise RpcError(INVALID_REQUEST, 'request must carry "jsonrpc": "2.0"', ctx)
    method = msg.get("method")
    if not isinstance(method, str) or not method:
        raise RpcError(INVALID_REQUEST, 'request must carry a "method" string', ctx)
    params = msg.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise RpcError(INVALID_REQUEST, '"params" must be an object (by-name parameters)', ctx)
    return Request(method, params, rid)


def _int(text: str) -> int:
    # Python refuses int() of more than 4,300 digits; answers may hold larger integers
    # (the SKB sends at most 100,000 digits), which Decimal converts without that limit.
    return int(text) if len(text) <= 4000 else int(decimal.Decimal(text))


def loads(data: bytes | str) -> Any:
    """JSON as this protocol carries it (UTF-8): integers of any size the SKB may send."""
    return _DECODER.decode(data.decode("utf-8") if isinstance(data, (bytes, bytearray)) else data)


# json.loads with arguments builds a decoder per call; this one is built once.
_DECODER = json.JSONDecoder(parse_int=_int)

_SURROGATE = re.compile("[\ud800-\udfff]")


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def plainly_fine(text: str) -> bool:
    """True when the JSON ``text`` (valid UTF-8, so no raw surrogate) surely has no
    :func:`json_problem`: no escape that may be a surrogate, and fewer opening brackets than the
    nesting allowed.  False says nothing: the decoded value is then walked.  A request the daemon
    gets (a registration, a query) is short and shallow, so the walk is skipped for it."""
    return text.count("[") + text.count("{") <= MAX_JSON_DEPTH and not _SURROGATE_ESCAPE.search(text)


def json_problem(value: Any) -> tuple[int, str] | None:
    """Why a decoded JSON value cannot be handled, as (error code, reason), or None.

    Too deep a nesting is a parse error; a string that is not text (an
    unpaired surrogate, which json accepts as an escape) an invalid request."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                return INVALID_REQUEST, "holds a string with an unpaired surrogate, which is not text"
        elif isinstance(v, (dict, list)):
            if depth > MAX_JSON_DEPTH:
                return PARSE_ERROR, f"nests deeper than {MAX_JSON_DEPTH} levels"
            if isinstance(v, dict):
                for key, x in v.items():
                    if _SURROGATE.search(key):
                        return INVALID_REQUEST, "holds a key with an unpaired surrogate, which is not text"
                    stack.append((x, depth + 1))
            else:
                stack.extend((x, depth + 1) for x in v)
    return None


def response(rid: int | str | None, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "result": result}


def error_response(rid: int | str | None, err: RpcError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "error": err.to_error()}


def notification(method: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": params}


# ---- parameter validation -------------------------------------------------------------------
_MISSING = object()


class Params:
    """Typed access to a request's params; every mistake is an INVALID_PARAMS naming the field."""

    def __init__(self, method: str, params: dict[str, Any]) -> None:
        self.method = method
        self.raw = params
        self._used: set[str] = set()

    def _get(self, name: str, types: tuple[type, ...], default: Any, what: str) -> Any:
        self._used.add(name)
        value = self.raw.get(name, _MISSING)
        if value is _MISSING or value is None:
            if default is _MISSING:
                raise RpcError(INVALID_PARAMS, f"{self.method}: missing parameter {name!r}")
            return default
        if isinstance(value, bool) and bool not in types:
            ok = False
        else:
            ok = isinstance(value, types)
        if not ok:
            raise RpcError(
                INVALID_PARAMS,
                f"{self.method}: parameter {name!r} must be {what}, not {type(value).__name__}",
            )
        return value

    def str(self, name: str, default: Any = _MISSING) -> Any:
        return self._get(name, (str,), default, "a string")

    def int(self, name: str, default: Any = _MISSING) -> Any:
        return self._get(name, (int,), default, "an integer")

    def number(self, name: str, default: Any = _MISSING) -> Any:
        return self._get(name, (int, float), default, "a number")

    def bool(self, name: str, default: Any = _MISSING) -> Any:
        return self._get(name, (bool,), default, "a boolean")

    def dict(self, name: str, default: Any = _MISSING) -> Any:
        return self._get(name, (dict,), default, "an object")

    def str_list(self, name: str, default: Any = _MISSING) -> Any:
        value = self._get(name, (list,), default, "a list of strings")
        if value is not default and not all(isinstance(v, str) for v in value):
            raise RpcError(INVALID_PARAMS, f"{self.method}: parameter {name!r} must be a list of strings")
        return value

    def done(self) -> None:
        """Refuse parameters the method does not know (catches typos such as "max_core")."""
        unknown = sorted(set(self.raw) - self._used)
        if unknown:
            raise RpcError(INVALID_PARAMS, f"{self.method}: unknown parameter(s): {', '.join(unknown)}")

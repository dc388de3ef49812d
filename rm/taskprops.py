"""What a client may say about a task, and how it becomes the allocator's TaskSpec: one home for the rules.

A numeric property (``min_cores``, ``max_cores``, ``working_set_bytes``,
``priority``) may be given as a number or *derived*: a query over the
application's namespace, ``{"query": "dbos_cost_function(_, N, _)", "var": "N"}``,
whose first solution's value of ``var``, rounded up to an integer, is the
property.  ``locality`` (strong, moderate or weak) is derived the same way, its
value an atom, e.g. ``{"query": "locality:plan_locality(q1, L)", "var": "L"}``
(stored_procedures/locality.pl).  The daemon evaluates it at registration and again whenever what it
can read changes (:mod:`cod.rm.service`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from cod.protocol.jsonrpc import INVALID_PARAMS, RpcError

from .allocator.model import LOCALITIES, TaskSpec, TaskSpecError

# Task properties a client may set (TaskSpec's fields other than the name).
PROPERTY_KEYS = ("min_cores", "max_cores", "working_set_bytes", "bound", "sensitive", "exclusive",
                 "priority", "pollutes_cache", "allow_smt_sharing", "locality")
DERIVABLE = ("min_cores", "max_cores", "working_set_bytes", "priority", "locality")
_VAR = re.compile(r"[A-Z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class Derived:
    """A property given as a query: the value of ``var`` in the first solution of ``goal``."""

    goal: str
    var: str

    def to_dict(self) -> dict[str, str]:
        return {"query": self.goal, "var": self.var}


def split_properties(props: dict[str, Any], method: str) -> tuple[dict[str, Any], dict[str, Derived]]:
    """Properties as given: (plain values, derived ones), each checked for shape."""
    unknown = sorted(set(props) - set(PROPERTY_KEYS))
    if unknown:
        raise RpcError(INVALID_PARAMS,
                       f"{method}: unknown task property {unknown[0]!r}; known: {', '.join(PROPERTY_KEYS)}")
    plain: dict[str, Any] = {}
    derived: dict[str, Derived] = {}
    for key, value in props.items():
        if not isinstance(value, dict):
            plain[key] = value
            continue
        if key not in DERIVABLE:
            raise RpcError(INVALID_PARAMS, f"{method}: {key} cannot be derived; derivable: {', '.join(DERIVABLE)}")
        goal, var = value.get("query"), value.get("var")
        if set(value) != {"query", "var"} or not isinstance(goal, str) or not isinstance(var, str):
            raise RpcError(INVALID_PARAMS, f'{method}: a derived {key} is {{"query": GOAL, "var": NAME}}, '
                                           f"not {value!r}")
        if not _VAR.match(var):
            raise RpcError(INVALID_PARAMS, f"{method}: derived {key}: var {var!r} is not a Prolog variable name")
        derived[key] = Derived(goal, var)
    return plain, derived


def derived_value(key: str, value: Any) -> int | str:
    """A derived property's value: a finite number, rounded up (``locality``: one of its atoms).
    Raises ValueError saying why not."""
    if key == "locality":
        if value not in LOCALITIES:
            raise ValueError(f"locality must come out as one of {', '.join(LOCALITIES)}, not {value!r}")
        return str(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{key} must come out as a finite number, not {value!r}")
    return int(math.ceil(value))


def build_spec(name: str, plain: dict[str, Any], derived_values: dict[str, Any], method: str) -> TaskSpec:
    try:
        return TaskSpec.from_dict({"name": name, **plain, **derived_values})
    except (TaskSpecError, TypeError) as err:
        raise RpcError(INVALID_PARAMS, f"{method}: {err}") from None

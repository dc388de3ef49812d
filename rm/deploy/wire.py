"""A DeployPlan as JSON and back, checked field by field against its type hints.

The RM plans in a separate, unprivileged process (cod.rm.deploy_worker) and reads
its answer back: the answer is data from a process that handled a client's
graph, so it is decoded strictly (every field present, of its declared type,
nothing else) into the planner's own frozen dataclasses; it is never unpickled.
:func:`check_plan` then holds it against the operators and machine it was made for.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from typing import Any, Callable, Sequence

from cod.facts.model import Machine

from .errors import DeployError
from .plan import DeployPlan


class WireError(DeployError):
    """A plan's JSON does not have DeployPlan's shape; the message names the field."""


def encode(value: Any) -> Any:
    """A dataclass tree as JSON values: a dataclass as an object of its fields, a tuple or a
    frozenset as a list (a frozenset sorted), a dict as a list of [key, value] pairs."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, frozenset):
        return sorted(encode(v) for v in value)
    if isinstance(value, dict):
        return [[encode(k), encode(v)] for k, v in value.items()]
    return value


def decode_plan(data: Any) -> DeployPlan:
    """The DeployPlan ``data`` (from :func:`encode`) describes; WireError naming the field if not."""
    try:
        plan = _converter(DeployPlan)(data)
    except _Mismatch as bad:
        raise WireError(f"plan{''.join(reversed(bad.path))}: expected {bad.expected}, got {bad.got}") from None
    assert isinstance(plan, DeployPlan)
    return plan


class _Mismatch(Exception):
    """Inside the decoders only: where (built up on the way out), what was expected, what came."""

    def __init__(self, expected: str, got: Any) -> None:
        super().__init__(expected)
        self.path: list[str] = []
        self.expected = expected
        self.got = got if isinstance(got, str) else type(got).__name__


Converter = Callable[[Any], Any]


@functools.cache
def _converter(kind: Any) -> Converter:
    """The decoder of one type, built once (a plan has thousands of values, its types a dozen)."""
    if dataclasses.is_dataclass(kind):
        return _dataclass_converter(kind)
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if len(options) != 1 or len(args) != 2:
            raise TypeError(f"{kind}: only X | None is part of a plan")
        inner = _converter(options[0])
        return lambda data: None if data is None else inner(data)
    if origin in (tuple, list, frozenset):
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            raise TypeError(f"{kind}: fixed-length tuples are not part of a plan")
        return _sequence_converter(_converter(args[0]), origin)
    if origin is dict:
        return _dict_converter(_converter(args[0]), _converter(args[1]))
    return _scalar_converter(kind)


def _scalar_converter(kind: Any) -> Converter:
    def finite(data: Any) -> bool:
        return type(data) in (int, float) and math.isfinite(data)

    test: Callable[[Any], bool] = finite if kind is float else lambda data: type(data) is kind
    if kind not in (int, float, str, bool):
        raise TypeError(f"{kind}: not a type of a plan")

    def convert(data: Any) -> Any:
        if not test(data):
            raise _Mismatch(kind.__name__, data)
        return float(data) if kind is float else data
    return convert


def _sequence_converter(item: Converter, origin: type) -> Converter:
    def convert(data: Any) -> Any:
        if type(data) is not list:
            raise _Mismatch("a list", data)
        out = []
        for i, value in enumerate(data):
            try:
                out.append(item(value))
            except _Mismatch as bad:
                bad.path.append(f"[{i}]")
                raise
        return out if origin is list else origin(out)
    return convert


def _dict_converter(key: Converter, value: Converter) -> Converter:
    def convert(data: Any) -> Any:
        if type(data) is not list or not all(type(p) is list and len(p) == 2 for p in data):
            raise _Mismatch("a list of [key, value] pairs", data)
        out = {}
        for k, v in data:
            try:
                out[key(k)] = value(v)
            except _Mismatch as bad:
                bad.path.append(f"[{k!r}]")
                raise
        return out
    return convert


def _dataclass_converter(kind: Any) -> Converter:
    hints = typing.get_type_hints(kind)
    fields = {f.name: _converter(hints[f.name]) for f in dataclasses.fields(kind)}

    def convert(data: Any) -> Any:
        if type(data) is not dict or data.keys() != fields.keys():
            got = sorted(data) if type(data) is dict else type(data).__name__
            raise _Mismatch(f"the fields {sorted(fields)} of {kind.__name__}", str(got))
        values = {}
        for name, field in fields.items():
            try:
                values[name] = field(data[name])
            except _Mismatch as bad:
                bad.path.append(f".{name}")
                raise
        return kind(**values)
    return convert


def check_plan(plan: DeployPlan, ids: Sequence[Any], machine: Machine) -> None:
    """DeployError unless ``plan`` places exactly the operators ``ids`` (of the graph it was asked
    for), each in one cluster, on CPUs of ``machine``, one cluster per CPU."""
    members = [m for c in plan.clusters for m in c.members]
    if plan.operators != len(ids) or not all(isinstance(i, str) for i in ids) or sorted(members) != sorted(ids):
        raise DeployError(f"the planner's answer does not place the {len(ids)} operators of the graph")
    cpus = [c.cpu for c in plan.clusters]
    if len(set(cpus)) != len(cpus) or not set(cpus) <= set(machine.cpu_ids()):
        raise DeployError(f"the planner's answer puts its clusters on CPUs {cpus} of {machine.name}")
    if plan.placement != {m: c.cpu for c in plan.clusters for m in c.members}:
        raise DeployError("the planner's answer has a placement that is not its clusters'")

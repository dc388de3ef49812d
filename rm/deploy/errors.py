"""The errors of plan deployment: one root under CodError, a subclass per kind of failure."""

from __future__ import annotations

from cod.protocol.errors import CodError


class DeployError(CodError, ValueError):
    """Plan deployment failed; the message says what was wrong and where."""


class GraphError(DeployError):
    """The operator graph is malformed; the message names the operator or edge and the key."""


class InfeasibleError(DeployError):
    """The plan cannot be placed on the machine (or the CPUs given); the message says why."""

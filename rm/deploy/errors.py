"""The errors of plan deployment: one root under CodError, a subclass per kind of failure."""

from __future__ import annotations

from cod.protocol.errors import CodError


class DeployError(CodError, ValueError):
    """Plan deployment failed; the message says what was wrong and where."""


class GraphError(DeployError):
    """The operator graph is malformed; the message names the operator or edge and the key."""


class GraphTooLarge(GraphError):
    """The graph exceeds a limit of its caller: ``setting`` names it, ``limit`` is its value and
    ``requested`` what the graph has."""

    def __init__(self, message: str, setting: str, limit: int, requested: int) -> None:
        super().__init__(message)
        self.setting = setting
        self.limit = limit
        self.requested = requested


class InfeasibleError(DeployError):
    """The plan cannot be placed on the machine (or the CPUs given); the message says why."""

"""One exception hierarchy for elastic groups: a root under CodError, and the one case callers act on."""

from __future__ import annotations

from cod.protocol.errors import CodError


class ElasticError(CodError):
    """Elastic management failed or was asked something impossible; the message says what."""


class GroupGone(ElasticError):
    """The group has nothing left to manage: every process exited, or its cgroup was removed."""

"""The RM's callers use its parts' interfaces (issue 24): the handlers, the monitor and the elastic
groups never reach into the service's registry, the publisher's epoch state or the demands' records."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers.paths import REPO

RM = REPO / "rm"
CALLERS = ("handlers.py", "monitor.py", "elastic_groups.py")
FORBIDDEN = {
    r"\brm\.registry\b": "the registry (use rm.find_task, rm.tasks, rm.task_of_pid, rm.sessions, rm.events)",
    r"\brm\.publisher\.state\b|\bpub\.state\b": "the epoch state (use the publisher's methods)",
    r"\brm\.demands\.(others|groups)\b": "the demands' records (use rm.demands' methods)",
    r"\brm\.(epochs|others|unmanaged|last_plan)\b": "fields the service no longer has",
}


@pytest.mark.parametrize("name", CALLERS)
def test_callers_use_the_parts_interfaces(name):
    text = (RM / name).read_text(encoding="utf-8")
    found = [f"line {text[:m.start()].count(chr(10)) + 1}: {m.group()} reaches into {why}"
             for pattern, why in FORBIDDEN.items() for m in re.finditer(pattern, text)]
    assert not found, "\n".join(found)


def test_the_check_sees_a_forbidden_access():
    text = "x = rm.registry.tasks\ny = self.rm.demands.others\n"
    hits = [m.group() for pattern in FORBIDDEN for m in re.finditer(pattern, text)]
    assert hits == ["rm.registry", "rm.demands.others"]


def test_the_service_is_wiring():
    lines = (RM / "service.py").read_text(encoding="utf-8").count("\n")
    assert lines <= 300, f"rm/service.py has {lines} lines; it builds and wires the parts, at most ~300"

"""The import contract (issue #24), checked over the sources on every `make test`.

The layers, by the names Python imports (pyproject.toml's package-dir maps the folders):

* ``cod.protocol`` (clients/protocol, the wire) imports nothing of ours;
* ``cod.client`` (clients/python, the library applications link) imports only ``cod.protocol``;
* ``cod.cli`` (clients/cli: ``cod``, including the daemon command ``cod rm`` and the shell) may
  import everything; nothing else imports it;
* pure policy (the allocator, epochs and revocations, quotas, conditions, refusal reasons, task
  properties, busy detection's policy, names, bounded text, the system facts, the deploy planner without its measurements) imports no enforcement
  (``cod.rm.enforce``) or /proc reader (``cod.facts.procfs``), no socket or asyncio transport (``socket``, ``asyncio``, netlink, the
  daemon's transport and service, the client) and no SKB driver (``cod.skb`` but its pure codec
  and errors);
* no import cycles among our modules.

Every import counts, wherever it stands (inside a function, under ``TYPE_CHECKING``); the
implicit import of a parent package is not counted (as import-linter does not).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from helpers.paths import REPO
from helpers.imports import Rule, check, cycles, import_graph, module_files, within

ROOT = REPO

PURE_POLICY = (
    "cod.rm.allocator", "cod.rm.epochs", "cod.rm.quotas", "cod.rm.conditions", "cod.rm.reasons",
    "cod.rm.taskprops", "cod.rm.busy", "cod.rm.names", "cod.rm.confusables", "cod.rm.shown", "cod.rm.system_facts",
    # the deploy planner; its measurements (cod.rm.deploy.measure: perf, /proc, compilers) are mechanism
    "cod.rm.deploy.binpack", "cod.rm.deploy.collapse", "cod.rm.deploy.densest", "cod.rm.deploy.errors",
    "cod.rm.deploy.graph", "cod.rm.deploy.numa", "cod.rm.deploy.plan", "cod.rm.deploy.render",
    "cod.rm.deploy.screen", "cod.rm.deploy.wire",
)
ENFORCEMENT = ("cod.rm.enforce", "cod.facts.procfs")  # the /proc reader is mechanism, wherever it lives
TRANSPORT = ("socket", "socketserver", "selectors", "ssl", "asyncio", "pyroute2", "cod.client",
             "cod.rm.transport", "cod.rm.daemon", "cod.rm.service", "cod.rm.handlers", "cod.rm.monitor")
SKB_DRIVER = ("cod.skb",)  # the package re-exports the drivers (engine, async_engine, session)
SKB_PURE = ("cod.skb.codec", "cod.skb.errors")  # what a write means and how it failed: no process

RULES = (
    Rule("protocol imports nothing of ours", ("cod.protocol",), only=()),
    Rule("the client imports only the protocol", ("cod.client",), only=("cod.protocol",)),
    Rule("only the CLI imports the CLI", ("cod",), forbidden=("cod.cli",), exempt=("cod.cli",)),
    Rule("pure policy: no enforcement, no transport, no SKB driver", PURE_POLICY,
         forbidden=ENFORCEMENT + TRANSPORT + SKB_DRIVER, allowed=SKB_PURE),
)


@pytest.fixture(scope="module")
def graph():
    return import_graph(module_files(ROOT))


def test_the_sources_keep_the_contract(graph):
    assert check(graph, RULES) == []


def test_every_module_the_contract_names_exists(graph):
    """A module renamed or moved must be renamed here too, or its rule would check nothing."""
    for rule in RULES:
        for prefix in rule.modules + rule.exempt:
            assert any(within(m, (prefix,)) for m in graph), f"{rule.name}: no module {prefix}"


def _copy_sources(dest: Path) -> None:
    """pyproject.toml and the Python files of every folder its package-dir maps."""
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    for path in module_files(ROOT).values():
        target = dest / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + "\n" + text + "\n")


def test_forbidden_imports_in_a_copy_of_the_sources_are_caught(tmp_path):
    """A copy of the packages, with one forbidden import per rule and one cycle added."""
    _copy_sources(tmp_path)
    assert check(import_graph(module_files(tmp_path)), RULES) == []  # the copy alone keeps it
    _append(tmp_path / "rm/allocator/greedy.py", "def _pin():\n    from cod.rm.enforce import Enforcer  # lazy\n")
    _append(tmp_path / "rm/epochs.py", "import asyncio")
    _append(tmp_path / "rm/quotas.py", "from cod.skb import AsyncSKB")
    _append(tmp_path / "clients/protocol/framing.py", "from cod.rm import service")
    _append(tmp_path / "clients/python/state.py", "from cod.facts import model")
    _append(tmp_path / "rm/allocator_runner.py", "from cod.cli import main")
    _append(tmp_path / "rm/conditions.py", "from .reasons import refusal_text")
    _append(tmp_path / "rm/reasons.py", "from . import conditions")
    broken = check(import_graph(module_files(tmp_path)), RULES)
    assert broken == [
        "protocol imports nothing of ours: cod.protocol.framing imports cod.rm.service, outside cod.protocol",
        "the client imports only the protocol: cod.client.state imports cod.facts.model, outside cod.protocol, cod.client",
        "only the CLI imports the CLI: cod.rm.allocator_runner imports cod.cli.main",
        "pure policy: no enforcement, no transport, no SKB driver: cod.rm.allocator.greedy imports cod.rm.enforce",
        "pure policy: no enforcement, no transport, no SKB driver: cod.rm.epochs imports asyncio",
        "pure policy: no enforcement, no transport, no SKB driver: cod.rm.quotas imports cod.skb",
        # framing -> service closes a cycle through the upcalls, which are framed once (rm/events.py)
        "import cycle: cod.protocol.framing <-> cod.rm.admission <-> cod.rm.events <-> cod.rm.knowledge <-> "
        "cod.rm.publisher <-> cod.rm.query_plans <-> cod.rm.service <-> cod.rm.sessions",
        "import cycle: cod.rm.conditions <-> cod.rm.reasons",
    ]


@pytest.mark.parametrize("edges, expected", [
    ({"cod.a": {"cod.b"}, "cod.b": {"cod.c"}, "cod.c": set()}, []),
    ({"cod.a": {"cod.b"}, "cod.b": {"cod.a"}}, [["cod.a", "cod.b"]]),
    ({"cod.a": {"cod.a"}}, [["cod.a"]]),
    ({"cod.a": {"cod.b"}, "cod.b": {"cod.c"}, "cod.c": {"cod.a", "cod.d"}, "cod.d": {"cod.e"}, "cod.e": {"cod.d"}},
     [["cod.a", "cod.b", "cod.c"], ["cod.d", "cod.e"]]),
    # the allocator's two cycles before issue #24: bounds <-> cpsat, cpsat -> mapping -> naive -> cpsat
    ({"cod.x.bounds": {"cod.x.cpsat"}, "cod.x.cpsat": {"cod.x.bounds", "cod.x.mapping"},
      "cod.x.mapping": {"cod.x.naive"}, "cod.x.naive": {"cod.x.cpsat", "math"}},
     [["cod.x.bounds", "cod.x.cpsat", "cod.x.mapping", "cod.x.naive"]]),
    ({"cod.a": {"os", "cod.b"}, "cod.b": {"json"}, "os": {"cod.a"}}, []),  # only our modules count
])
def test_cycles_on_synthetic_graphs(edges, expected):
    assert cycles(edges) == expected


@pytest.mark.parametrize("imports, broken", [
    ({"cod.rm.epochs": {"cod.facts.cpulist", "dataclasses"}}, False),
    ({"cod.rm.epochs": {"cod.rm.enforce.backend"}}, True),
    ({"cod.rm.busy": {"cod.facts.procfs"}}, True),  # the policy is given readings, it does not read /proc
    ({"cod.rm.allocator.solve": {"socket"}}, True),
    ({"cod.rm.quotas": {"cod.skb.codec"}}, False),
    ({"cod.rm.quotas": {"cod.skb.engine"}}, True),
    ({"cod.rm.deploy.plan": {"cod.client.client"}}, True),
    ({"cod.rm.deploy.measure.perf": {"ctypes", "cod.facts.procfs"}}, False),  # mechanism
    ({"cod.protocol.framing": {"cod.protocol.errors", "struct"}}, False),
    ({"cod.protocol.framing": {"cod.facts.cpulist"}}, True),
    ({"cod.client.client": {"cod.protocol.framing", "socket"}}, False),
    ({"cod.client.client": {"cod.skb.codec"}}, True),
    ({"cod.cli.main": {"cod.rm.daemon", "cod.skb"}}, False),
    ({"cod.skb.engine": {"cod.cli.shell.terms"}}, True),
])
def test_rules_on_synthetic_graphs(imports, broken):
    assert bool(check(imports, RULES)) == broken
